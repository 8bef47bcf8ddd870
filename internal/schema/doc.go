// Package schema is the one place that knows how sluice lays out its state in
// etcd: the key names under a configurable prefix, the JSON records stored at
// those keys, and their validation. configd, its CLI and the instance side
// (package limiter/cluster) all use it; nothing else formats keys.
//
// # Key layout
//
// Under a prefix (DefaultPrefix is "/sluice/"):
//
//	<prefix>providers/<name>/config            ProviderConfig, written by operators (configd set)
//	<prefix>providers/<name>/instances/<id>    InstanceRecord, attached to the instance's lease
//	<prefix>providers/<name>/shares            Shares, written only by the configd leader (fenced)
//	<prefix>providers/<name>/history/<seq>     HistoryEntry, one per config change (audit)
//	<prefix>configd/leader/<lease-hex>         configd's concurrency.Election candidates
//
// Provider names match ^[a-z0-9][a-z0-9._-]{0,127}$; instance IDs match
// ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$. Neither can contain '/', so every key
// parses back unambiguously (see Keys.Parse).
//
// # Records
//
// Every record is a JSON object with a "version" field (Version). Decoders
// reject unknown fields, field names in another case ("Limit" for "limit":
// names are case-sensitive), keys that appear twice in one object
// (ErrDuplicateKey), bodies larger than MaxRecordSize, versions newer than
// Version, and records that fail their Validate method. A record read back
// from etcd goes through the same decoder as a request body, so a record
// written by hand is held to the same rules:
//
//	cfg, err := schema.DecodeProviderConfig(kv.Value)
//	if err != nil {
//		// ignore it, log it, keep the last good value
//	}
//
// Validation errors are *ValidationError values naming the field; they unwrap
// to a sentinel such as ErrInvalidLimit, and every one of them also matches
// ErrInvalid:
//
//	errors.Is(err, schema.ErrInvalid) // true for every bad input
//	errors.Is(err, schema.ErrInvalidLimit)
package schema
