package logbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestBufferConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 100 {
				fmt.Fprintf(&b, "w%d\n", i)
			}
		})
	}
	wg.Wait()
	if n := strings.Count(b.String(), "\n"); n != 800 {
		t.Fatalf("%d lines, want 800", n)
	}
	mark := b.Len()
	b.Write([]byte("after"))
	if got := b.From(mark); got != "after" {
		t.Fatalf("From(mark) = %q, want %q", got, "after")
	}
}
