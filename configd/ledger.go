package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

// ledgerRounds is the most rounds one publish of a ledger provider runs:
// a publish to more holders than a transaction holds is staged over
// several.
const ledgerRounds = 8

// publishLedger runs rounds of the provider's ledger toward the split of
// its live instances (package round), each conditioned on leadership and
// the config's revision besides the ledger's head, until one has nothing
// to write. The ledger keeps the guarantee: the leader keeps no books,
// and what its Publisher keeps of the ledger the head's revision checks.
func (p *publisher) publishLedger(ctx context.Context, f fence, name string, st *providerState, cfg schema.ProviderConfig) error {
	now, tick := p.wall(), round.Tick(cfg.Window.D())
	live := make([]schema.InstanceRecord, 0, len(st.instances))
	holders := fnv.New64a()
	for _, id := range slices.Sorted(maps.Keys(st.instances)) {
		live = append(live, st.instances[id])
		holders.Write([]byte(st.instances[id].Holder + "\x00"))
	}
	p.metrics.liveInstances.WithLabelValues(name).Set(float64(len(live)))
	p.metrics.total.WithLabelValues(name).Set(float64(cfg.Limit))
	run := ledgerRun{at: now, keyRev: st.keyRev, holders: holders.Sum64()}
	if until, ok := st.ledgerLast.wait(run, tick, cfg.Window.D()); ok && now.Before(until) {
		st.due = until
		return nil
	}
	st.due = now.Add(tick)
	st.ledgerLast = run
	target, reserves, err := round.Target(cfg, live)
	if err != nil {
		return fmt.Errorf("allocation failed: %w", err)
	}
	if st.ledger == nil {
		st.ledger = ledgerstore.NewPublisher(p.cli, ledger.Keys(p.keys.Ledger(name)), p.wall)
	}
	pb := st.ledger
	conds := []clientv3.Cmp{f.cmp(), clientv3.Compare(clientv3.ModRevision(p.keys.Config(name)), "=", st.keyRev)}
	pol := round.Policy(cfg)
	pol.MaxOps, pol.Reserves = p.txnOps, reserves
	written, done, err := pb.Rounds(ctx, pol, target, ledgerRounds, conds...)
	for _, ch := range written {
		p.metrics.publishes.WithLabelValues(name).Inc()
		p.log.Debug("ledger written", "provider", name, "why", ch.Why)
	}
	switch {
	case errors.Is(err, ledgerstore.ErrMoved):
		// The config, the leadership or the head moved since: the watch
		// brings the first two, and the next round reads the third.
		return nil
	case err != nil:
		st.ledgerLast.more = true // retried with the next change, unpaced
		return err
	case done:
		return nil
	}
	st.due = p.wall() // more to write: at once
	st.ledgerLast.more = true
	return nil
}

// ledgerRun is what a provider's last ledger rounds ran for.
type ledgerRun struct {
	at      time.Time
	keyRev  int64  // the config's revision
	holders uint64 // a hash of the live holders' names
	more    bool   // they left more to write
}

// joinGap is the least time between two rounds for a change of the live
// holders of a provider of window w: instances that join within a window
// are granted in one publish. Each publish to all holders costs every
// holder a grant and, when its share shrank, releases; a fleet joining
// over seconds otherwise made a publish every round.
func joinGap(w time.Duration) time.Duration {
	return min(max(w, 50*time.Millisecond), time.Second)
}

// wait returns until when the rounds for next may wait after last: every
// report of an instance's demand marks its provider changed, and a
// thousand instances report a thousand times a second, while a target
// that moved by more than the slack can wait for the next tick, and a
// change of the holders for joinGap of the window w. A new config or
// more to write waits for nothing.
func (last ledgerRun) wait(next ledgerRun, tick, w time.Duration) (time.Time, bool) {
	if last.at.IsZero() || last.more || next.keyRev != last.keyRev {
		return time.Time{}, false
	}
	if next.holders != last.holders {
		return last.at.Add(joinGap(w)), true
	}
	return last.at.Add(tick), true
}
