package cluster

import (
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// holdFor is the hold of the even split (follow.Even): the provider's
// fail_static (as configd holds a lapsed share), plus the clock bound and a
// report interval for the poll that sees a change.
func holdFor(c *schema.ProviderConfig, report time.Duration) time.Duration {
	if c == nil {
		return schema.ProviderConfig{}.HoldAfter(0) + report
	}
	return c.HoldAfter(0) + report
}
