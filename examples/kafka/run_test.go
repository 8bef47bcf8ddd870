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
// settling what the stub says it used, on an in-process broker: every
// message is handled, settling gives tokens back, and the tokens limit,
// not the requests one, bounds the rate (at about 110 tokens a message,
// 9,000 tokens a window admit well under the 300 requests). Whether the
// stub, which counts a call in the window it arrives in, ever refused one
// depends on how late calls granted at a window's end arrive on a loaded
// machine (the HTTP example's -transit is the cure), so it is not
// asserted here; bench/multi measures it.
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
	if !strings.Contains(s, "handled 600/600") {
		t.Fatalf("not every message handled:\n%s", s)
	}
	calls := regexp.MustCompile(`done .* busiest window (\d+) \(stub limit 300\)`).FindStringSubmatch(s)
	tokens := regexp.MustCompile(`done tokens: quota 9000 per 100ms  busiest window (\d+) \(stub limit 9000\)  (\d+) given back by settling`).FindStringSubmatch(s)
	if calls == nil || tokens == nil {
		t.Fatalf("no summary of calls and tokens:\n%s", s)
	}
	busiestCalls, _ := strconv.Atoi(calls[1])
	back, _ := strconv.Atoi(tokens[2])
	if back == 0 || busiestCalls == 0 || busiestCalls >= 300 {
		t.Errorf("%d tokens given back, busiest window %d calls: want some given back, and fewer calls than the requests limit of 300 in any window\n%s", back, busiestCalls, s)
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
