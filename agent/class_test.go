package agent

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/sluice-go/sluice/agent/agentpb"
	"github.com/sluice-go/sluice/limiter"
)

// TestClassReserveOverHTTPAndGRPC: a provider of 12 requests an hour
// that keeps 6 for critical (its classes set as cluster.JoinProvider sets
// a joined provider's). Batch callers take the 6 beyond the reserve with
// acquire, try_acquire and reserve, over HTTP and gRPC alike; then every
// batch call is refused at the reserve while every critical call is
// admitted from it, until the window is spent.
func TestClassReserveOverHTTPAndGRPC(t *testing.T) {
	s := serve(t, conf(local("api", limiter.Limit{Quota: 12, Window: time.Hour})))
	if err := s.providers["api"].multi.SetClasses(limiter.Class{Name: "critical", Reserve: 6}, limiter.Class{Name: "batch"}); err != nil {
		t.Fatal(err)
	}
	c := grpcClient(t, "unix://"+filepath.Join(s.dir, "g.sock"))
	ctx := context.Background()
	paths := []string{"/v1/acquire", "/v1/try_acquire", "/v1/reserve"}
	grpcOps := []func(*agentpb.AcquireRequest) error{
		func(r *agentpb.AcquireRequest) error { _, err := c.Acquire(ctx, r); return err },
		func(r *agentpb.AcquireRequest) error { _, err := c.TryAcquire(ctx, r); return err },
		func(r *agentpb.AcquireRequest) error { _, err := c.Reserve(ctx, r); return err },
	}
	// round makes every call of class once over each transport, and
	// reports what was refused.
	round := func(class string, wantAdmitted bool) {
		t.Helper()
		for i, path := range paths {
			a := s.post(t, path, `{"provider":"api","class":"`+class+`"}`)
			switch {
			case wantAdmitted && a.Status != 200:
				t.Errorf("HTTP %s class %s: %+v, want admitted", path, class, a)
			case !wantAdmitted && (a.Status != 429 || a.Error != ReasonTimeout):
				t.Errorf("HTTP %s class %s: %+v, want 429 TIMEOUT", path, class, a)
			}
			err := grpcOps[i](&agentpb.AcquireRequest{Provider: "api", Class: class})
			code, reason := reasonOf(err)
			switch {
			case wantAdmitted && err != nil:
				t.Errorf("gRPC %s class %s: %v, want admitted", path, class, err)
			case !wantAdmitted && (code != codes.ResourceExhausted || reason != ReasonTimeout):
				t.Errorf("gRPC %s class %s: %v, want ResourceExhausted TIMEOUT", path, class, err)
			}
		}
	}
	round("batch", true)     // 6 of the 6 beyond critical's reserve
	round("batch", false)    // the rest is critical's
	round("nonesuch", false) // a class not listed is the default, the last: batch
	round("critical", true)  // critical's 6
	round("critical", false) // the window is spent
	st := s.providers["api"].multi.Limiter(0).Stats()
	if st.Admitted != 12 || len(st.Classes) != 2 || st.Classes[0].Admitted != 6 || st.Classes[1].Admitted != 6 || st.Classes[1].Refused != 12 {
		t.Errorf("stats %+v: want 6 admitted of each class, 12 of batch refused", st)
	}
}
