package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/ledger"
)

// Limiter is the limiter a Follower enforces on: *limiter.Limiter.
type Limiter interface {
	ledger.Limiter
	Now() time.Time // the limiter's corrected clock
}

// Follower is a member's side of one limit's ledger: it reads the
// publishes and its own grants and releases, watches them, enforces on
// its limiter what they allow (ledger.Enforce), and writes the releases
// its newest grant asks of it after enforcing them.
type Follower struct {
	cli  *clientv3.Client
	keys ledger.Keys
	hold *ledger.Holder
	lim  Limiter
	idle time.Duration
	log  *slog.Logger
	// maxOps is the most operations of one transaction it writes.
	maxOps int
	// onReserve, when set, is told each new reserve of the holder's
	// grants for each class (WithReserves); last is the last it was
	// told. Owned by Run's goroutine.
	onReserve func(reserve map[string]int64, ok bool)
	last      map[string]int64
	lastOK    bool
	told      bool
}

// FollowerOption configures a Follower.
type FollowerOption func(*Follower)

// WithMaxOps makes the follower write its releases in transactions of at
// most n operations: etcd's --max-txn-ops (default ledger.DefaultMaxOps).
func WithMaxOps(n int) FollowerOption { return func(f *Follower) { f.maxOps = n } }

// WithReserves makes the follower call fn, on its own goroutine, with
// what the holder's grants reserve for each priority class
// (ledger.State.Reserves), each time it changes once enforced; ok is
// false while it holds no grant of a publish.
func WithReserves(fn func(reserve map[string]int64, ok bool)) FollowerOption {
	return func(f *Follower) { f.onReserve = fn }
}

// ErrName is returned by NewFollower for a name no holder can carry.
var ErrName = errors.New("store: invalid holder name")

// NewFollower returns the follower of one incarnation of the process
// named name in the ledger under keys, enforcing on lim. idle is the
// window length lim keeps with nothing granted.
//
// Its holder name (Holder().Name()) is name, a dot and an incarnation id
// drawn from crypto/rand, which a restart never reuses: a new process's
// limiter has not counted what the last one admitted under its grants, so
// it must not inherit them, and starts with none. The process reports its
// demand to configd under that holder name.
func NewFollower(cli *clientv3.Client, keys ledger.Keys, name string, lim Limiter, idle time.Duration, log *slog.Logger, opts ...FollowerOption) (*Follower, error) {
	if name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("%w: %q: want a non-empty name without '/'", ErrName, name)
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("store: drawing an incarnation id for %q: %w", name, err)
	}
	holder := name + "." + hex.EncodeToString(id[:])
	f := &Follower{cli: cli, keys: keys, hold: ledger.NewHolder(keys, holder), lim: lim, idle: idle, log: log, maxOps: ledger.DefaultMaxOps}
	for _, o := range opts {
		o(f)
	}
	if f.maxOps < 1 {
		return nil, fmt.Errorf("%w: at most %d operations a transaction: want at least 1", ledger.ErrInvalid, f.maxOps)
	}
	return f, nil
}

// Holder returns the follower's holder: what it has read and released.
// It is safe to read only after Run has returned.
func (f *Follower) Holder() *ledger.Holder { return f.hold }

// Run follows the ledger until ctx ends, starting over from a fresh read
// after a watch fails (a compaction, etcd out of reach). What it enforces
// meanwhile is what it last read: its grants end at their last window, so
// a follower cut off admits nothing past its fail-static horizon.
func (f *Follower) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := f.follow(ctx)
		if ctx.Err() != nil {
			break
		}
		f.log.Warn("ledger: following again", "holder", f.hold.Name(), "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(f.tick()):
		}
	}
	return nil
}

// tick is how often the follower syncs with nothing read: what it must
// release depends on the time as well as on the records.
func (f *Follower) tick() time.Duration { return max(f.idle/4, 10*time.Millisecond) }

// opTimeout bounds one read or write of the follower's. It bounds no
// safety (the limiter keeps what was last read, and grants end): a loaded
// etcd answering in more than half a short window must not keep the
// follower from ever reading.
func (f *Follower) opTimeout() time.Duration { return max(2*f.tick(), 500*time.Millisecond) }

