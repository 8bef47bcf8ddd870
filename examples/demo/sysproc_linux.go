package main

import "syscall"

// sysProcAttr puts a child in a process group of its own, and has Linux
// kill it if the demo dies without stopping it (SIGKILL of the demo).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
