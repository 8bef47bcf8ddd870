package schema

import "fmt"

// ShareSet collects one provider's share records as they are read and
// watched in etcd, for the readers that show or check the whole provider
// (configd status, tools, tests); an instance reads only its own record.
// Records that say Common are resolved against the provider's common
// record as it is in the set (ShareRecord.Resolve): a set applied from one
// read, or from a watch's events up to one revision, is one snapshot.
// The zero value is not usable: use NewShareSet.
type ShareSet struct {
	keys     Keys
	provider string
	recs     map[string]ShareRecord // by instance ID, as written: some say Common
	common   *ShareRecord
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
	common := k.Instance == CommonInstance
	if deleted {
		if common {
			s.common = nil
		}
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
	if common {
		s.common = &r
		return true, nil
	}
	s.recs[k.Instance] = r
	return true, nil
}

// Len returns how many instances' records the set holds.
func (s *ShareSet) Len() int { return len(s.recs) }

// Record returns instance id's record, resolved: false when there is none,
// or when it says Common and the set holds no common record.
func (s *ShareSet) Record(id string) (ShareRecord, bool) {
	r, ok := s.recs[id]
	if !ok {
		return ShareRecord{}, false
	}
	r, err := r.Resolve(s.common)
	return r, err == nil
}

// View returns the provider view of the instances' records, resolved
// (AssembleShares), and false when there are none.
func (s *ShareSet) View() (Shares, bool) {
	recs := make([]ShareRecord, 0, len(s.recs))
	for id := range s.recs {
		if r, ok := s.Record(id); ok {
			recs = append(recs, r)
		}
	}
	if len(recs) == 0 {
		return Shares{}, false
	}
	return AssembleShares(s.provider, recs), true
}
