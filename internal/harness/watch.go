package harness

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// Watcher follows a provider's share records and instance keys in etcd.
type Watcher struct {
	mu      sync.Mutex
	shares  []schema.Shares      // the view after every change, oldest first
	deletes map[string]time.Time // instance id → when its key was deleted
}

// ReadShares reads provider's share records (default prefix) and returns
// their view, the revision read at, and whether there are any.
func ReadShares(ctx context.Context, cli *clientv3.Client, provider string) (schema.Shares, int64, bool, error) {
	set, rev, err := readShareSet(ctx, cli, schema.DefaultKeys(), provider)
	if err != nil {
		return schema.Shares{}, 0, false, err
	}
	v, ok := set.View()
	return v, rev, ok, nil
}

func readShareSet(ctx context.Context, cli *clientv3.Client, keys schema.Keys, provider string) (*schema.ShareSet, int64, error) {
	resp, err := cli.Get(ctx, keys.Shares(provider), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("read %s's share records: %w", provider, err)
	}
	set := schema.NewShareSet(keys, provider)
	for _, kv := range resp.Kvs {
		set.Apply(string(kv.Key), kv.Value, false) // a malformed record is left out
	}
	return set, resp.Header.Revision, nil
}

// NewWatcher watches provider's keys (default prefix) until ctx ends,
// starting from the share records there now.
func NewWatcher(ctx context.Context, cli *clientv3.Client, provider string) *Watcher {
	w := &Watcher{deletes: map[string]time.Time{}}
	go FollowShares(ctx, cli, provider, w.record, func(id string, at time.Time) {
		w.mu.Lock()
		w.deletes[id] = at
		w.mu.Unlock()
	})
	return w
}

// FollowShares calls onShares with the view of provider's share records
// (default prefix) as they are now, if there are any, and again after
// every watch response that changes them, and onDeleted (if not nil) for
// every instance key deleted, until ctx ends. After a compaction ends the
// watch, it reads the records again and goes on from there.
func FollowShares(ctx context.Context, cli *clientv3.Client, provider string, onShares func(schema.Shares), onDeleted func(id string, at time.Time)) {
	keys := schema.DefaultKeys()
	for ctx.Err() == nil {
		set, rev, err := readShareSet(ctx, cli, keys, provider)
		if err != nil { // etcd not reachable yet, or ctx ended
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if v, ok := set.View(); ok {
			onShares(v)
		}
		wch := cli.Watch(ctx, keys.Provider(provider), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for wr := range wch {
			if wr.CompactRevision != 0 || wr.Err() != nil {
				break
			}
			now, changed := time.Now(), false
			for _, ev := range wr.Events {
				del := ev.Type == clientv3.EventTypeDelete
				if ok, _ := set.Apply(string(ev.Kv.Key), ev.Kv.Value, del); ok {
					changed = true
				}
				if k, err := keys.Parse(string(ev.Kv.Key)); err == nil && k.Kind == schema.KindInstance && del && onDeleted != nil {
					onDeleted(k.Instance, now)
				}
			}
			if v, ok := set.View(); changed && ok {
				onShares(v)
			}
		}
	}
}

// record appends a view of the share records.
func (w *Watcher) record(v schema.Shares) {
	w.mu.Lock()
	w.shares = append(w.shares, v)
	w.mu.Unlock()
}

// Latest returns the newest view of the share records.
func (w *Watcher) Latest() (schema.Shares, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.shares) == 0 {
		return schema.Shares{}, false
	}
	return w.shares[len(w.shares)-1], true
}

// All returns the view after every change seen, oldest first.
func (w *Watcher) All() []schema.Shares {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]schema.Shares(nil), w.shares...)
}

// Deleted returns when instance id's key was deleted.
func (w *Watcher) Deleted(id string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.deletes[id]
	return t, ok
}

// WaitShares waits until the newest view of the share records satisfies cond.
func (w *Watcher) WaitShares(timeout time.Duration, cond func(schema.Shares) bool) (schema.Shares, error) {
	deadline := time.Now().Add(timeout)
	for {
		sh, ok := w.Latest()
		if ok && cond(sh) {
			return sh, nil
		}
		if time.Now().After(deadline) {
			return sh, fmt.Errorf("no matching shares within %v (newest: generation %d, total %d, %d instances)",
				timeout, sh.Generation, sh.Total, sh.Instances)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
