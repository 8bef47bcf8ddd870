package cluster

import (
	"errors"
	"slices"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// memberClasses returns the limiter classes for config c: its classes in
// order, each reserve a part of every window's quota, the part its reserve
// is of the provider's limit (limiter.Class.Of). So an instance keeps for
// a class the same part of whatever it may admit in a window — its share,
// its ledger grant, the fallback, less any clock cut — as the class's
// reserve is of the limit, and the instances' reserves add up to at most
// the class's. The reserves are those of the limit in force (Reserves: an
// adaptive provider's are cut in proportion under its ceiling). None when
// c lists none.
func memberClasses(c *schema.ProviderConfig) []limiter.Class {
	if c == nil || len(c.Classes) == 0 || c.Limit <= 0 {
		return nil
	}
	rs := c.Reserves(c.Limit)
	cs := make([]limiter.Class, len(c.Classes))
	for i, cl := range c.Classes {
		cs[i] = limiter.Class{Name: cl.Name, Reserve: rs[i], Of: c.Limit}
	}
	return cs
}

// applyClasses gives the limiter config c's classes (memberClasses) when
// they differ from those it last gave. A limiter whose classes the Member
// never set keeps those it was made with (limiter.WithClasses) while the
// config lists none. Since each reserve is a part of the quota, a new
// quota needs no new classes: the limiter scales them window by window,
// whichever coordination set the quota. It runs on the run goroutine,
// which owns m.classes.
func (m *Member) applyClasses(c *schema.ProviderConfig) {
	cs := memberClasses(c)
	if m.classesSet && slices.Equal(cs, m.classes) || !m.classesSet && cs == nil {
		return
	}
	if err := m.lim.SetClasses(cs...); err != nil {
		if !errors.Is(err, limiter.ErrClosed) {
			m.log.Error("cannot apply the provider's classes", "classes", classesString(c), "err", err)
		}
		return
	}
	m.classes, m.classesSet = cs, true
	m.log.Info("classes applied", "classes", classesString(c))
}

func classesString(c *schema.ProviderConfig) string {
	if c == nil {
		return "none"
	}
	return c.ClassesString()
}
