package limiter

import (
	"context"
	"fmt"
)

// MaxClasses is the most priority classes a Limiter serves.
const MaxClasses = 8

// Class is a priority class a Limiter serves (WithClasses, SetClasses):
// its name, and the permits of every window kept for it, its reserve.
//
// With Of 0, Reserve is a count of permits per window. With Of set, it is
// a part of each window's quota: Reserve of every Of permits, rounded
// down, so that the reserve follows the quota window by window.
// cluster.Member sets Of to the provider's limit and Reserve to the
// class's reserve of it: each instance keeps the part of its own quota
// that the class's reserve is of the limit, whatever its quota becomes.
type Class struct {
	Name    string
	Reserve int64
	Of      int64
}

type classKey struct{}

// WithClass returns a copy of ctx that names the priority class of the
// calls made with it: Acquire, AcquireN, TryAcquireContext and
// ReserveContext of a Limiter or a Multi configured with WithClasses serve
// them as that class. A Limiter without classes ignores it.
func WithClass(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, classKey{}, name)
}

// ClassOf returns the class ctx names, and whether it names one.
func ClassOf(ctx context.Context) (string, bool) {
	name, ok := ctx.Value(classKey{}).(string)
	return name, ok
}

// WithClasses makes the Limiter serve priority classes, highest first.
//
// Waiters of a higher class are placed ahead of waiters of lower classes
// whose permits are not yet valid; those are placed again behind it, in
// the order they asked, and one that no longer fits its wait fails with
// ErrTimeout. Waiters of one class are served first come, first served.
//
// A class's reserve is kept for it in every window: a call of any class
// is admitted only if, after it, the permits the window has left cover
// what every other class has not yet used of its reserve. So a class that
// asks for at least its reserve in a window is admitted at least its
// reserve there, whatever the other classes ask, and the room beyond the
// reserves goes to whoever asks, higher classes' waiters first. When the
// reserves add up to more than a window's quota, each is cut in
// proportion, rounded down.
//
// A change within a window (of its quota, which moves the reserves given
// with Of too, or of the classes), or in a paced window the slots whose
// time passed, can leave fewer permits than the classes have not yet used
// of their reserves. Each class then still takes of its own unused
// reserve what the others' leave, and none takes more than its own: a
// class refused after a change was admitted, since the change, at least
// the lesser of its unused reserve and what the window had left beyond
// the other classes' unused reserves.
//
// A call names its class with WithClass; one that names none, or a class
// not listed, is of the class "default" if listed, else of the last.
// TryAcquire and Reserve, which take no context, are of that class too;
// TryAcquireContext, TryAcquireNContext and ReserveContext read the class
// from their context.
//
// Given to NewMulti, the classes are every limit's, each limit keeping
// its reserves of its own quota (see Multi).
//
// A Limiter with classes decides every call under its lock: the lock-free
// hot path serves limiters without classes only. Names must be 1 to 32
// lower-case letters, digits, '_' or '-', starting with a letter, and
// unique; at most MaxClasses; reserves from 0 to MaxQuota, and at most Of
// when Of is set. New and NewMulti return an error wrapping ErrInvalid
// otherwise. SetClasses changes them later.
func WithClasses(cs ...Class) Option {
	return optionFunc(func(cfg *config) { cfg.classes = append([]Class(nil), cs...) })
}

// validateClasses checks WithClasses' list.
func validateClasses(cs []Class) error {
	if len(cs) > MaxClasses {
		return fmt.Errorf("%w: at most %d classes, got %d", ErrInvalid, MaxClasses, len(cs))
	}
	for i, c := range cs {
		if !ValidClassName(c.Name) {
			return fmt.Errorf("%w: a class name is 1 to 32 lower-case letters, digits, '_' or '-', starting with a letter, got %q", ErrInvalid, c.Name)
		}
		for _, o := range cs[:i] {
			if o.Name == c.Name {
				return fmt.Errorf("%w: class %q is listed twice", ErrInvalid, c.Name)
			}
		}
		if c.Reserve < 0 || c.Reserve > MaxQuota {
			return fmt.Errorf("%w: class %q: a reserve is 0 to %d permits, got %d", ErrInvalid, c.Name, int64(MaxQuota), c.Reserve)
		}
		if c.Of < 0 || c.Of > MaxQuota || (c.Of > 0 && c.Reserve > c.Of) {
			return fmt.Errorf("%w: class %q: a reserve of Of permits is 0 to Of, and Of 0 to %d, got %d of %d", ErrInvalid, c.Name, int64(MaxQuota), c.Reserve, c.Of)
		}
	}
	return nil
}

// ValidClassName reports whether name may name a class: 1 to 32
// lower-case letters, digits, '_' or '-', starting with a letter.
func ValidClassName(name string) bool {
	ok := len(name) >= 1 && len(name) <= 32 && name[0] >= 'a' && name[0] <= 'z'
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	return ok
}

// classes is what a Limiter with classes keeps of them. A set never
// changes once made: SetClasses replaces it whole.
type classes struct {
	list []Class
	def  int // the class of a call that names none
}

