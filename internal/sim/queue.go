package sim

// event is a callback due at a point of virtual time. Events due at the same
// time run in the order they were scheduled (seq), which makes a run
// deterministic.
type event struct {
	at  int64
	seq uint64
	fn  func()
}

// queue is a binary min-heap of events by (at, seq). Hand-rolled to avoid
// boxing every event through container/heap's interface.
type queue struct {
	ev  []event
	seq uint64
}

func (q *queue) len() int { return len(q.ev) }

func (q *queue) less(i, j int) bool {
	a, b := &q.ev[i], &q.ev[j]
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (q *queue) push(at int64, fn func()) {
	q.seq++
	q.ev = append(q.ev, event{at: at, seq: q.seq, fn: fn})
	for i := len(q.ev) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.ev[i], q.ev[p] = q.ev[p], q.ev[i]
		i = p
	}
}

func (q *queue) pop() event {
	top := q.ev[0]
	last := len(q.ev) - 1
	q.ev[0] = q.ev[last]
	q.ev[last] = event{}
	q.ev = q.ev[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && q.less(l, m) {
			m = l
		}
		if r < last && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q.ev[i], q.ev[m] = q.ev[m], q.ev[i]
		i = m
	}
	return top
}
