//go:build unix && !linux

package child

import "syscall"

// SysProcAttr puts a child in a process group of its own.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
