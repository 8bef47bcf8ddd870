package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/limiter"
)

// TestCostPermitsOfTheMessagesClass: with WithCost and WithClass, each
// message's permits are of its class in the limiter.Multi: batch messages
// take the tokens beyond critical's reserve (60% of each limit) and are
// then refused, while a critical message is admitted from the reserve.
func TestCostPermitsOfTheMessagesClass(t *testing.T) {
	m, err := limiter.NewMulti([]limiter.Limit{{Quota: 100, Window: time.Hour}, {Dimension: "tokens", Quota: 1000, Window: time.Hour}},
		limiter.WithClasses(limiter.Class{Name: "critical", Reserve: 60, Of: 100}, limiter.Class{Name: "batch"}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	take, err := newPermits(m, func(kafka.Message) []limiter.Amount { return []limiter.Amount{limiter.Cost("tokens", 100)} },
		ClassHeader("priority"))
	if err != nil {
		t.Fatal(err)
	}
	msg := func(class string) kafka.Message {
		return kafka.Message{Headers: []kafka.Header{{Key: "priority", Value: []byte(class)}}}
	}
	for i := range 4 {
		if _, err := take(context.Background(), msg("batch"), 0); err != nil {
			t.Fatalf("batch message %d within the unreserved tokens: %v", i, err)
		}
	}
	if _, err := take(context.Background(), msg("batch"), 0); !errors.Is(err, limiter.ErrTimeout) {
		t.Fatalf("a batch message into critical's reserve: %v, want ErrTimeout", err)
	}
	if _, err := take(context.Background(), msg("critical"), 0); err != nil {
		t.Fatalf("a critical message within its reserve: %v", err)
	}
}
