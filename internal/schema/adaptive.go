package schema

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalidAdaptive is a bad adaptive setting.
var ErrInvalidAdaptive = errors.New("adaptive: ceiling must be a limit, floor from 1 to the ceiling, the limit from the floor to the ceiling (the ceiling in shadow mode), decrease from 0 to below 1, probe from 0 to 1, and the provider without further limits")

// Adaptive makes a provider's limit follow the provider's pushback: the
// Limit of its config is then the effective limit, which configd's
// controller (configd/adapt) keeps between Floor and Ceiling and writes as
// a retune, with a history entry saying why. The operator's limit is the
// Ceiling: no window goes over it, and none over a lowered Limit once that
// is in force, as with any retune.
type Adaptive struct {
	Ceiling int64 `json:"ceiling"` // the operator's limit
	Floor   int64 `json:"floor"`   // the effective limit never goes below
	// Shadow computes the effective limit and shows it (Effective) without
	// enforcing it: Limit stays at Ceiling.
	Shadow    bool  `json:"shadow,omitempty"`
	Effective int64 `json:"effective,omitempty"` // shadow: what Limit would be
	// Decrease and Probe tune the controller (adapt.Config); 0 selects
	// its default.
	Decrease float64 `json:"decrease,omitempty"`
	Probe    float64 `json:"probe,omitempty"`
	// PauseUntil is when the provider's last Retry-After (or reset) ends:
	// no probing before it. Reason says why the effective limit last moved.
	PauseUntil time.Time `json:"pause_until,omitzero"`
	Reason     string    `json:"reason,omitempty"`
}

// validate checks a against the config's limit.
func (a Adaptive) validate(limit int64, lanes int) error {
	bad := func(field string, v any) error {
		return invalid("adaptive."+field, v, ErrInvalidAdaptive)
	}
	switch {
	case ValidateLimit(a.Ceiling) != nil:
		return bad("ceiling", a.Ceiling)
	case a.Floor < 1 || a.Floor > a.Ceiling:
		return bad("floor", a.Floor)
	case limit < a.Floor || limit > a.Ceiling || (a.Shadow && limit != a.Ceiling):
		return invalid("limit", limit, fmt.Errorf("%w (limit %d, floor %d, ceiling %d)", ErrInvalidAdaptive, limit, a.Floor, a.Ceiling))
	case a.Effective != 0 && (a.Effective < a.Floor || a.Effective > a.Ceiling):
		return bad("effective", a.Effective)
	case !(a.Decrease >= 0 && a.Decrease < 1):
		return bad("decrease", a.Decrease)
	case !(a.Probe >= 0 && a.Probe <= 1):
		return bad("probe", a.Probe)
	case len(a.Reason) > 256:
		return bad("reason", a.Reason)
	case lanes > 0:
		return bad("ceiling", "a provider with further limits")
	}
	return nil
}
