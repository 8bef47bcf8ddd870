//go:build !linux

package main

// dieWithParent does nothing where there is no parent-death signal: stop
// the demo with Ctrl-C (its process group) or its own PID.
func dieWithParent() {}
