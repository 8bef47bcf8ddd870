package skew_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/internal/ntptest"
	"github.com/sluice-go/sluice/limiter/skew"
)

// Measure one round against a local SNTP responder whose clock runs 250 ms
// ahead of this machine's.
func ExampleMonitor_Measure() {
	srv, err := ntptest.Start()
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	srv.SetOffset(250 * time.Millisecond)

	mon, err := skew.New(skew.WithServers(srv.Addr()), skew.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	m, err := mon.Measure(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println("known:", m.Known)
	fmt.Println("offset:", m.Offset.Round(10*time.Millisecond))
	fmt.Println("uncertainty under 10ms:", m.Uncertainty < 10*time.Millisecond)
	// Output:
	// known: true
	// offset: 250ms
	// uncertainty under 10ms: true
}

// OnChange is where an instance hands the offset to its limiter. Here Run
// measures every 50 ms until the first measurement arrives.
func ExampleOnChange() {
	srv, err := ntptest.Start()
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	srv.SetOffset(-40 * time.Millisecond)

	offsets := make(chan time.Duration, 1)
	setClockOffset := func(d time.Duration) { // stands for limiter.SetClockOffset
		select {
		case offsets <- d:
		default:
		}
	}
	mon, err := skew.New(
		skew.WithServers(srv.Addr()),
		skew.WithInterval(50*time.Millisecond),
		skew.OnChange(func(m skew.Measurement) {
			if m.Known {
				setClockOffset(m.Offset)
			}
		}),
	)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- mon.Run(ctx) }()

	fmt.Println("limiter offset:", (<-offsets).Round(10*time.Millisecond))
	cancel()
	fmt.Println("Run:", <-done)
	// Output:
	// limiter offset: -40ms
	// Run: context canceled
}

// The share an instance enforces for a 1 s window and a share of 1000
// permits, as its clock measurement degrades.
func ExampleEnforcedShare() {
	const q, window = 1000, time.Second
	for _, m := range []skew.Measurement{
		{Known: true, Uncertainty: 2 * time.Millisecond},   // healthy NTP: within the 20 ms default bound
		{Known: true, Uncertainty: 50 * time.Millisecond},  // poor: cut by 2u/W
		{Known: true, Uncertainty: 400 * time.Millisecond}, // very poor: the cut stops at half
		{Known: false}, // no valid answer within the staleness limit
	} {
		fmt.Printf("known=%v u=%v: %d\n", m.Known, m.Uncertainty, skew.EnforcedShare(q, window, m, 0))
	}
	// Output:
	// known=true u=2ms: 1000
	// known=true u=50ms: 900
	// known=true u=400ms: 500
	// known=false u=0s: 500
}
