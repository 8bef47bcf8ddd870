//go:build unix

package main

import (
	"io/fs"
	"os"
	"slices"
	"syscall"
)

// groupIsOurs reports whether fi's group is configd's effective group or
// one of its supplementary groups; known is false when fi has no Unix
// owner.
func groupIsOurs(fi fs.FileInfo) (ours, known bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false, false
	}
	gid := int(st.Gid)
	if gid == os.Getegid() {
		return true, true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, gid), true
}
