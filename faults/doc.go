// Package faults is sluice's fault suite: each test starts real processes
// (configd serve, instance processes built from bench/accuracy/instance),
// an etcd embedded in the test process and a provider stub that counts
// every call by the wall-clock-aligned window it arrives in, injects one
// fault while load runs, and checks the invariants while the fault
// happens: no aligned window receives more calls than the provider's
// limit, shares generations never conflict, the system recovers. Two
// scenarios run etcd as a cluster of three members: one kills its leader,
// one stops every member for 30 s; one steps an instance's clock and silences another's NTP server (each
// instance measures against its own SNTP responder over real UDP); one cuts
// an instance off from etcd while it serves, twice: in a network namespace
// of its own whose veth link to etcd goes down (internal/netcut; as root
// with iproute2's ip, skipped with the reason otherwise), and behind a TCP
// proxy in the test that drops its connections.
//
// The Kafka scenarios run the consumer package (in-process consumers of one
// group sharing one limiter) against an in-process kfake broker, or the
// Kafka named by KAFKA_BROKERS where the scenario does not need to restart
// the broker, and check that no acknowledged message is lost, that
// committed offsets never pass what was handled, and the same per-window
// limit; duplicates are counted. The Kafka soak (TestKafkaSoak) puts 100,000
// messages through a group that two more consumers join and leave every
// 2 s, with a broker restart and a quota change on the way (about 45 s;
// -faults.soak-messages makes it longer).
//
// The suite is slow (10–60 s per scenario, about 260 s in all) and runs
// only with SLUICE_FAULTS=1:
//
//	SLUICE_FAULTS=1 go test -count=1 -v ./faults/
//
// Without it every test is skipped at once, so `go test ./...` stays fast.
// There is no non-test code in this package.
package faults
