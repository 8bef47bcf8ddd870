// Package logbuf holds Buffer, a log destination that tests read while the
// code under test writes to it from other goroutines.
//
//	var logs logbuf.Buffer
//	m, _ := cluster.Join(ctx, cli, "api", cluster.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
//	mark := logs.Len()
//	// ... cause something ...
//	strings.Contains(logs.From(mark), `msg="clock offset stepped`)
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use. The zero value is an
// empty buffer ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Len returns how many bytes were written so far: a mark for From.
func (l *Buffer) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

// From returns what was written from byte offset i on (a Len taken
// earlier).
func (l *Buffer) From(i int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()[i:]
}
