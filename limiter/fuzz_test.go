package limiter

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// FuzzLimiter drives a limiter with an arbitrary sequence of operations in
// fake time and checks, for every aligned window, that it admitted no more
// than the quota in force there (0 past an expiry), and that nothing panics.
//
// Bit 5 of the first byte adds SetExpiry as a ninth operation; without it
// the operations mean what they meant when the corpus in testdata was found.
func FuzzLimiter(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{7, 200, 3, 3, 3, 1, 0, 255, 9, 12, 44, 2, 2, 2, 2})
	f.Add([]byte{5, 0, 0, 0, 6, 1, 1, 1, 8, 8, 8, 3})
	f.Add([]byte{0x21, 3, 8, 100, 2, 40, 2, 40, 3, 64, 8, 200, 0, 1, 3, 255, 8, 0, 2, 9})
	f.Add([]byte{0x32, 9, 8, 130, 4, 5, 2, 90, 5, 2, 8, 70, 3, 250, 7, 30, 8, 140, 1, 1})
	windows := []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second, time.Hour}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) < 2 || len(ops) > 400 {
			return
		}
		synctest.Test(t, func(t *testing.T) {
			w := windows[int(ops[0])%len(windows)]
			q := int64(ops[1] % 16)
			l, err := New(q, w, WithPacing(ops[0]&0x10 != 0))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			// quotaAt[k] is the quota in force in window k, as set by
			// SetQuota calls that name a future boundary.
			quotaAt := map[int64]int64{}
			setFrom := func(k, q int64) {
				for i := k; i < k+1000; i++ {
					quotaAt[i] = q
				}
			}
			setFrom(time.Now().UnixNano()/int64(w), q)
			// expired[k] says window k begins at or after the expiry set
			// before it began.
			expired := map[int64]bool{}
			nops := byte(8)
			if ops[0]&0x20 != 0 {
				nops = 9
			}
			var mu sync.Mutex
			admitted := map[int64]int64{}
			admit := func(n int64) {
				mu.Lock()
				admitted[time.Now().UnixNano()/int64(w)] += n
				mu.Unlock()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for i := 2; i+1 < len(ops); i += 2 {
				op, arg := ops[i]%nops, int64(ops[i+1])
				switch op {
				case 0, 1:
					n := arg%5 + 1
					if l.TryAcquireN(n) {
						admit(n)
					}
				case 2:
					n := arg%3 + 1
					go func() {
						if l.AcquireN(ctx, n, time.Duration(arg)*w/16) == nil {
							admit(n)
						}
					}()
				case 3:
					time.Sleep(time.Duration(arg) * w / 32)
				case 4:
					k := time.Now().UnixNano()/int64(w) + 1
					nq := arg % 16
					if err := l.SetQuota(nq, time.Unix(0, k*int64(w))); err != nil {
						t.Fatal(err)
					}
					setFrom(k, nq)
				case 5:
					if r, err := l.Reserve(arg%3+1, w); err == nil && arg%2 == 0 {
						r.Cancel()
					}
				case 6:
					l.SetPacing(arg%2 == 0)
				case 7:
					l.Backoff(time.Duration(arg) * w / 64)
				case 8:
					// 0 removes the expiry; otherwise from 3 windows ago to
					// 5 ahead, in steps of w/32, boundaries included.
					var at time.Time
					if arg != 0 {
						at = time.Now().Add(time.Duration(arg-96) * w / 32)
					}
					l.SetExpiry(at)
					k := time.Now().UnixNano()/int64(w) + 1
					for j := k; j < k+1000; j++ {
						expired[j] = !at.IsZero() && j*int64(w) >= at.UnixNano()
					}
				}
				synctest.Wait()
			}
			time.Sleep(3 * w)
			cancel()
			synctest.Wait()
			for k, n := range admitted {
				q := quotaAt[k]
				if expired[k] {
					q = 0
				}
				if n > q {
					t.Fatalf("window %d admitted %d > quota %d (expired: %v)", k, n, q, expired[k])
				}
			}
		})
	})
}

// FuzzWindowArithmetic checks window alignment for any time and any valid
// window: the start is aligned, not after t, and less than a window before.
func FuzzWindowArithmetic(f *testing.F) {
	f.Add(int64(0), int64(time.Second))
	f.Add(int64(-1), int64(10*time.Millisecond))
	f.Add(int64(1<<62), int64(time.Hour))
	f.Fuzz(func(t *testing.T, ns, w int64) {
		wd := time.Duration(w)
		if ValidateWindow(wd) != nil {
			return
		}
		tm := time.Unix(0, ns)
		s := WindowStart(tm, wd)
		if s.After(tm) || tm.Sub(s) >= wd || s.UnixNano()%w != 0 {
			t.Fatalf("WindowStart(%v, %v) = %v", tm, wd, s)
		}
		var sc schedule
		sc.cur = params{quota: 1, window: w}
		sp := sc.spanAt(ns, true)
		if sp.start > ns || sp.end <= ns || sp.end-sp.start != w {
			t.Fatalf("spanAt(%d) = %+v", ns, sp)
		}
	})
}
