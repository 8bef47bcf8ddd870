package child

import "syscall"

// SysProcAttr puts a child in a process group of its own, and has Linux
// kill it if its parent dies without stopping it.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