func newClasses(cs []Class) *classes {
	if len(cs) == 0 {
		return nil
	}
	c := &classes{list: cs, def: len(cs) - 1}
	for i, x := range cs {
		if x.Name == "default" {
			c.def = i
		}
	}
	return c
}

// index returns the index of the class named name, or of the default
// class if none is.
func (c *classes) index(name string) int {
	for i, x := range c.list {
		if x.Name == name {
			return i
		}
	}
	return c.def
}

// reserve is what class i keeps of a window of quota q, before any cut.
func (c *classes) reserve(i int, q int64) int64 {
	x := c.list[i]
	if x.Of > 0 {
		return mulDiv(x.Reserve, q, x.Of) // Reserve ≤ Of: at most q
	}
	return x.Reserve
}

// reserves returns what each class keeps of a window of quota q: their
// reserves, cut in proportion, rounded down, when they add up to more
// than q.
func (c *classes) reserves(q int64) []int64 {
	out := make([]int64, len(c.list))
	var sum int64
	for i := range c.list {
		out[i] = c.reserve(i, q)
		sum += out[i] // ≤ MaxClasses·MaxQuota: no overflow
	}
	if sum > q {
		for i := range out {
			out[i] = mulDiv(out[i], q, sum)
		}
	}
	return out
}

// of returns the index of the class ctx names; 0 for a Limiter without
// classes, which has no use for it.
func (c *classes) of(ctx context.Context) int {
	if c == nil {
		return 0
	}
	if name, ok := ClassOf(ctx); ok {
		return c.index(name)
	}
	return c.def
}

// defaultClass is the class of a call that takes no context.
func (c *classes) defaultClass() int {
	if c == nil {
		return 0
	}
	return c.def
}

// limit is the most slots of a window of quota q, whose classes have used
// used (nil: nothing), that class cls may take: q less what every other
// class has not yet used of its reserve. Reserves that add up to more
// than q are cut in proportion first, so that the classes can use them
// all.
//
// A class's own unused reserve does not count against it: what it takes
// of it is kept for it anyway. While the permits left cover every unused
// reserve, this admits what keeping them all after the call would, for a
// call beyond the class's unused reserve leaves none of it to keep. When
// a change within the window, or pacing, left less than they add up to,
// every class takes of its own unused reserve what the others' leave,
// and nothing beyond it: the shortfall stays until the window ends or the
// limits change again.
func (c *classes) limit(q int64, used []int64, cls int) int64 {
	if c == nil {
		return q
	}
	var sum int64
	for i := range c.list {
		sum += c.reserve(i, q) // ≤ MaxClasses·MaxQuota: no overflow
	}
	var keep int64
	for i := range c.list {
		if i == cls {
			continue
		}
		r := c.reserve(i, q)
		if sum > q {
			r = mulDiv(r, q, sum)
		}
		var u int64
		if used != nil {
			u = used[i]
		}
		keep += max(0, r-u)
	}
	return q - keep
}

// SetClasses replaces the priority classes the Limiter serves, as
// WithClasses sets them at New; none makes it a Limiter without classes,
// whose hot path takes no lock again.
//
// What each class took of the current window stays counted for the class
// of the same name, and so do its counters in Stats; what a class no
// longer listed took is counted for the default class, as its calls now
// are. When the Limiter had no classes, what the window admitted so far
// is counted for the default class. Waiters not yet valid are placed
// again under the new classes, highest class first, then in the order
// they asked, as after any change of limits: one that no longer fits its
// wait fails with ErrTimeout.
//
// On a limit of a Multi (Multi.Limiter) it sets that limit's classes
// alone, as a coordinator that keeps that limit does (cluster.JoinGroup);
// the Multi's waiters placed again are moved whole, as after any change of
// one limit. Multi.SetClasses sets every limit's.
//
// It returns an error wrapping ErrInvalid for a list WithClasses refuses,
// ErrClosed after Close; then nothing changes.
func (l *Limiter) SetClasses(cs ...Class) error {
	if err := validateClasses(cs); err != nil {
		return err
	}
	l.lockChange()
	defer l.unlockChange()
	return l.setClassesLocked(append([]Class(nil), cs...))
}

