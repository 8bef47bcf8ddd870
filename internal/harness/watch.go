package harness

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// Watcher follows a provider's shares record and instance keys in etcd.
type Watcher struct {
	mu      sync.Mutex
	shares  []schema.Shares
	deletes map[string]time.Time // instance id → when its key was deleted
}

// NewWatcher watches provider's keys (default prefix) until ctx ends.
func NewWatcher(ctx context.Context, cli *clientv3.Client, provider string) *Watcher {
	w := &Watcher{deletes: map[string]time.Time{}}
	keys := schema.DefaultKeys()
	prefix := keys.Provider(provider)
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix())
	go func() {
		for {
			wr, ok := <-wch
			if !ok {
				return // ctx ended
			}
			if wr.CompactRevision != 0 {
				// Fell behind a compaction (etcd ends the watch): go on
				// from the oldest revision still kept; what changed before
				// it is lost, and the keys' values at it are read again.
				wch = cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(wr.CompactRevision))
				continue
			}
			now := time.Now()
			for _, ev := range wr.Events {
				k, err := keys.Parse(string(ev.Kv.Key))
				if err != nil {
					continue
				}
				w.mu.Lock()
				switch {
				case k.Kind == schema.KindShares && ev.Type == clientv3.EventTypePut:
					if sh, err := schema.DecodeShares(ev.Kv.Value); err == nil {
						w.shares = append(w.shares, sh)
					}
				case k.Kind == schema.KindInstance && ev.Type == clientv3.EventTypeDelete:
					w.deletes[k.Instance] = now
				}
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// Latest returns the newest shares record seen.
func (w *Watcher) Latest() (schema.Shares, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.shares) == 0 {
		return schema.Shares{}, false
	}
	return w.shares[len(w.shares)-1], true
}

// All returns every shares record seen, oldest first.
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

// WaitShares waits until the newest shares record satisfies cond.
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