// follow reads, then watches from the revision read, until the watch
// fails or ctx ends.
func (f *Follower) follow(ctx context.Context) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	rev, err := f.read(ctx)
	if err != nil {
		return err
	}
	f.sync(ctx)
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(rev + 1)}
	// configd deletes a publish only once it has ended: the holder
	// forgets it by itself, and etcd sends one event less per publish
	// to every member.
	pubs := f.cli.Watch(wctx, f.keys.Pubs(), append(opts, clientv3.WithFilterDelete())...)
	own := f.cli.Watch(wctx, f.keys.Grants(f.hold.Name()), opts...)
	t := time.NewTicker(f.tick())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case wr, ok := <-pubs:
			if err := f.events(wr, ok); err != nil {
				return err
			}
		case wr, ok := <-own:
			if err := f.events(wr, ok); err != nil {
				return err
			}
		case <-t.C:
		}
		f.sync(ctx)
	}
}

// read replaces what the holder has read with the publishes, its grants
// and its releases as etcd holds them at one revision, which it returns.
func (f *Follower) read(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, f.opTimeout())
	defer cancel()
	name := f.hold.Name()
	resp, err := f.cli.Txn(rctx).Then(
		clientv3.OpGet(f.keys.Pubs(), clientv3.WithPrefix()),
		clientv3.OpGet(f.keys.Grants(name), clientv3.WithPrefix()),
		clientv3.OpGet(f.keys.HolderReleases(name), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("store: reading holder %s's ledger: %w", name, err)
	}
	f.hold.Forget()
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			f.observe(string(kv.Key), kv.Value)
		}
	}
	return resp.Header.Revision, nil
}

func (f *Follower) observe(key string, value []byte) {
	if err := f.hold.Observe(key, value); err != nil {
		f.log.Error("ledger: a record it cannot read adds no room", "holder", f.hold.Name(), "key", key, "err", err)
	}
}

// events applies one watch response.
func (f *Follower) events(wr clientv3.WatchResponse, ok bool) error {
	if !ok {
		return errors.New("store: the watch ended")
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("store: watching the ledger: %w", err)
	}
	for _, ev := range wr.Events {
		var v []byte
		if ev.Type == clientv3.EventTypePut {
			v = ev.Kv.Value
		}
		f.observe(string(ev.Kv.Key), v)
	}
	return nil
}

// sync enforces what the holder's records allow, releases first, and
// writes the releases not yet stored.
func (f *Follower) sync(ctx context.Context) {
	now := f.lim.Now().UnixNano()
	next, rels := f.hold.Next(now, 0)
	from, err := ledger.Enforce(f.lim, next, f.hold.Name(), now, f.lim.Now().UnixNano(), f.idle)
	if err != nil {
		f.log.Error("ledger: cannot enforce", "holder", f.hold.Name(), "err", err)
		return
	}
	f.hold.Commit(next, rels, from)
	f.tellReserve(next)
	sent, ops, err := f.hold.Unsent()
	if err != nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, f.opTimeout())
	defer cancel()
	// Each release is its own record that only lowers: any of them may be
	// stored before the others.
	for len(sent) > 0 {
		n := min(len(sent), f.maxOps)
		if err := Put(wctx, f.cli, ops[:n]); err != nil {
			f.log.Warn("ledger: releases not written yet", "holder", f.hold.Name(), "err", err)
			return
		}
		f.hold.Stored(sent[:n])
		sent, ops = sent[n:], ops[n:]
	}
}

// Leave is a clean exit's last step, called once Run has returned: it
// sets the limiter to admit nothing, then writes the holder's releases
// of every grant to nothing from the first window the limiter governs
// whole, so configd may grant that room to others at once. Releases not
// written are no loss of safety: the grants end at their publish's end.
func (f *Follower) Leave(ctx context.Context) error {
	now := f.lim.Now().UnixNano()
	from, err := ledger.Enforce(f.lim, ledger.NewState(), f.hold.Name(), now, now, f.idle)
	if err != nil {
		return err
	}
	f.hold.Leave(from)
	sent, ops, err := f.hold.Unsent()
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, f.opTimeout())
	defer cancel()
	for len(sent) > 0 {
		n := min(len(sent), f.maxOps)
		if err := Put(wctx, f.cli, ops[:n]); err != nil {
			return fmt.Errorf("store: writing holder %s's releases as it leaves: %w", f.hold.Name(), err)
		}
		f.hold.Stored(sent[:n])
		sent, ops = sent[n:], ops[n:]
	}
	return nil
}

// tellReserve calls onReserve when what the grants in st reserve for
// each class differs from what it last told.
func (f *Follower) tellReserve(st *ledger.State) {
	if f.onReserve == nil {
		return
	}
	kept, ok := st.Reserves(f.hold.Name(), f.lim.Now().UnixNano())
	if f.told && ok == f.lastOK && maps.Equal(kept, f.last) {
		return
	}
	f.last, f.lastOK, f.told = kept, ok, true
	f.onReserve(kept, ok)
}
