package cluster

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ReconnectMaxDelay is the longest an etcd client dialled with DialOptions
// waits between two attempts to reconnect.
const ReconnectMaxDelay = 2 * time.Second

// DialOptions returns the gRPC dial options sluice gives the etcd clients it
// makes, for clientv3.Config.DialOptions of the client passed to Join:
//
//	cli, err := clientv3.New(clientv3.Config{
//		Endpoints:   endpoints,
//		DialOptions: cluster.DialOptions(),
//	})
//
// They make the client try to reconnect after 250 ms, then at growing
// intervals up to ReconnectMaxDelay (±20% jitter). gRPC's own default
// grows to 2 minutes: after a 30 s etcd outage a client may wait 13 s
// more before its next attempt, while the member's share runs down its
// fail-static horizon. The price: while etcd is down, each client tries
// once every 2 s or so — cheap for etcd (a refused connection) even with
// thousands of instances, and spread by the jitter.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{
			BaseDelay:  250 * time.Millisecond,
			Multiplier: 1.6,
			Jitter:     0.2,
			MaxDelay:   ReconnectMaxDelay,
		},
		// gRPC's default: an attempt that has sent its SYN into a
		// partition waits for TCP's retransmissions instead of giving up
		// before the network heals.
		MinConnectTimeout: 20 * time.Second,
	})}
}
