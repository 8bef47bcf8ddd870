package limiter_test

import "runtime"

type runtimeMem struct{ heap uint64 }

// read records live heap plus goroutine stacks after a GC.
func (m *runtimeMem) read() {
	runtime.GC()
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.heap = s.HeapAlloc + s.StackInuse
}
