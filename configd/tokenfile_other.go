//go:build !unix

package main

import "io/fs"

// groupIsOurs: without Unix permissions (Windows), there is nothing to
// check; the file's ACL is the operator's to set.
func groupIsOurs(fs.FileInfo) (ours, known bool) { return false, false }
