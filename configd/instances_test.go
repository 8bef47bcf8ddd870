package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// Simulated instances that acknowledge.
//
// A real instance rewrites its record with applied_generation = G as soon
// as it has applied the shares of generation G (limiter/cluster), and the
// leader's safe handover (package plan) grows a share only out of what the
// instances that shrink have acknowledged giving up. Tests that simulate
// instances by writing their records (addInstance, addInstanceDemand,
// putDemand) get the same acknowledgements from a sim: one per test and
// provider, started by the first of those calls, that watches the
// provider's shares key and rewrites every simulated instance's record
// (same lease, same demand) with the new generation. Acknowledging is on
// by default; sim.silence opts an instance out (it keeps the generation it
// last acknowledged, also through putDemand) and sim.resume opts it back
// in.
//
// The sim also keeps every shares record published while it runs and the
// revision of every record it wrote, for checkHandover.

// sim is the simulated instances of one provider in one test.
type sim struct {
	t        testing.TB
	cli      *clientv3.Client
	provider string
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}

	mu   sync.Mutex // held across the writes, so silence/resume are synchronous
	inst map[string]*simInstance
	set  *schema.ShareSet // the share records as the instances see them
	pubs []publication    // the view after every generation seen, in revision order
}

type simInstance struct {
	lease   clientv3.LeaseID
	demand  int64
	started time.Time
	applied int64 // the generation its record acknowledges: its own share record's
	silent  bool  // does not acknowledge new generations
	gone    bool  // its lease is gone
	// revoked is when the test revoked its lease (zero: it did not), under
	// the provider's fail_static failStatic: its grant is held that long and
	// a window after configd sees it go.
	revoked    time.Time
	failStatic time.Duration
	leaving    bool  // its record says it is leaving (a graceful exit)
	acks       []ack // every record written, in revision order
}

// publication is the view of the share records after a generation, and
// the revision it was written at.
type publication struct {
	rev int64
	sh  schema.Shares
}

// ack is a record written with applied_generation gen at revision rev.
// ack is one record written: the generation it acknowledged, its
// revision, and whether it says the instance is leaving (it has stopped
// admitting: Member.Close writes it after).
type ack struct {
	gen, rev int64
	leaving  bool
}

type simKey struct {
	t        testing.TB
	provider string
}

var sims = struct {
	sync.Mutex
	m map[simKey]*sim
}{m: map[simKey]*sim{}}

