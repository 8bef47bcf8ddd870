package ntptest_test

import (
	"fmt"
	"time"

	"github.com/beevik/ntp"
	"github.com/sluice-go/sluice/internal/ntptest"
)

func Example() {
	srv, err := ntptest.Start()
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	srv.SetOffset(3 * time.Second)

	r, err := ntp.QueryWithOptions(srv.Addr(), ntp.QueryOptions{Timeout: time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println("valid:", r.Validate() == nil)
	fmt.Println("offset:", r.ClockOffset.Round(10*time.Millisecond))

	srv.SetMode(ntptest.Silent)
	_, err = ntp.QueryWithOptions(srv.Addr(), ntp.QueryOptions{Timeout: 20 * time.Millisecond})
	fmt.Println("silent:", err != nil)
	// Output:
	// valid: true
	// offset: 3s
	// silent: true
}
