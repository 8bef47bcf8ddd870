package consumer

import (
	"testing"
	"time"
)

// books wraps a tracker with a slot count, the way Run uses it.
type books struct {
	*tracker
	held int
}

func newBooks() *books {
	b := &books{}
	b.tracker = newTracker(func(n int) { b.held -= n })
	return b
}

func (b *books) fetch(p int, off int64) *entry {
	b.held++
	e, _ := b.add("t", p, off)
	return e
}

// commit commits what is ready and returns the offsets committed by
// partition (the last message covered).
func (b *books) commit() map[int]int64 {
	pts := b.ready()
	got := map[int]int64{}
	for _, m := range messages(pts) {
		got[m.Partition] = m.Offset
	}
	b.committed(pts)
	return got
}

func TestTrackerCommitsContiguousPrefix(t *testing.T) {
	tests := []struct {
		name     string
		offsets  []int64 // fetched, partition 0, in order
		done     []int   // indexes of offsets marked done, in order
		want     int64   // last offset committed, -1 for none
		wantHeld int
	}{
		{"nothing done", []int64{0, 1, 2}, nil, -1, 3},
		{"all done in order", []int64{0, 1, 2}, []int{0, 1, 2}, 2, 0},
		{"gap holds back later ones", []int64{0, 1, 2, 3}, []int{0, 2, 3}, 0, 3},
		{"out of order fills gap", []int64{5, 6, 7}, []int{2, 1, 0}, 7, 0},
		{"offset gaps (compaction) are fine", []int64{3, 10, 11}, []int{0, 1}, 10, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBooks()
			var es []*entry
			for _, o := range tt.offsets {
				es = append(es, b.fetch(0, o))
			}
			for _, i := range tt.done {
				b.done(es[i])
			}
			got, ok := b.commit()[0]
			if !ok {
				got = -1
			}
			if got != tt.want {
				t.Errorf("committed up to %d, want %d", got, tt.want)
			}
			if b.held != tt.wantHeld {
				t.Errorf("slots held = %d, want %d", b.held, tt.wantHeld)
			}
		})
	}
}

func TestTrackerRewindStartsOver(t *testing.T) {
	b := newBooks()
	a0, a1, a2 := b.fetch(0, 0), b.fetch(0, 1), b.fetch(0, 2)
	b.done(a0)
	// The partition is read again from 1 (a new generation started at the
	// committed offset): the old segment is abandoned.
	n1 := b.fetch(0, 1)
	if b.held != 4-1 { // a0 was done: its slot is freed by the abandon
		t.Fatalf("held = %d after rewind, want 3", b.held)
	}
	b.done(n1)
	if got := b.commit(); got[0] != 1 {
		t.Fatalf("commit after rewind = %v, want partition 0 up to offset 1", got)
	}
	// Old entries finishing later neither commit nor leak slots.
	b.done(a2)
	b.done(a1)
	if got := b.commit(); len(got) != 0 {
		t.Fatalf("abandoned entries committed %v", got)
	}
	if b.held != 0 {
		t.Fatalf("held = %d, want 0", b.held)
	}
}

func TestTrackerEpochChange(t *testing.T) {
	b := newBooks()
	p0a, p0b := b.fetch(0, 10), b.fetch(0, 11)
	p1a := b.fetch(1, 20)
	b.done(p0a)
	b.done(p1a)
	b.newEpoch()
	// Done-but-uncommitted messages are given up (re-delivered elsewhere).
	if got := b.commit(); len(got) != 0 {
		t.Fatalf("committed %v right after a rebalance, want nothing", got)
	}
	if b.held != 1 { // only p0b, still in flight
		t.Fatalf("held = %d, want 1", b.held)
	}
	// A straggler of partition 0 continues at 12 while 11 is still in
	// flight: it must not be committed, since 11 might never finish.
	s := b.fetch(0, 12)
	b.done(s)
	if got := b.commit(); len(got) != 0 {
		t.Fatalf("committed %v past an unfinished abandoned message", got)
	}
	b.done(p0b) // now everything before 12 is done
	if got := b.commit(); got[0] != 12 {
		t.Fatalf("commit = %v, want partition 0 up to 12", got)
	}
	// Partition 1 was not fetched since the rebalance: never committed by us.
	if b.held != 0 {
		t.Fatalf("held = %d, want 0", b.held)
	}
}

func TestTrackerCompacts(t *testing.T) {
	b := newBooks()
	for i := range int64(1000) {
		b.done(b.fetch(0, i))
		if i%7 == 0 {
			b.commit()
		}
	}
	b.commit()
	if b.held != 0 {
		t.Fatalf("held = %d, want 0", b.held)
	}
	s := b.parts[topicPartition{"t", 0}].seg
	if len(s.entries)-s.head != 0 || cap(s.entries) > 2048 {
		t.Fatalf("entries not compacted: len %d head %d cap %d", len(s.entries), s.head, cap(s.entries))
	}
}

func TestBackoffBounds(t *testing.T) {
	base, maxB := 10*time.Millisecond, 80*time.Millisecond
	for attempt := 1; attempt <= 10; attempt++ {
		want := min(base<<(attempt-1), maxB)
		for range 50 {
			d := backoff(attempt, base, maxB)
			if d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
}

// A message dropped at a revocation, before the rebalance is recorded,
// is not done: the revocation's commit stops before it, and its slot is
// freed with its segment, not left pending.
func TestTrackerDroppedIsNotDone(t *testing.T) {
	b := newBooks()
	e0, e1, e2, e3 := b.fetch(0, 0), b.fetch(0, 1), b.fetch(0, 2), b.fetch(0, 3)
	b.done(e0)
	b.drop(e1) // queued when the partition was given up
	b.done(e2) // done behind it (OrderNone)
	if got := b.commit(); got[0] != 0 {
		t.Fatalf("committed %v, want partition 0 up to offset 0 only", got)
	}
	b.newEpoch()
	if b.held != 1 {
		t.Fatalf("%d slots held after the rebalance, want 1 (offset 3, unfinished)", b.held)
	}
	b.drop(e3) // its call cut after the grace
	if b.held != 0 {
		t.Fatalf("%d slots held, want 0", b.held)
	}
	// The partition, fetched again in the next generation from offset 1,
	// commits at once: nothing of it is pending.
	b.done(b.fetch(0, 1))
	if got := b.commit(); got[0] != 1 {
		t.Fatalf("committed %v after the rebalance, want partition 0 up to offset 1", got)
	}
}
