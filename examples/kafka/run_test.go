package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestRunSettlesTokens: the example with a tokens limit consumes a
// backlog through a Multi, each message taking its estimated tokens and
// settling what the stub says it used, on an in-process broker. Every
// message is handled, the stub never refuses (neither limit went over in
// any window it saw), and settling gave tokens back.
func TestRunSettlesTokens(t *testing.T) {
	cfg, err := parseFlags([]string{"-messages", "600", "-limit", "300", "-window", "100ms", "-tokens-limit", "9000", "-duration", "60s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), cfg, &out, io.Discard); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	if !strings.Contains(s, "handled 600/600") || !strings.Contains(s, "the provider stub never saw more than its limit in any window") {
		t.Fatalf("not every message handled within the stub's limits:\n%s", s)
	}
	m := regexp.MustCompile(`done tokens: quota 9000 per 100ms  busiest window (\d+) \(stub limit 9000\)  (\d+) given back by settling  provider refusals 0`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no tokens summary:\n%s", s)
	}
	busiest, _ := strconv.Atoi(m[1])
	back, _ := strconv.Atoi(m[2])
	if busiest > 9000 || busiest == 0 || back == 0 {
		t.Errorf("busiest tokens window %d, %d given back: want 1..9000 and some given back\n%s", busiest, back, s)
	}
}

// TestTokensFlags: a tokens limit is local (-tokens-limit without etcd)
// or a provider's (-tokens-provider, with etcd); bad combinations are
// refused saying why.
func TestTokensFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-tokens-limit", "-5"}, "-tokens-limit -5"},
		{[]string{"-tokens-provider", "llm-tokens"}, "-tokens-provider needs -etcd-endpoints"},
		{[]string{"-tokens-fallback", "100", "-etcd-endpoints", "http://127.0.0.1:2379"}, "-tokens-fallback is the fallback of -tokens-provider's share"},
	} {
		if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}
