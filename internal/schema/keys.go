package schema

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// DefaultPrefix is the key prefix used when none is configured.
const DefaultPrefix = "/sluice/"

// Path segments of the key layout.
const (
	providersDir = "providers/"
	configLeaf   = "config"
	sharesLeaf   = "shares" // an older configd's one record of every share
	sharesDir    = "shares/"
	instancesDir = "instances/"
	evenDir      = "even/"
	historyDir   = "history/"
	budgetDir    = "budget/"
	ledgerDir    = "quota/" // sorts after providers/ and configd/: see Watched
	electionDir  = "configd/leader"
	ownersDir    = "configd/owners/"
)

var (
	nameRE       = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}(~[1-9])?$`)
	instanceIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
)

// ValidateName reports whether name is a valid provider name:
// ^[a-z0-9][a-z0-9._-]{0,127}$, or that followed by ~1 to ~9 for a lane
// provider (LaneName), which only configd creates (ValidateUserName). The
// error is a *ValidationError wrapping ErrInvalidName.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return invalid("name", name, ErrInvalidName)
	}
	return nil
}

// ValidateInstanceID reports whether id is a valid instance ID:
// ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$. The error is a *ValidationError
// wrapping ErrInvalidInstanceID.
func ValidateInstanceID(id string) error {
	if !instanceIDRE.MatchString(id) {
		return invalid("id", id, ErrInvalidInstanceID)
	}
	return nil
}

// Keys formats and parses sluice's etcd keys under one prefix. The zero value
// uses DefaultPrefix. Keys is a small value; copy it freely.
//
//	k := schema.DefaultKeys()
//	k.Config("payments")        // "/sluice/providers/payments/config"
//	k.Instance("payments", "a") // "/sluice/providers/payments/instances/a"
type Keys struct {
	prefix string
}

// DefaultKeys returns the Keys for DefaultPrefix.
func DefaultKeys() Keys { return Keys{prefix: DefaultPrefix} }

// NewKeys returns the Keys for prefix, which must start and end with '/',
// e.g. "/sluice/" or "/team-a/sluice/". An empty prefix means DefaultPrefix.
func NewKeys(prefix string) (Keys, error) {
	if prefix == "" {
		return DefaultKeys(), nil
	}
	if len(prefix) < 2 || !strings.HasPrefix(prefix, "/") || !strings.HasSuffix(prefix, "/") ||
		strings.Contains(prefix, "//") || len(prefix) > 256 {
		return Keys{}, invalid("prefix", prefix, ErrInvalidPrefix)
	}
	return Keys{prefix: prefix}, nil
}

// Prefix returns the prefix every key starts with.
func (k Keys) Prefix() string {
	if k.prefix == "" {
		return DefaultPrefix
	}
	return k.prefix
}

// Providers returns the prefix under which every provider's keys live; watch
// it to see every config, instance and shares change.
func (k Keys) Providers() string { return k.Prefix() + providersDir }

// Provider returns the prefix of one provider's keys (ends with '/').
func (k Keys) Provider(name string) string { return k.Providers() + name + "/" }

// Config returns the key of a provider's ProviderConfig.
func (k Keys) Config(name string) string { return k.Provider(name) + configLeaf }

// Shares returns the prefix of a provider's share records (ends with '/'):
// one ShareRecord per instance configd's leader hands a share or a grant,
// under Share.
func (k Keys) Shares(name string) string { return k.Provider(name) + sharesDir }

// Share returns the key of one instance's ShareRecord, written by
// configd's leader. An instance watches its own, and nothing of the others.
func (k Keys) Share(name, id string) string { return k.Shares(name) + id }

// CommonShare returns the key of a provider's common share record
// (Instance CommonInstance): what every instance whose own record says
// Common follows, so that a publish that moves many instances' shares
// alike writes one record, not one per instance. An instance watches it
// beside its own.
func (k Keys) CommonShare(name string) string { return k.Shares(name) + CommonInstance }

// LegacyShares returns the key where an older configd kept one record of
// every share; configd deletes it.
func (k Keys) LegacyShares(name string) string { return k.Provider(name) + sharesLeaf }

// Instances returns the prefix of a provider's instance keys (ends with '/');
// the number of keys under it is the number of live instances.
func (k Keys) Instances(name string) string { return k.Provider(name) + instancesDir }

// Instance returns the key of one instance's InstanceRecord. Write it with
// the instance's lease.
func (k Keys) Instance(name, id string) string { return k.Instances(name) + id }

// Even returns the prefix of a provider's even-split confirmations (ends
// with '/'): with no configd alive, each instance that enforces the even
// split says so with a key here, on its lease. Instances count them; none
// reads another's.
func (k Keys) Even(name string) string { return k.Provider(name) + evenDir }

// EvenMark returns the key of one instance's even-split confirmation.
func (k Keys) EvenMark(name, id string) string { return k.Even(name) + id }

// Budgets returns the prefix of a budget lane's counters (ends with '/'):
// one BudgetRecord per window, of what the instances took of it.
func (k Keys) Budgets(name string) string { return k.Provider(name) + budgetDir }

// Budget returns the key of a budget lane's counter for the window of
// length window that starts at start (Unix ns): the window's length in
// seconds, then its start zero-padded, so that the counters of one
// length sort by window and a lane created again with another window
// never reads the counters of the old one.
func (k Keys) Budget(name string, window time.Duration, start int64) string {
	return fmt.Sprintf("%s%d/%020d", k.Budgets(name), int64(window/time.Second), start)
}

// Ledgers returns the prefix under which every provider's ledger lives:
// beside the providers, and sorting after them and configd's own keys,
// so that configd's watch (Watched) does not carry the ledgers' traffic.
func (k Keys) Ledgers() string { return k.Prefix() + ledgerDir }

// Watched returns the range of keys [key, end) configd watches: its own
// keys and the providers', in one watch so that their changes come in
// revision order, and none of the ledgers', which sort after both.
func (k Keys) Watched() (key, end string) { return k.Prefix(), k.Ledgers() }

// Ledger returns the prefix of a provider's ledger (ends with '/'): its
// head, publishes, grants and releases (package internal/ledger), for a
// provider whose Coordination is CoordinationLedger.
func (k Keys) Ledger(name string) string { return k.Ledgers() + name + "/" }

// History returns the prefix of a provider's audit records (ends with '/').
func (k Keys) History(name string) string { return k.Provider(name) + historyDir }

// HistoryEntry returns the key of one audit record; seq is zero-padded so
// keys sort in the order they were written (configd uses Unix nanoseconds).
func (k Keys) HistoryEntry(name string, seq int64) string {
	return fmt.Sprintf("%s%020d", k.History(name), seq)
}

// Election returns the prefix passed to concurrency.NewElection by configd
// replicas ("<prefix>configd/leader"; the election adds "/<lease id>" for
// each candidate). The leader's key is the fence for every publish.
func (k Keys) Election() string { return k.Prefix() + electionDir }

// Owners returns the prefix of the owner keys (ends with '/'): one per
// provider, naming the configd replica that leads it, on that replica's
// session lease. Every write for the provider is fenced on its owner key.
func (k Keys) Owners() string { return k.Prefix() + ownersDir }

// Owner returns the owner key of provider name.
func (k Keys) Owner(name string) string { return k.Owners() + name }

// MaxSessionTTL is the longest session lease a configd replica campaigns
// with (serve's --session-ttl is at most this). A key under Election on a
// lease granted for longer is not a replica's.
const MaxSessionTTL = time.Hour

// ElectionKey returns the key a configd replica campaigning on lease
// holds: Election()+"/" and the lease ID in hex, the name
// concurrency.Election gives it.
func (k Keys) ElectionKey(lease int64) string {
	return fmt.Sprintf("%s/%x", k.Election(), lease)
}

// ValidateReplicaID reports whether id can name a configd replica (serve's
// --replica-id, the value of its election key): 1 to 128 bytes, no space,
// tab, newline or slash. The error is a *ValidationError wrapping
// ErrInvalidReplicaID.
func ValidateReplicaID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, " \t\n/") {
		return invalid("replica id", id, ErrInvalidReplicaID)
	}
	return nil
}

// CheckElectionKey reports whether key, found under Election()+"/" on
// lease (0: none) with value, can be a configd replica's candidate as far
// as the key itself shows: a replica campaigns on its session lease, under
// ElectionKey(lease), with its replica ID as the value. It returns nil or a
// *ValidationError wrapping ErrElectionNoLease, ErrElectionKeyName or
// ErrInvalidReplicaID. Whether the lease is a live configd session's the
// key cannot show: configd also looks at the lease.
//
// Such a key blocks the election (the oldest key leads, and a leaseless
// one never goes) and would pass for a live configd with instances.
func (k Keys) CheckElectionKey(key string, lease int64, value []byte) error {
	if lease == 0 {
		return invalid("", nil, ErrElectionNoLease)
	}
	if key != k.ElectionKey(lease) {
		return invalid("key", key, ErrElectionKeyName)
	}
	return ValidateReplicaID(string(value))
}

// KeyKind says what a parsed key refers to.
type KeyKind int

// Kinds of keys.
const (
	KindUnknown  KeyKind = iota // not a sluice key, or malformed
	KindConfig                  // <prefix>providers/<name>/config
	KindShares                  // <prefix>providers/<name>/shares/<id> (Instance "": an older configd's <prefix>providers/<name>/shares; CommonInstance: the common record)
	KindInstance                // <prefix>providers/<name>/instances/<id>
	KindHistory                 // <prefix>providers/<name>/history/<seq>
	KindEven                    // <prefix>providers/<name>/even/<id>
	KindBudget                  // <prefix>providers/<name>/budget/<window seconds>/<start>
)

// String returns the kind's name.
func (k KeyKind) String() string {
	switch k {
	case KindConfig:
		return "config"
	case KindShares:
		return "shares"
	case KindInstance:
		return "instance"
	case KindHistory:
		return "history"
	case KindEven:
		return "even"
	case KindBudget:
		return "budget"
	}
	return "unknown"
}

// Key is a parsed provider key.
type Key struct {
	Kind     KeyKind
	Provider string        // provider name
	Instance string        // instance ID, for KindInstance, KindShares and KindEven
	Seq      int64         // sequence number, for KindHistory; window start (Unix ns), for KindBudget
	Window   time.Duration // the window's length, for KindBudget
}

// Parse parses a key under Providers(). A key that does not belong to the
// layout (wrong prefix, invalid name or ID, unknown leaf) returns an error
// wrapping ErrInvalidKey and Key{Kind: KindUnknown}.
func (k Keys) Parse(key string) (Key, error) {
	bad := func() (Key, error) {
		return Key{}, invalid("key", key, ErrInvalidKey)
	}
	rest, ok := strings.CutPrefix(key, k.Providers())
	if !ok {
		return bad()
	}
	name, leaf, ok := strings.Cut(rest, "/")
	if !ok || ValidateName(name) != nil {
		return bad()
	}
	switch {
	case leaf == configLeaf:
		return Key{Kind: KindConfig, Provider: name}, nil
	case leaf == sharesLeaf:
		return Key{Kind: KindShares, Provider: name}, nil
	case strings.HasPrefix(leaf, sharesDir):
		id := leaf[len(sharesDir):]
		if id != CommonInstance && ValidateInstanceID(id) != nil {
			return bad()
		}
		return Key{Kind: KindShares, Provider: name, Instance: id}, nil
	case strings.HasPrefix(leaf, instancesDir):
		id := leaf[len(instancesDir):]
		if ValidateInstanceID(id) != nil {
			return bad()
		}
		return Key{Kind: KindInstance, Provider: name, Instance: id}, nil
	case strings.HasPrefix(leaf, evenDir):
		id := leaf[len(evenDir):]
		if ValidateInstanceID(id) != nil {
			return bad()
		}
		return Key{Kind: KindEven, Provider: name, Instance: id}, nil
	case strings.HasPrefix(leaf, historyDir):
		seq, err := strconv.ParseInt(leaf[len(historyDir):], 10, 64)
		if err != nil || seq < 0 {
			return bad()
		}
		return Key{Kind: KindHistory, Provider: name, Seq: seq}, nil
	case strings.HasPrefix(leaf, budgetDir):
		secs, rest, _ := strings.Cut(leaf[len(budgetDir):], "/")
		n, err1 := strconv.ParseInt(secs, 10, 64)
		start, err2 := strconv.ParseInt(rest, 10, 64)
		if err1 != nil || err2 != nil || n < 1 || n > int64(MaxBudgetWindow/time.Second) || start < 0 {
			return bad()
		}
		w := time.Duration(n) * time.Second
		if key != k.Budget(name, w, start) {
			return bad()
		}
		return Key{Kind: KindBudget, Provider: name, Seq: start, Window: w}, nil
	}
	return bad()
}