// instancesOf returns the test's sim of provider, starting it (watching
// the shares key from now on) if this is the first use.
func instancesOf(t testing.TB, cli *clientv3.Client, provider string) *sim {
	t.Helper()
	sims.Lock()
	defer sims.Unlock()
	k := simKey{t, provider}
	if s := sims.m[k]; s != nil {
		return s
	}
	s := &sim{t: t, cli: cli, provider: provider, inst: map[string]*simInstance{}, done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.set = schema.NewShareSet(keys, provider)
	resp, err := cli.Get(ctxT(t), keys.Shares(provider), clientv3.WithPrefix())
	if err != nil {
		s.cancel()
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		s.set.Apply(string(kv.Key), kv.Value, false) // a malformed record: an instance ignores it
	}
	if sh, ok := s.set.View(); ok {
		s.pubs = append(s.pubs, publication{resp.Header.Revision, sh})
	}
	wch := cli.Watch(s.ctx, keys.Shares(provider), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	go s.run(wch)
	sims.m[k] = s
	t.Cleanup(func() {
		s.cancel()
		<-s.done
		sims.Lock()
		delete(sims.m, k)
		sims.Unlock()
	})
	return s
}

func (s *sim) run(wch clientv3.WatchChan) {
	defer close(s.done)
	for wr := range wch {
		if err := wr.Err(); err != nil {
			if s.ctx.Err() == nil {
				s.t.Errorf("sim of %s: shares watch: %v", s.provider, err)
			}
			return
		}
		s.mu.Lock()
		for _, ev := range wr.Events {
			s.set.Apply(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete) // a malformed record: an instance ignores it
		}
		s.mu.Unlock()
		if len(wr.Events) > 0 {
			s.published(wr.Header.Revision)
		}
	}
}

// published records the view of the share records written at rev and
// makes every instance that is not silent acknowledge its own record's
// generation, as an instance does once it has applied it.
func (s *sim) published(rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh, ok := s.set.View()
	if !ok {
		return
	}
	// One view per generation: a publish's deletions of held records may
	// come in a response of their own.
	if n := len(s.pubs); n > 0 && s.pubs[n-1].sh.Generation == sh.Generation {
		s.pubs[n-1] = publication{rev, sh}
	} else {
		s.pubs = append(s.pubs, publication{rev, sh})
	}
	for _, id := range slices.Sorted(maps.Keys(s.inst)) {
		in := s.inst[id]
		gen := s.ownGeneration(id)
		if in.silent || in.gone || in.applied >= gen {
			continue
		}
		in.applied = gen
		if err := s.write(s.ctx, id, in); err != nil && s.ctx.Err() == nil {
			s.t.Errorf("sim of %s: acknowledging generation %d for %s: %v", s.provider, gen, id, err)
		}
	}
}

// ownGeneration returns the generation of id's share record (0: none);
// s.mu is held.
func (s *sim) ownGeneration(id string) int64 {
	r, _ := s.set.Record(id)
	return r.Generation
}

// write puts in's record on its lease; s.mu is held. A lease that is gone
// (revoked by the test) makes the instance gone, not an error.
func (s *sim) write(ctx context.Context, id string, in *simInstance) error {
	now := time.Now().UTC()
	rec := schema.InstanceRecord{ID: id, Host: "test-host", PID: 1000, Started: in.started, Updated: now,
		Demand: in.demand, AppliedGeneration: in.applied, Leaving: in.leaving, ReadsCommon: true}
	b, err := schema.Encode(rec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := s.cli.Put(ctx, keys.Instance(s.provider, id), string(b), clientv3.WithLease(in.lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		in.gone = true
		return nil
	}
	if err != nil {
		return err
	}
	in.acks = append(in.acks, ack{in.applied, resp.Header.Revision, in.leaving})
	return nil
}

// put writes id's record on lease with demand, keeping the generation it
// acknowledged; a new instance (or one on a new lease) acknowledges the
// newest generation at once unless silent, as a joining instance applies
// the shares it finds.
func (s *sim) put(id string, lease clientv3.LeaseID, demand int64) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.inst[id]
	if in == nil {
		in = &simInstance{started: time.Now().UTC()}
		s.inst[id] = in
	}
	if in.lease != lease || in.gone {
		in.lease, in.gone = lease, false
		if !in.silent {
			in.applied = s.ownGeneration(id)
		}
	}
	in.demand = demand
	if err := s.write(ctxT(s.t), id, in); err != nil {
		s.t.Fatalf("writing %s's record: %v", id, err)
	}
	if in.gone {
		s.t.Fatalf("writing %s's record: lease %x not found", id, lease)
	}
}

// leave is a graceful exit, as cluster.Member.Close does it: id's record
// says it is leaving, then its lease is revoked, so configd hands its
// share on at once instead of holding it for the provider's fail_static.
func (s *sim) leave(id string) {
	s.t.Helper()
	s.mu.Lock()
	in := s.inst[id]
	in.leaving = true
	err := s.write(ctxT(s.t), id, in)
	lease := in.lease
	s.mu.Unlock()
	if err != nil {
		s.t.Fatalf("writing %s's leaving record: %v", id, err)
	}
	if _, err := s.cli.Revoke(ctxT(s.t), lease); err != nil {
		s.t.Fatalf("revoking %s's lease: %v", id, err)
	}
}

// silence stops id from acknowledging: its record keeps the generation it
// acknowledged last. No acknowledgement of id is written after it returns.
func (s *sim) silence(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in := s.inst[id]; in != nil {
		in.silent = true
	} else {
		s.t.Fatalf("silence: no simulated instance %s", id)
	}
}

// resume makes id acknowledge again, at once: its record is rewritten with
// its own share record's generation, which is returned.
func (s *sim) resume(id string) int64 {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.inst[id]
	if in == nil {
		s.t.Fatalf("resume: no simulated instance %s", id)
	}
	in.silent, in.applied = false, s.ownGeneration(id)
	if err := s.write(ctxT(s.t), id, in); err != nil {
		s.t.Fatalf("acknowledging generation %d for %s: %v", in.applied, id, err)
	}
	return in.applied
}

// acked returns the generation id's record acknowledges.
func (s *sim) acked(id string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in := s.inst[id]; in != nil {
		return in.applied
	}
	return 0
}

// publications returns every well-formed shares record seen so far.
func (s *sim) publications() []schema.Shares {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]schema.Shares, len(s.pubs))
	for i, p := range s.pubs {
		out[i] = p.sh
	}
	return out
}

// seen waits until the simulated instances have seen generation gen: they
// watch etcd on their own, behind a read of the shares key. Their
// acknowledgements of it are written by then (under the same lock).
func (s *sim) seen(t testing.TB, gen int64) {
	t.Helper()
	waitFor(t, 5*time.Second, "the simulated instances to see the generation", func() bool {
		for _, p := range s.publications() {
			if p.Generation >= gen {
				return true
			}
		}
		return false
	})
}

// settled waits until the newest published generation is acknowledged by
// every simulated instance that is neither silent nor gone, and its first
// window has begun: from then on the leader, when it next computes, knows
// every acknowledgement there is. It returns that record.
func (s *sim) settled(t testing.TB) schema.Shares {
	t.Helper()
	var sh schema.Shares
	waitFor(t, 15*time.Second, "the newest generation acknowledged and in effect", func() bool {
		var ok bool
		if sh, ok = readShares(t, s.cli, s.provider); !ok || time.Now().Before(sh.EffectiveTime()) {
			return false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for id, in := range s.inst {
			if _, named := sh.Granted[id]; named && !in.silent && !in.gone && in.applied < sh.GenerationOf(id) {
				return false
			}
		}
		return true
	})
	return sh
}

// checkHandover checks the handover's invariants over every generation
// published while the sim ran (none may lower the total):
//   - Granted names every instance Shares names (and may name more: those
//     whose lease expired, held for the provider's fail_static); every
//     share is at most its grant, and the grants add up to at most the
//     total;
//   - every instance's grant covers the share of the newest generation it
//     had acknowledged when the record was written (what it may be
//     enforcing then), so the instances cannot together be enforcing more
//     than the total;
//   - generations grow by one.
func (s *sim) checkHandover(t testing.TB) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("publications seen by the simulated instances of %s:\n%s", s.provider, s)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	byGen := map[int64]schema.Shares{}
	for i, p := range s.pubs {
		sh := p.sh
		byGen[sh.Generation] = sh
		if i > 0 && sh.Generation != s.pubs[i-1].sh.Generation+1 {
			t.Errorf("generation %d follows %d", sh.Generation, s.pubs[i-1].sh.Generation)
		}
		if sh.Granted == nil && len(sh.Shares) > 0 {
			t.Errorf("generation %d has no grants: %+v", sh.Generation, sh)
			continue
		}
		for id := range sh.Shares {
			if _, ok := sh.Granted[id]; !ok {
				t.Errorf("generation %d: shares %v name %s, grants %v do not", sh.Generation, sh.Shares, id, sh.Granted)
			}
		}
		if g := s.binding(sh); sum(g) > sh.Total {
			t.Errorf("generation %d: grants %v add up to %d > total %d", sh.Generation, g, sum(g), sh.Total)
		}
		for id, v := range sh.Shares {
			if v > sh.Granted[id] {
				t.Errorf("generation %d: %s's share %d exceeds its grant %d", sh.Generation, id, v, sh.Granted[id])
			}
		}
		for id, in := range s.inst {
			g, named := sh.Granted[id]
			if !named {
				continue // not live when computed
			}
			var last int64 = -1 // newest generation id acknowledged before p
			left := false       // and whether that record says it left
			for _, a := range in.acks {
				if a.rev < p.rev {
					last, left = a.gen, a.leaving
				}
			}
			// One that said it is leaving enforces nothing: configd hands
			// its share on at once (CI saw generation 6 grant a leaving
			// instance 0 before its lease's revocation came).
			if old, ok := byGen[last]; ok && !left && old.Shares[id] > g {
				t.Errorf("generation %d grants %s %d, but it may still enforce %d from generation %d it acknowledged",
					sh.Generation, id, g, old.Shares[id], last)
			}
		}
	}
}

// String lists the publications, for failure messages.
func (s *sim) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, p := range s.pubs {
		fmt.Fprintf(&b, "rev %d gen %d by %s total %d shares %v granted %v effective %s published %s\n", p.rev, p.sh.Generation, p.sh.Leader,
			p.sh.Total, p.sh.Shares, p.sh.Granted, p.sh.EffectiveTime().UTC().Format("15:04:05.000"), p.sh.Published.Format("15:04:05.000"))
	}
	for _, id := range slices.Sorted(maps.Keys(s.inst)) {
		fmt.Fprintf(&b, "%s acks (gen@rev) %v silent %v gone %v\n", id, s.inst[id].acks, s.inst[id].silent, s.inst[id].gone)
	}
	return b.String()
}

// binding returns sh's grants less those of instances whose lease the
// test revoked and whose hold has ended before sh takes effect: their
// record may outlive the hold by a publish, while sh already gives their
// room to others from a window in which they admit nothing. The hold is
// bounded by fail_static and two windows past the revocation (configd
// sees the key go a moment after it, and holds a window more). s.mu is
// held.
func (s *sim) binding(sh schema.Shares) map[string]int64 {
	g := maps.Clone(sh.Granted)
	for id, in := range s.inst {
		if _, live := sh.Shares[id]; live || in.revoked.IsZero() {
			continue
		}
		if !sh.EffectiveTime().Before(in.revoked.Add(in.failStatic + 2*sh.Window.D())) {
			delete(g, id)
		}
	}
	return g
}

// revoke revokes id's lease, noting when and the provider's failStatic,
// for binding.
func (s *sim) revoke(t testing.TB, cli *clientv3.Client, id string, lease clientv3.LeaseID, failStatic time.Duration) {
	t.Helper()
	s.mu.Lock()
	s.inst[id].revoked, s.inst[id].failStatic = time.Now(), failStatic
	s.mu.Unlock()
	if _, err := cli.Revoke(ctxT(t), lease); err != nil {
		t.Fatal(err)
	}
}
