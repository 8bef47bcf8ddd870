package cluster

import (
	"errors"
	"slices"

	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// grantReserve is what this holder's grants reserve for each class
// (ledger.State.Reserves); set while the Follower says it holds a grant.
type grantReserve struct {
	reserve map[string]int64
	set     bool
}

// memberClasses returns the limiter classes for config c: its classes in
// order, each with a reserve. Under the ledger, once a grant is held, it
// is the one configd gave this holder: what its newest grant reserves
// for the class, in permits (ledger.LimiterClasses), configd having
// split each class's reserve over the instances that want the class
// (round.Target). Otherwise each reserve is the part the class's
// reserve is of the provider's limit (limiter.Class.Of), so each
// instance keeps the same part of whatever it may admit — its share, the
// fallback, less any clock cut — and the instances' reserves add up to
// at most the class's. The
// reserves are those of the limit in force (Reserves: an adaptive
// provider's are cut in proportion under its ceiling). None when c lists
// none.
func memberClasses(c *schema.ProviderConfig, g grantReserve) []limiter.Class {
	if c == nil || len(c.Classes) == 0 || c.Limit <= 0 {
		return nil
	}
	if g.set {
		names := make([]string, len(c.Classes))
		for i, cl := range c.Classes {
			names[i] = cl.Name
		}
		return ledger.LimiterClasses(names, g.reserve)
	}
	cs := make([]limiter.Class, len(c.Classes))
	rs := c.Reserves(c.Limit)
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
// whichever coordination set the quota.
func (m *Member) applyClasses(c *schema.ProviderConfig) {
	m.classMu.Lock()
	defer m.classMu.Unlock()
	m.classCfg = c
	m.setClassesLocked()
}

// grantReserved is the Follower's report of what the holder's grants
// keep for each class (ledgerstore.WithReserves); ok false says the
// Member follows no grant, as when it leaves the ledger.
func (m *Member) grantReserved(reserve map[string]int64, ok bool) {
	m.classMu.Lock()
	defer m.classMu.Unlock()
	m.grantRes = grantReserve{reserve: reserve, set: ok}
	m.setClassesLocked()
}

func (m *Member) setClassesLocked() {
	c := m.classCfg
	cs := memberClasses(c, m.grantRes)
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
	m.log.Info("classes applied", "classes", classesString(c), "of_grant", m.grantRes.set)
}

func classesString(c *schema.ProviderConfig) string {
	if c == nil {
		return "none"
	}
	return c.ClassesString()
}

// hasClasses reports whether the Member gave its limiter classes.
func (m *Member) hasClasses() bool {
	m.classMu.Lock()
	defer m.classMu.Unlock()
	return m.classesSet && len(m.classes) > 0
}
