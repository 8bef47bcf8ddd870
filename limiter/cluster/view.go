package cluster

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
)

// view is what the Member knows of its provider: its config, its own share
// record, whether a configd leader is alive and, for the even split, the
// counts of live and confirmed instances. It reads nothing of the other
// instances' records: what it receives does not grow with the fleet. Only
// the run goroutine touches it.
type view struct {
	config    *schema.ProviderConfig
	configRev int64               // the etcd revision config was written at
	configAt  time.Time           // when (monotonic) this Member first saw configRev
	share     *schema.ShareRecord // this instance's record, resolved; nil: none
	shareRev  int64               // the etcd revision this instance's own key was written at
	// pointer says this instance's own record says Common: it follows the
	// provider's common record, which it reads with its own in one
	// snapshot (readShare), or takes from the watch event alone when the
	// record says Unmoved (shareEvent). shareSeen is the revision of the
	// last such read: the watches' events up to it are in it. own is this
	// instance's own record as last read or received (nil: none).
	pointer   bool
	shareSeen int64
	own       *mvccpb.KeyValue
	// followed is the revision of the last common record taken from its
	// watch event (Unmoved): a read may not answer from before it.
	followed int64
	leaders  map[string]bool
	even     follow.Even
	problems map[string]string // key → why its record was ignored
	// refused is this instance's last share record refused for its
	// config (nil: none), and refusedRev its revision: the config it was
	// computed under may not have arrived yet (another watch), so it is
	// checked again when the config changes.
	refused    *schema.ShareRecord
	refusedRev int64
	refusedAt  int64      // the revision its content was written at (acceptShare)
	replaced   []replaced // see evenHold
	// polledAt is when (monotonic) the last count read that succeeded
	// was sent; zero: none since configd was last seen alive. On the
	// even split the limiter admits no longer than follow.CountsValid and the
	// provider's fail_static past it (arm): a newcomer that registered
	// after it, unseen, waits a hold at least that long.
	polledAt time.Time
	// budget says the provider's config is a budget's, which this Member
	// refused: it admits nothing (apply), fallback or not.
	budget bool
	// lastConfig is the last good config seen, kept across a deletion
	// and a reload, so that a change seen through either is noted
	// (noteReplaced): a session restarted between the change and the
	// split must still know the old fail_static.
	lastConfig *schema.ProviderConfig
}

func newView() *view {
	return &view{leaders: map[string]bool{}, problems: map[string]string{}}
}

// applied is what the Member last set on its limiter.
type applied = follow.Applied

// generationJump is how far past the last one a new shares generation may
// be without a warning: configd counts one a publish.
const generationJump = 1 << 20

// observe folds one key's value (or deletion) into the view. A record that
// fails to decode or validate is ignored, logged once and listed in
// Status.Problems; the last good value stays. An instance record is the
// exception: its key alone makes the instance live, malformed or not.
func (m *Member) observe(v *view, key string, value []byte, deleted bool, rev int64) {
	k, err := m.keys.Parse(key)
	if err != nil || k.Provider != m.provider {
		return
	}
	bad := func(err error) {
		if v.problems[key] != err.Error() {
			m.log.Error("ignoring malformed record; keeping the last good value", "key", key, "err", err)
		}
		v.problems[key] = err.Error()
	}
	good := func() { delete(v.problems, key) }
	defer m.listProblems(v)
	switch k.Kind {
	case schema.KindConfig:
		if deleted {
			if v.config != nil {
				v.lastConfig = v.config
			}
			v.config = nil
			good()
			return
		}
		c, err := schema.DecodeProviderConfig(value)
		if err == nil && c.Name != m.provider {
			err = fmt.Errorf("config names provider %q", c.Name)
		}
		if err == nil && m.dimension != "" && c.DimensionOrDefault() != m.dimension {
			err = fmt.Errorf("its limit counts %s, and this instance's lane of it %s (cluster.Lane)", c.DimensionOrDefault(), m.dimension)
		}
		if err == nil {
			v.budget = c.Budget() // kept past a malformed or deleted config
		}
		if err == nil && v.budget {
			err = fmt.Errorf("its window, %v, is a budget's, which the instances take from a counter and do not share; join its provider %q with cluster.JoinProvider", c.Window.D(), c.Of)
		}
		if err != nil {
			bad(err)
			return
		}
		good()
		m.checkLimits(v, &c)
		prev := v.config
		if prev == nil {
			prev = v.lastConfig
		}
		v.noteReplaced(prev, &c, time.Now(), m.cfg.leaseTTL)
		// A config seen anew: another revision, or the same with other
		// content (an etcd restored from a backup counts revisions from
		// lower down again).
		if rev != v.configRev || v.configAt.IsZero() || v.config == nil || !reflect.DeepEqual(*v.config, c) {
			v.configAt = time.Now()
		}
		v.config, v.configRev = &c, rev
		if r := v.refused; r != nil {
			v.refused = nil
			m.acceptShare(v, *r, v.refusedRev, v.refusedAt)
		}
	case schema.KindShares:
		// This instance's own record, alone: one that says Common is read
		// again with the common record (readShare), not here.
		if k.Instance != m.id {
			return
		}
		var own []*mvccpb.KeyValue
		if !deleted {
			own = append(own, &mvccpb.KeyValue{Key: []byte(key), Value: value, ModRevision: rev})
		}
		m.observeShare(v, own, nil, 0)
	}
}

