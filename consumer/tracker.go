package consumer

import (
	"slices"
	"sync"

	"github.com/segmentio/kafka-go"
)

// This file keeps the books that make delivery at-least-once: which fetched
// messages are done, which offset of each partition may be committed, and
// when an in-flight slot is free again.
//
// Every fetched message holds one in-flight slot until it is committed, or,
// if its segment is abandoned (below), until it is done. A segment is the run
// of messages of one partition fetched in one stretch of ownership. Commits
// only ever cover a done, contiguous prefix of a segment whose start is known
// to be safe, so a commit never claims a message that nobody handled.
//
// kafka-go's Reader tells neither the generation of a message nor the
// partitions assigned, so rebalances are seen two ways:
//   - the Reader's rebalance counter moved (newEpoch): every segment is
//     abandoned (done but uncommitted messages are re-delivered to whoever
//     owns the partition now), and a partition is committed again only once
//     a message of it was fetched after the rebalance (so a partition that
//     moved away is not committed by us any more);
//   - a partition's offset went back (a new generation re-reads it from the
//     committed offset): its segment is abandoned and a new one starts there.
//
// A segment that starts where the partition's reading started (first
// message ever, or an offset going back) is trusted at once: everything before
// it is committed. A segment that continues after a rebalance is trusted only
// once every abandoned message of its partition is done, because the message
// that opened it may be a straggler of the previous generation.

type topicPartition struct {
	topic     string
	partition int
}

// entry is one fetched message in the books.
type entry struct {
	offset  int64
	done    bool
	dropped bool // given up unfinished: never done, its slot freed with its segment
	seg     *segment
}

// segment is a run of one partition's messages, in fetch order.
type segment struct {
	part      *partState
	entries   []*entry // entries[head:] are not committed yet
	head      int
	doneTo    int  // entries[head:doneTo] are done
	restart   bool // starts where reading started: trusted at once
	abandoned bool
}

type partState struct {
	tp               topicPartition
	seg              *segment // nil after an epoch change until the next fetch
	lastFetched      int64
	epoch            uint64 // epoch of the last fetched message
	abandonedPending int    // messages of abandoned segments not done yet
}

// tracker is safe for concurrent use; mu guards everything in it.
type tracker struct {
	mu      sync.Mutex
	parts   map[topicPartition]*partState
	epoch   uint64
	release func(n int) // frees n in-flight slots; called with mu held, must not block
}

func newTracker(release func(n int)) *tracker {
	return &tracker{parts: make(map[topicPartition]*partState), release: release}
}

// add records a fetched message and returns its entry. rewound reports that
// the partition's offset went back (it is being re-read).
func (t *tracker) add(topic string, partition int, offset int64) (e *entry, rewound bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp := topicPartition{topic, partition}
	p := t.parts[tp]
	switch {
	case p == nil:
		p = &partState{tp: tp}
		t.parts[tp] = p
		p.seg = &segment{part: p, restart: true}
	case offset <= p.lastFetched:
		rewound = true
		if p.seg != nil {
			t.abandon(p.seg)
		}
		p.seg = &segment{part: p, restart: true}
	case p.seg == nil:
		p.seg = &segment{part: p}
	}
	p.lastFetched = offset
	p.epoch = t.epoch
	e = &entry{offset: offset, seg: p.seg}
	p.seg.entries = append(p.seg.entries, e)
	return e, rewound
}

// fetched returns the partitions fetched since the last rebalance, sorted.
func (t *tracker) fetched() (parts []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fetchedLocked()
}

func (t *tracker) fetchedLocked() (parts []int) {
	for _, p := range t.parts {
		if p.epoch == t.epoch && p.seg != nil {
			parts = append(parts, p.tp.partition)
		}
	}
	slices.Sort(parts)
	return parts
}

// newEpoch records a rebalance: every segment is abandoned. It returns the
// partitions fetched since the previous one, sorted.
func (t *tracker) newEpoch() (parts []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	parts = t.fetchedLocked()
	t.epoch++
	for _, p := range t.parts {
		if p.seg != nil {
			t.abandon(p.seg)
			p.seg = nil
		}
	}
	return parts
}

// isAbandoned reports whether e's segment was abandoned: no commit will
// cover e, and it will be fetched again (by this consumer or the
// partition's next owner).
func (t *tracker) isAbandoned(e *entry) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return e.seg.abandoned
}

// abandon gives up committing s: done messages free their slot now, the
// others when they are done. Requires t.mu.
func (t *tracker) abandon(s *segment) {
	s.abandoned = true
	free := 0
	for _, e := range s.entries[s.head:] {
		if e.done || e.dropped {
			free++
		} else {
			s.part.abandonedPending++
		}
	}
	s.entries = nil
	t.release(free)
}

// done marks e handled (or dead-lettered). It reports whether a commit may
// now cover more of e's partition.
func (t *tracker) done(e *entry) (progress bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e.done = true
	s := e.seg
	if s.abandoned {
		return t.settle(s)
	}
	for s.doneTo < len(s.entries) && s.entries[s.doneTo].done {
		s.doneTo++
		progress = true
	}
	return progress
}

// drop records that e will not be done by this consumer (its partition was
// given up, or Run is ending): no commit covers it, nor anything after it
// in its segment. Its slot is freed with its segment. It reports whether a
// commit may now cover more of e's partition.
func (t *tracker) drop(e *entry) (progress bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := e.seg
	if s.abandoned {
		return t.settle(s)
	}
	e.dropped = true
	return false
}

// settle records that a message of the abandoned segment s, pending until
// now, is done or dropped. Requires t.mu.
func (t *tracker) settle(s *segment) (progress bool) {
	s.part.abandonedPending--
	t.release(1)
	// The partition's current segment may have been waiting for this.
	return s.part.abandonedPending == 0 && s.part.seg != nil && s.part.seg.doneTo > s.part.seg.head
}

// commitPoint is one partition's offset ready to commit.
type commitPoint struct {
	seg  *segment
	last int64 // offset of the last message covered
}

// ready returns what may be committed now: for each partition fetched since
// the last rebalance whose current segment is trusted, the last message of
// its done prefix.
func (t *tracker) ready() []commitPoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	var pts []commitPoint
	for _, p := range t.parts {
		s := p.seg
		if s == nil || p.epoch != t.epoch || s.doneTo == s.head {
			continue
		}
		if !s.restart && p.abandonedPending > 0 {
			continue
		}
		pts = append(pts, commitPoint{seg: s, last: s.entries[s.doneTo-1].offset})
	}
	return pts
}

// messages turns commit points into what kafka-go's CommitMessages takes
// (it commits Offset+1 for each).
func messages(pts []commitPoint) []kafka.Message {
	msgs := make([]kafka.Message, len(pts))
	for i, pt := range pts {
		tp := pt.seg.part.tp
		msgs[i] = kafka.Message{Topic: tp.topic, Partition: tp.partition, Offset: pt.last}
	}
	return msgs
}

// committed records that the broker accepted pts: their messages leave the
// books and free their slots.
func (t *tracker) committed(pts []commitPoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, pt := range pts {
		s := pt.seg
		if s.abandoned {
			continue // its slots were freed when it was abandoned
		}
		n := 0
		for s.head < s.doneTo && s.entries[s.head].offset <= pt.last {
			s.entries[s.head] = nil
			s.head++
			n++
		}
		if s.head > 64 && s.head > len(s.entries)/2 {
			k := copy(s.entries, s.entries[s.head:])
			clear(s.entries[k:])
			s.entries = s.entries[:k]
			s.doneTo -= s.head
			s.head = 0
		}
		t.release(n)
	}
}
