package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"
)

// Lines writes whole lines to a writer (an instance's stdout, read by the
// report program), one at a time from any goroutine.
type Lines struct {
	mu sync.Mutex
	w  *bufio.Writer
}

// NewLines returns Lines writing to w.
func NewLines(w io.Writer) *Lines { return &Lines{w: bufio.NewWriter(w)} }

// Printf writes one line (a newline is added) and flushes it.
func (o *Lines) Printf(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(o.w, format+"\n", args...)
	o.w.Flush()
}

// AppliedHandler is a slog.Handler for a cluster.Member's logger: it turns
// the Member's "share applied" records into lines on out,
//
//	applied id=ID t=T gen=G share=S from=F source=SRC window=W in_force=I
//
// times in Unix nanoseconds (T: when the share was handed to the limiter;
// F: when it takes effect), and passes its other warnings and errors to
// stderr. The Member has no event API, so its log is the event source.
type AppliedHandler struct {
	Out   *Lines
	attrs []slog.Attr
}

// Enabled reports whether l is Info or above.
func (h *AppliedHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

// Handle writes an applied line, or a warning to stderr.
func (h *AppliedHandler) Handle(_ context.Context, r slog.Record) error {
	vals := map[string]string{}
	for _, a := range h.attrs {
		vals[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		vals[a.Key] = a.Value.String()
		return true
	})
	if r.Message != "share applied" {
		if r.Level >= slog.LevelWarn {
			fmt.Fprintf(os.Stderr, "instance %s: %s %v\n", vals["instance"], r.Message, vals)
		}
		return nil
	}
	from, err := time.Parse(time.RFC3339Nano, vals["from"])
	if err != nil {
		return err
	}
	inForce, err := time.Parse(time.RFC3339Nano, vals["in_force"])
	if err != nil {
		inForce = from // a member from before the attribute
	}
	h.Out.Printf("applied id=%s t=%d gen=%s share=%s from=%d source=%s window=%s in_force=%d",
		vals["instance"], r.Time.UnixNano(), vals["generation"], vals["share"], from.UnixNano(), vals["source"],
		vals["window"], inForce.UnixNano())
	return nil
}

// WithAttrs returns a handler that adds as to every record.
func (h *AppliedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &AppliedHandler{Out: h.Out, attrs: append(slices.Clone(h.attrs), as...)}
}

// WithGroup returns h: groups are not used.
func (h *AppliedHandler) WithGroup(string) slog.Handler { return h }
