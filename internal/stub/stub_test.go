package stub

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestStubCountsByAlignedWindow(t *testing.T) {
	now := time.Unix(1000, 900*int64(time.Millisecond))
	s := New(2, time.Second)
	s.now = func() time.Time { return now }
	for i, want := range []int{200, 200, 429} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
		if rec.Code != want {
			t.Fatalf("call %d: %d, want %d", i, rec.Code, want)
		}
		if want == 429 && rec.Header().Get("Retry-After") != "1" {
			t.Fatalf("Retry-After %q", rec.Header().Get("Retry-After"))
		}
	}
	now = now.Add(200 * time.Millisecond) // next window
	if d := s.Call(); d != 0 {
		t.Fatalf("first call of a new window refused")
	}
	ws := s.Windows()
	if len(ws) != 1 || ws[0].Calls != 3 || !ws[0].Over() || ws[0].Start != time.Unix(1000, 0) {
		t.Fatalf("windows %+v", ws)
	}
	if last, ok := s.Last(); !ok || last.Calls != 3 {
		t.Fatalf("last %+v", last)
	}
	if s.Total() != 4 {
		t.Fatalf("total %d", s.Total())
	}
}