// observeShare folds into the view this instance's own share record and
// the provider's common record as read in one snapshot (own and common:
// none or one key each), at revision seen; seen 0: own alone, a record
// that does not say Common, or none (a deletion).
func (m *Member) observeShare(v *view, own, common []*mvccpb.KeyValue, seen int64) {
	key := m.keys.Share(m.provider, m.id)
	defer m.listProblems(v)
	v.shareSeen = max(v.shareSeen, seen)
	v.refused = nil // a newer write replaces it
	v.own = nil
	if len(own) == 0 {
		v.share, v.pointer = nil, false
		delete(v.problems, key)
		return
	}
	v.own = own[0]
	r, err := schema.DecodeShareRecord(own[0].Value)
	if err == nil && (r.Provider != m.provider || r.Instance != m.id) {
		err = fmt.Errorf("share record names provider %q, instance %q", r.Provider, r.Instance)
	}
	if err == nil {
		v.pointer = r.Common
		r, err = r.Resolve(m.commonRecord(v, common))
	}
	if err != nil {
		if v.problems[key] != err.Error() {
			m.log.Error("ignoring malformed record; keeping the last good value", "key", key, "err", err)
		}
		v.problems[key] = err.Error()
		return
	}
	at := own[0].ModRevision
	if v.pointer && len(common) > 0 {
		at = max(at, common[0].ModRevision) // its content is the common record's
	}
	m.acceptShare(v, r, own[0].ModRevision, at)
}

// commonRecord decodes the common record read (none or one key), listing
// it among the problems when it does not decode; nil: none good.
func (m *Member) commonRecord(v *view, kvs []*mvccpb.KeyValue) *schema.ShareRecord {
	key := m.keys.CommonShare(m.provider)
	delete(v.problems, key)
	if len(kvs) == 0 {
		return nil
	}
	c, err := schema.DecodeShareRecord(kvs[0].Value)
	if err != nil {
		v.problems[key] = err.Error()
		return nil
	}
	return &c
}

// acceptShare makes r, this instance's record (resolved) written at rev,
// the view's, unless it is inconsistent with the config known: then it
// waits for the next config (refused). at is the revision r's content was
// written at: the common record's for one that follows it.
func (m *Member) acceptShare(v *view, r schema.ShareRecord, rev, at int64) {
	key := m.keys.Share(m.provider, m.id)
	defer m.listProblems(v)
	var err error
	if v.config != nil {
		// Never more than the limit this instance knows: a record
		// that hands out more is forged, corrupt, from before a lower
		// limit (configd republishes under the new one at once), or
		// computed under a config still on its way here: kept, and
		// checked again when the config changes.
		if err = r.CheckAgainst(*v.config, v.configRev); err != nil {
			v.refused, v.refusedRev, v.refusedAt = &r, rev, at
		}
	}
	if err != nil && ahead(r, v.configRev, at) {
		// The config it was computed under was written before it, and
		// this instance's watch of the config has yet to bring it: the
		// two watches deliver independently. Nothing wrong: applied when
		// the config comes (at a retune of 2,000 instances, 100 of them
		// logged an error here).
		m.log.Debug("share record ahead of the config; waiting for the config", "key", key, "err", err)
		return
	}
	if err != nil {
		if v.problems[key] != err.Error() {
			m.log.Error("ignoring malformed record; keeping the last good value", "key", key, "err", err)
		}
		v.problems[key] = err.Error()
		return
	}
	if v.share != nil && (r.Generation < v.share.Generation || r.Generation-v.share.Generation > generationJump ||
		(r.Generation == v.share.Generation && rev != v.shareRev && !v.pointer)) {
		// etcd orders the writes to the key: the newest is configd's
		// word, whatever its generation (a replica recovering from a
		// forged record starts again below it). Followed, and said.
		m.log.Warn("share generation went backwards or jumped; following the newest record",
			"key", key, "revision", rev, "generation", r.Generation, "previous", v.share.Generation)
	}
	delete(v.problems, key)
	v.share, v.shareRev = &r, rev
}

// ahead reports whether r, a share record written at revision rev, was
// computed under a config newer than the one this instance has (at
// configRev), written before r: one its watch has yet to bring. A record
// that names a config revision not before its own was not written by
// configd, which computes it from a config it read.
func ahead(r schema.ShareRecord, configRev, rev int64) bool {
	return r.ConfigRevision > configRev && r.ConfigRevision < rev
}

// limitsProblem is the key of Status.Problems under which the first
// Member of a Group made by JoinProvider lists the provider's limits it
// does not enforce.
const limitsProblem = "limits"

// checkLimits lists among v's problems the further limits c holds in
// force that this instance does not enforce: a Member of Join enforces
// none, one of JoinProvider those in force when it joined (it reads them
// once). Members of a Group whose lanes were named by hand check nothing.
func (m *Member) checkLimits(v *view, c *schema.ProviderConfig) {
	if m.cfg.enforced == nil {
		return
	}
	var missing []string
	for _, l := range c.InForce()[1:] {
		if !slices.ContainsFunc(m.cfg.enforced, func(e schema.Lane) bool { return e.Lane == l.Lane }) {
			missing = append(missing, l.String())
		}
	}
	if len(missing) == 0 {
		delete(v.problems, limitsProblem)
		return
	}
	why := fmt.Sprintf("the provider's limits %s are not enforced by this instance: it joined with cluster.Join, which enforces the first limit alone, or before they were added (cluster.JoinProvider reads them once); join with JoinProvider, or restart it", strings.Join(missing, ", "))
	if v.problems[limitsProblem] != why {
		m.log.Error("provider has limits this instance does not enforce", "limits", missing)
	}
	v.problems[limitsProblem] = why
}

// listProblems copies the view's problems into Status.Problems.
func (m *Member) listProblems(v *view) {
	m.setStatus(func(s *Status) {
		s.Problems = s.Problems[:0]
		for key, why := range v.problems {
			s.Problems = append(s.Problems, key+": "+why)
		}
		slices.Sort(s.Problems)
	})
}