// setClassesLocked is SetClasses of a valid list, under lockChange.
func (l *Limiter) setClassesLocked(cs []Class) error {
	if l.closed {
		return ErrClosed
	}
	now := l.now()
	l.advanceLocked(now)
	rs := l.unplaceLocked(now)
	old, oldUsed, oldCounts := l.classes, l.curUsed, l.classCounts
	nc := newClasses(cs)
	// Every reservation left in the book is valid and in the current
	// window, fixed (see Reservation.fixed), or waits in rs: map each to
	// its class in nc while both lists are at hand. A future window's
	// use by class is then what its fixed reservations hold.
	remap := func(r *Reservation) { r.class, r.set = max(0, l.classOfLocked(r, nc)), nc }
	for _, bw := range l.book {
		bw.used = nil
	}
	use := func(start int64, r *Reservation) {
		if bw := l.book[start]; nc != nil && bw != nil && start > l.cur.start {
			if bw.used == nil {
				bw.used = make([]int64, len(cs))
			}
			bw.used[r.class] += r.n
		}
	}
	for start, bw := range l.book {
		for r := range bw.res {
			remap(r)
			use(start, r)
		}
	}
	for _, r := range rs {
		remap(r)
	}
	l.classes, l.curUsed, l.classCounts = nc, nil, nil
	// The slow bit is set (or cleared) before the window's consumption
	// is read below, so that no admission of the hot path falls between.
	l.advanceLocked(now)
	if nc != nil {
		l.curUsed = make([]int64, len(cs))
		l.classCounts = make([]classCount, len(cs))
		if old == nil {
			l.curUsed[nc.def] = l.consumedLocked()
		}
		for i, c := range old.names() {
			j := nc.index(c)
			l.curUsed[j] += oldUsed[i]
			if nc.list[j].Name == c {
				l.classCounts[j] = oldCounts[i]
			}
		}
	}
	sortReservations(rs)
	l.replaceLocked(rs, now, 0)
	return nil
}

// Classes returns the priority classes the Limiter serves, highest first;
// none for a Limiter without classes.
func (l *Limiter) Classes() []Class {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.classes == nil {
		return nil
	}
	return append([]Class(nil), l.classes.list...)
}

// names returns the classes' names in order; none for nil.
func (c *classes) names() []string {
	if c == nil {
		return nil
	}
	out := make([]string, len(c.list))
	for i, x := range c.list {
		out[i] = x.Name
	}
	return out
}

// classOfLocked returns the index in set of reservation r's class: its
// own when r was made under set, else the class of the same name, or
// set's default class (for a name set does not list, or a reservation
// made without classes); -1 when set is nil.
func (l *Limiter) classOfLocked(r *Reservation, set *classes) int {
	return remapClass(r.set, r.class, set)
}

// remapClass returns the index in to of class i of from: i when both are
// one set, else the class of the same name, or to's default class (for a
// name to does not list, or from nil: no classes); -1 when to is nil.
func remapClass(from *classes, i int, to *classes) int {
	switch {
	case to == nil:
		return -1
	case from == to:
		return i
	case from == nil:
		return to.def
	}
	return to.index(from.list[i].Name)
}

// useClassLocked counts d more permits (fewer when negative) as taken by
// class i of set: in the current window's use if open, else in what its
// closed windows took. It does nothing without classes.
func (l *Limiter) useClassLocked(set *classes, i int, open bool, d int64) {
	cls := remapClass(set, i, l.classes)
	switch {
	case cls < 0:
	case open:
		l.curUsed[cls] += d
	default:
		l.classCounts[cls].closed += d
	}
}

// classCount is what Stats counts of one class beyond the current
// window; guarded by mu.
type classCount struct {
	closed   int64 // permits its windows already closed took
	shadow   int64 // permits shadow mode admitted beyond the quota
	refused  int64 // TryAcquire refusals and timeouts
	canceled int64
}

// countClassLocked adds to the counters of class cls: refused and
// canceled permits, or those shadow mode admitted. It does nothing
// without classes.
func (l *Limiter) countClassLocked(cls int, refused, canceled, shadow int64) {
	if l.classes == nil || cls < 0 {
		return
	}
	c := &l.classCounts[cls]
	c.refused += refused
	c.canceled += canceled
	c.shadow += shadow
}

// ClassStats is what Stats says of one priority class. Counters count
// permits since the class was first listed, as Stats' do; SetClasses
// keeps them for a class whose name stays.
type ClassStats struct {
	Name string
	// Reserve is what the current window keeps for the class, cut in
	// proportion when the reserves add up to more than its quota, and
	// Used what the class took of it, promised permits included.
	Reserve, Used int64
	// Admitted is the permits of the class granted, as Stats.Admitted
	// counts them (shadow mode's admissions included); Refused those
	// TryAcquire refused or that timed out; Canceled those given back.
	Admitted, Refused, Canceled int64
	// WaitingPermits is the permits of its waiters not yet valid.
	WaitingPermits int64
}

// classStatsLocked fills st.Classes; pending[i] is what class i's
// reservations in the current window have not yet made valid, and
// waiting[i] its waiters' permits.
func (l *Limiter) classStatsLocked(st *Stats, pending, waiting []int64) {
	if l.classes == nil {
		return
	}
	res := l.classes.reserves(max(0, l.cur.quota))
	st.Classes = make([]ClassStats, len(l.classes.list))
	for i, c := range l.classes.list {
		k := l.classCounts[i]
		st.Classes[i] = ClassStats{
			Name:           c.Name,
			Reserve:        res[i],
			Used:           l.curUsed[i],
			Admitted:       k.closed + l.curUsed[i] - pending[i] + k.shadow,
			Refused:        k.refused,
			Canceled:       k.canceled,
			WaitingPermits: waiting[i],
		}
	}
}
