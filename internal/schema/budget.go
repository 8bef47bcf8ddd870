package schema

import (
	"fmt"
	"time"
)

// BudgetRecord is a budget lane's counter for one window, stored at
// Keys.Budget: how much of the window's limit the instances have taken.
//
// A limit whose window is longer than configd's shares go (IsBudget: a
// day's quota, say) is not split between the instances: each takes what
// it is about to spend from this counter, in a transaction that checks
// the counter and the lane's config did not change since it read them,
// and admits no more in the window than it took. Taken never passes the
// limit in force when the take was made, so no window admits more than
// the largest limit in force during it, whatever instances join, restart,
// crash or lose etcd: what a process took and did not spend is lost with
// it (a Close gives it back).
type BudgetRecord struct {
	Version  int      `json:"version"`
	Provider string   `json:"provider"` // the budget lane provider
	Start    int64    `json:"start"`    // the window's start, Unix ns, a multiple of Window
	Window   Duration `json:"window"`
	Taken    int64    `json:"taken"` // permits taken, all instances together
}

// Validate checks every field.
func (r BudgetRecord) Validate() error {
	if err := validateVersion(r.Version); err != nil {
		return err
	}
	if err := ValidateName(r.Provider); err != nil {
		return err
	}
	if err := ValidateLimitWindow(r.Window.D()); err != nil {
		return err
	}
	if !IsBudget(r.Window.D()) {
		return invalid("window", r.Window, fmt.Errorf("%w: a budget's window is longer than %v", ErrInvalidLimitWindow, time.Duration(MaxWindow)))
	}
	if r.Start < 0 || r.Start%int64(r.Window) != 0 {
		return invalid("start", r.Start, fmt.Errorf("%w: a window's start is a multiple of its length", ErrInvalidBudget))
	}
	if r.Taken < 0 || r.Taken > MaxLimit {
		return invalid("taken", r.Taken, fmt.Errorf("%w: taken must be between 0 and %d", ErrInvalidBudget, int64(MaxLimit)))
	}
	return nil
}

// DecodeBudgetRecord decodes and validates a BudgetRecord.
func DecodeBudgetRecord(b []byte) (BudgetRecord, error) {
	var r BudgetRecord
	if err := decode(b, &r); err != nil {
		return BudgetRecord{}, err
	}
	if err := r.Validate(); err != nil {
		return BudgetRecord{}, err
	}
	r.Version = Version
	return r, nil
}
