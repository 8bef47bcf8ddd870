package main

import (
	"os"
	"syscall"
)

// dieWithParent asks Linux to send the demo SIGTERM when the process that
// started it exits: killing `make demo` or `go run ./examples/demo` (whose
// PID a shell's $! or a process list shows) then stops the demo, which
// stops every child, instead of leaving them running on configd's and
// etcd's ports.
func dieWithParent() {
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0)
	if os.Getppid() == 1 {
		// The parent died before the request: nothing will signal us.
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
}
