package limiter

import (
	"context"
	"fmt"
)

// MaxClasses is the most priority classes a Limiter serves.
const MaxClasses = 8

// Class is a priority class a Limiter serves (WithClasses): its name, and
// the permits of every window kept for it, its reserve.
type Class struct {
	Name    string
	Reserve int64
}

type classKey struct{}

// WithClass returns a copy of ctx that names the priority class of the
// calls made with it: Acquire and AcquireN of a Limiter configured with
// WithClasses serve them as that class. A Limiter without classes ignores
// it.
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
// what every class has not yet used of its reserve. So a class that asks
// for at least its reserve in a window is admitted at least its reserve
// there, whatever the other classes ask, and the room beyond the reserves
// goes to whoever asks, higher classes' waiters first. When the reserves
// add up to more than a window's quota, each is cut in proportion, rounded
// down.
//
// A call names its class with WithClass; one that names none, or a class
// not listed, is of the class "default" if listed, else of the last.
// TryAcquire and Reserve, which take no context, are of that class too.
//
// A Limiter with classes decides every call under its lock: the lock-free
// hot path serves limiters without classes only. Names must be 1 to 32
// lower-case letters, digits, '_' or '-', starting with a letter, and
// unique; at most MaxClasses; reserves from 0 to MaxQuota. New returns an
// error wrapping ErrInvalid otherwise, and so does NewMulti for any
// classes: a Multi does not serve them yet.
func WithClasses(cs ...Class) Option {
	return optionFunc(func(cfg *config) { cfg.classes = append([]Class(nil), cs...) })
}

// validateClasses checks WithClasses' list.
func validateClasses(cs []Class) error {
	if len(cs) > MaxClasses {
		return fmt.Errorf("%w: at most %d classes, got %d", ErrInvalid, MaxClasses, len(cs))
	}
	for i, c := range cs {
		if !validClassName(c.Name) {
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
	}
	return nil
}

func validClassName(name string) bool {
	ok := len(name) >= 1 && len(name) <= 32 && name[0] >= 'a' && name[0] <= 'z'
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	return ok
}

// classes is what a Limiter with classes keeps of them. It never changes
// after New.
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

// of returns the index of the class ctx names; 0 for a Limiter without
// classes, which has no use for it.
func (c *classes) of(ctx context.Context) int {
	if c == nil {
		return 0
	}
	if name, ok := ClassOf(ctx); ok {
		for i, x := range c.list {
			if x.Name == name {
				return i
			}
		}
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
// used (nil: nothing), that may be taken once class c took n more: q less
// what every class has then still not used of its reserve. Reserves that
// add up to more than q are cut in proportion first, so that the classes
// can use them all.
func (c *classes) limit(q int64, used []int64, cls int, n int64) int64 {
	if c == nil {
		return q
	}
	var sum int64
	for _, x := range c.list {
		sum += x.Reserve // ≤ MaxClasses·MaxQuota: no overflow
	}
	var keep int64
	for i, x := range c.list {
		r := x.Reserve
		if sum > q {
			r = mulDiv(r, q, sum)
		}
		var u int64
		if used != nil {
			u = used[i]
		}
		if i == cls {
			u += n
		}
		keep += max(0, r-u)
	}
	return q - keep
}
