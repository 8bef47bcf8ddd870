// Package faults is sluice's fault suite: each test starts real processes
// (configd serve, instance processes built from bench/accuracy/instance),
// an etcd embedded in the test process and a provider stub that counts
// every call by the wall-clock-aligned window it arrives in, injects one
// fault while load runs, and checks the invariants while the fault
// happens: no aligned window receives more calls than the provider's
// limit, shares generations never conflict, the system recovers.
//
// The suite is slow (10–30 s per scenario, about 100 s in all) and runs
// only with SLUICE_FAULTS=1:
//
//	SLUICE_FAULTS=1 go test -count=1 -v ./faults/
//
// Without it every test is skipped at once, so `go test ./...` stays fast.
// There is no non-test code in this package.
package faults
