package schema

import "fmt"

// ShareSet collects one provider's share records as they are read and
// watched in etcd, for the readers that show or check the whole provider
// (configd status, tools, tests); an instance reads only its own record.
// The zero value is not usable: use NewShareSet.
type ShareSet struct {
	keys     Keys
	provider string
	recs     map[string]ShareRecord
}

// NewShareSet returns an empty set for provider's records under keys.
func NewShareSet(keys Keys, provider string) *ShareSet {
	return &ShareSet{keys: keys, provider: provider, recs: map[string]ShareRecord{}}
}

// Apply folds a write (value) or, with deleted, the deletion of key into
// the set and reports whether key is one of the provider's share records.
// Other keys are ignored. A value that does not decode, or that names
// another provider or instance than its key, is an error (not naming the
// key: the caller does) and the last good record stays.
func (s *ShareSet) Apply(key string, value []byte, deleted bool) (bool, error) {
	k, err := s.keys.Parse(key)
	if err != nil || k.Kind != KindShares || k.Provider != s.provider || k.Instance == "" {
		return false, nil
	}
	if deleted {
		delete(s.recs, k.Instance)
		return true, nil
	}
	r, err := DecodeShareRecord(value)
	if err != nil {
		return true, err
	}
	if r.Provider != k.Provider || r.Instance != k.Instance {
		return true, fmt.Errorf("%w: the record names provider %q, instance %q", ErrInvalidShares, r.Provider, r.Instance)
	}
	s.recs[k.Instance] = r
	return true, nil
}

// Len returns how many records the set holds.
func (s *ShareSet) Len() int { return len(s.recs) }

// Record returns instance id's record.
func (s *ShareSet) Record(id string) (ShareRecord, bool) {
	r, ok := s.recs[id]
	return r, ok
}

// View returns the provider view of the records (AssembleShares), and
// false when there are none.
func (s *ShareSet) View() (Shares, bool) {
	if len(s.recs) == 0 {
		return Shares{}, false
	}
	recs := make([]ShareRecord, 0, len(s.recs))
	for _, r := range s.recs {
		recs = append(recs, r)
	}
	return AssembleShares(s.provider, recs), true
}
