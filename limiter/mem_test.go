package limiter_test

import "runtime"

type runtimeMem struct{ heap, stack uint64 }

// read records the live heap and goroutine stacks after a GC.
func (m *runtimeMem) read() {
	runtime.GC()
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.heap, m.stack = s.HeapAlloc, s.StackInuse
}
