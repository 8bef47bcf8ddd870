package harness

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Counter counts an etcd client's gRPC traffic, client-side: unary calls
// (each attempt), streams opened, and messages sent and received on
// streams. Install it with DialOptions.
type Counter struct {
	Unary, Streams, Sent, Recv atomic.Int64
	// RecvBytes is the encoded size of the stream messages received, and
	// WatchEvents the events in the watch responses among them.
	RecvBytes, WatchEvents atomic.Int64
	mu                     sync.Mutex
	byMethod               map[string]int64 // unary calls and stream messages sent, by method
}

// NewCounter returns a Counter at zero.
func NewCounter() *Counter { return &Counter{byMethod: map[string]int64{}} }

// DialOptions returns the interceptors to pass in clientv3.Config's
// DialOptions. They are chained, so they run inside clientv3's own
// (retrying) interceptors: every attempt on the wire is counted.
func (c *Counter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.unary), grpc.WithChainStreamInterceptor(c.stream)}
}

func (c *Counter) add(method string) {
	c.mu.Lock()
	c.byMethod[method[strings.LastIndex(method, "/")+1:]]++
	c.mu.Unlock()
}

// Methods returns the counts by method as "Method:N,Method:N" (sorted),
// the form ParseMethods reads.
func (c *Counter) Methods() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(c.byMethod)) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%d", k, c.byMethod[k])
	}
	return b.String()
}

// ParseMethods reads what Methods wrote.
func ParseMethods(s string) map[string]int64 {
	m := map[string]int64{}
	for _, x := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(x, ":"); ok {
			m[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return m
}

func (c *Counter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.Unary.Add(1)
	c.add(method)
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *Counter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	c.Streams.Add(1)
	return &countedStream{ClientStream: s, c: c, method: method}, nil
}

type countedStream struct {
	grpc.ClientStream
	c      *Counter
	method string
}

func (s *countedStream) SendMsg(m any) error {
	s.c.Sent.Add(1)
	s.c.add(s.method)
	return s.ClientStream.SendMsg(m)
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.c.Recv.Add(1)
		if pm, ok := m.(proto.Message); ok {
			s.c.RecvBytes.Add(int64(proto.Size(pm)))
		}
		if wr, ok := m.(*etcdserverpb.WatchResponse); ok {
			s.c.WatchEvents.Add(int64(len(wr.Events)))
		}
	}
	return err
}
