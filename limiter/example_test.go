package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

func Example() {
	lim, err := limiter.New(3, time.Hour) // 3 calls per aligned hour
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	ctx := context.Background()
	for i := range 4 {
		err := lim.Acquire(ctx, 50*time.Millisecond)
		switch {
		case errors.Is(err, limiter.ErrTimeout):
			fmt.Println("call", i, "refused: no permit within 50ms")
		case err != nil:
			fmt.Println("call", i, "failed:", err)
		default:
			fmt.Println("call", i, "admitted")
		}
	}
	// Output:
	// call 0 admitted
	// call 1 admitted
	// call 2 admitted
	// call 3 refused: no permit within 50ms
}

func ExampleLimiter_Reserve() {
	lim, err := limiter.New(1, time.Hour)
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	lim.TryAcquire() // this hour's permit is gone
	r, err := lim.Reserve(1, 2*time.Hour)
	if err != nil {
		panic(err)
	}
	fmt.Println("valid within the next hour:", r.Delay() > 0 && r.Delay() <= time.Hour)
	r.Cancel() // not needed after all: the permit goes back
	// Output: valid within the next hour: true
}

func ExampleLimiter_TryAcquireN() {
	lim, err := limiter.New(10, time.Hour)
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	fmt.Println(lim.TryAcquireN(8)) // a batch call of 8
	fmt.Println(lim.TryAcquireN(8)) // only 2 left this hour
	fmt.Println(lim.TryAcquireN(2))
	// Output:
	// true
	// false
	// true
}

func ExampleLimiter_SetExpiry() {
	lim, err := limiter.New(3, time.Hour)
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	// Re-armed on every lease keep-alive; here it lapses at once. The
	// current hour keeps its permits, the next admits nothing.
	lim.SetExpiry(lim.Now())
	fmt.Println(lim.TryAcquire())
	_, err = lim.Reserve(3, 2*time.Hour)
	fmt.Println(errors.Is(err, limiter.ErrNoQuota))

	lim.SetExpiry(lim.Now().Add(24 * time.Hour)) // renewed in time
	r, err := lim.Reserve(3, 2*time.Hour)
	fmt.Println(err == nil && r.Delay() > 0)
	// Output:
	// true
	// true
	// true
}

// A provider that allows 500 requests and 20,000 tokens per minute: each
// call names its estimated tokens, is granted only when both limits have
// room, and settles the tokens it really used once the provider answered.
func ExampleMulti() {
	m, err := limiter.NewMulti([]limiter.Limit{
		{Quota: 500, Window: time.Minute}, // requests
		{Dimension: "tokens", Quota: 20_000, Window: time.Minute},
	})
	if err != nil {
		panic(err)
	}
	defer m.Close()

	ctx := context.Background()
	for i, estimate := range []int64{8_000, 8_000, 8_000} {
		g, err := m.Acquire(ctx, 100*time.Millisecond, limiter.Cost("tokens", estimate))
		if errors.Is(err, limiter.ErrTimeout) {
			fmt.Println("call", i, "refused: not enough tokens left this minute")
			continue
		}
		used := estimate / 2 // what the provider's answer says
		g.Settle(limiter.Cost("tokens", used))
		fmt.Println("call", i, "used", used, "tokens")
	}
	st := m.Stats()
	fmt.Println("requests admitted:", st[0].Admitted, "tokens admitted:", st[1].Admitted)
	// Output:
	// call 0 used 4000 tokens
	// call 1 used 4000 tokens
	// call 2 used 4000 tokens
	// requests admitted: 3 tokens admitted: 12000
}
