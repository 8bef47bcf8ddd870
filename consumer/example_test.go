package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
)

// A consumer that calls a provider for each message, at most 100 calls per
// 100 ms, and stops once the ten messages of its topic are handled. It runs
// against an in-process Kafka-protocol broker.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "orders", Transport: transport, BatchTimeout: time.Millisecond}
	for i := range 10 {
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: fmt.Appendf(nil, "order %d", i)}); err != nil {
			fmt.Println(err)
			return
		}
	}
	w.Close()

	lim, err := limiter.New(100, 100*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lim.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var handled atomic.Int64
	c, err := consumer.New(consumer.Config{
		Brokers: brokers,
		Topic:   "orders",
		GroupID: "billing",
	}, lim, func(ctx context.Context, m kafka.Message) error {
		// The outbound call goes here; an error is retried, then dead-lettered.
		if handled.Add(1) == 10 {
			cancel() // Run drains, commits and returns
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Run(ctx); err != nil {
		fmt.Println(err)
		return
	}
	st := c.Stats()
	fmt.Printf("handled %d, in flight %d\n", st.Handled, st.InFlight)
	// Output: handled 10, in flight 0
}
