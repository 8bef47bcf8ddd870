package main

// The console in a real browser: headless Chromium, driven over the Chrome
// DevTools protocol, loads the console of a real `configd serve` (embedded
// etcd, real cluster.Members) and checks what a person would see. Every
// wait is on a condition of the page (chromedp.Poll), never on time.
//
// Chromium comes from the distribution's packages (Debian: chromium);
// make test installs it when run as root. Where none is found the test
// skips, saying so, unless $CI is set: in CI it must run.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// chromiumPath returns the browser to drive: $SLUICE_CHROMIUM, or the
// first of the usual names on $PATH.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium found, and $CI is set: the console's browser test must run in CI " +
			"(make test installs Debian's chromium when run as root; or set $SLUICE_CHROMIUM)")
	}
	t.Skip("SKIPPED: no Chromium found (chromium, chromium-browser, google-chrome, $SLUICE_CHROMIUM): " +
		"the console's browser test did not run. Install it (Debian: apt-get install chromium) or run make test as root")
	return ""
}

// browser is one headless Chromium tab, with what the test watches of it:
// what the page wrote to its console (exceptions, errors, warnings; a CSP
// violation is one) and every URL it requested.
type browser struct {
	t   *testing.T
	ctx context.Context // the tab's: no deadline (it would end the browser)

	mu       sync.Mutex
	problems []string
	urls     []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.WindowSize(1500, 1100),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	b := &browser{t: t, ctx: ctx}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser process to exit
		wg.Wait()     // the console reader ends with the tab
	})
	if err := chromedp.Do(ctx, chromedp.Func(func(context.Context, *chromedp.Target) error { return nil })); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	if err := chromedp.Listen(ctx, func(ev any) {
		if ev, ok := ev.(*network.EventRequestWillBeSent); ok {
			b.mu.Lock()
			b.urls = append(b.urls, ev.Request.URL+ev.Request.URLFragment)
			b.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			switch m.Type {
			case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
				b.mu.Lock()
				b.problems = append(b.problems, string(m.Type)+": "+m.Text+" ("+m.URL+")")
				b.mu.Unlock()
			}
		}
	})
	return b
}

// do runs actions, failing the test with what and the page's text. Each
// call is bounded so that a hung browser fails the test instead of
// hanging it; no assertion depends on the bound.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 2*itTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\npage text:\n%s", what, err, b.pageText())
	}
}

func (b *browser) pageText() string {
	ctx, cancel := context.WithTimeout(b.ctx, itTimeout)
	defer cancel()
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ''`))
	return s
}

// until waits until the JavaScript expression is true on the page.
func (b *browser) until(what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 2*itTimeout)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(itTimeout))); err != nil {
		b.t.Fatalf("waiting for %s: %v\npage text:\n%s", what, err, b.pageText())
	}
}

// eval returns the value of a JavaScript expression on the page.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, itTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// screenshot saves the whole page as name under the test's artifact
// directory (go test -artifacts keeps it).
func (b *browser) screenshot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, itTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(b.t.ArtifactDir(), name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", p)
}

// typeInto replaces the value of the input sel as a person would type it.
func typeInto(sel, value string) chromedp.Action[chromedp.Void] {
	clear := chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = ''; e.focus(); return true })()`, sel))
	return chromedp.Steps(
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error { _, err := clear(ctx, t); return err }),
		chromedp.SendKeys(chromedp.CSS(sel), value))
}

// click clicks the element from the page's script. A mouse click at the
// element's centre can miss it: the live tables above it grow and shrink
// between the moment chromedp measures the element and the moment it clicks.
func click(sel string) chromedp.Action[chromedp.Void] {
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return 'no element'; if (e.disabled) return 'disabled'; e.click(); return '' })()`, sel)
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		why, err := chromedp.Evaluate[string](js)(ctx, t)
		if err == nil && why != "" {
			err = fmt.Errorf("clicking %s: %s", sel, why)
		}
		return err
	})
}

func (b *browser) checkClean() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		if strings.Contains(p, "status of 403 (Forbidden)") && strings.HasSuffix(p, "/v1/providers/api)") {
			continue // the wrong token's refusal, which the test asked for
		}
		b.t.Errorf("the page reported: %s", p)
	}
	for _, u := range b.urls {
		if strings.Contains(u, consoleTestToken) {
			b.t.Errorf("the admin token appeared in a URL: %s", u)
		}
	}
}

// shareIs is a page condition: instance id's share cell reads want.
func shareIs(id string, want int64) string {
	return fmt.Sprintf(`(() => { const c = document.querySelector('#instances tr[data-instance=%q] td[data-col="share"]'); return !!c && c.textContent === %q })()`,
		id, fmt.Sprint(want))
}

// TestConsoleBrowser: a person opens the console of a configd with an
// admin token, sees each instance's share, sees it change on screen after
// configd set (pushed, no reload), changes the limit from the console
// itself (preview old → new, then apply with the token typed into the
// form; a wrong or missing token changes nothing), and sees the change
// in the history. Text from etcd records is shown as text, never run; the
// token never appears in a URL; the page raises no error and no CSP
// violation. A replica without a token shows the same console read-only.
const consoleTestToken = "console-browser-token-0123456789"

func TestConsoleBrowser(t *testing.T) {
	const token = consoleTestToken
	b := newBrowser(t) // first: a skip costs nothing else
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	tokenFile := writeFile(t, "token", token)
	r := itServe(t, srv, "solo", "--admin-token-file", tokenFile)
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server, auth := "--server="+r.url(), "--token-file="+tokenFile

	itCLI(t, "set", "api", "--coordination", "shares", "--limit", "400", "--window", itWindow.String(), "--who", "alice", server, auth)
	members := itJoin(t, srv, "api", "a", "b")
	itSettle(t, cli, "api", "200 each", func(sh schema.Shares) bool { return sh.Shares["a"] == 200 && sh.Shares["b"] == 200 }, members...)

	// A record whose text is markup: the page must show it, not run it.
	const hostile = `<img src=x onerror="document.title='pwned'"><b>bold</b>`
	itCLI(t, "set", "evil", "--coordination", "shares", "--limit", "10", server, auth)
	forgeInstance(t, cli, "evil", "x1", hostile, nil)

	b.do("opening the console", chromedp.Navigate(r.url()+"/console/#p=api"))
	b.until("both instances at 200", shareIs("a", 200)+" && "+shareIs("b", 200))
	if got := eval[string](b, `document.querySelector('#config').textContent`); !strings.Contains(got, "limit 400 per 100ms") {
		t.Errorf("config line %q, want it to say limit 400 per 100ms", got)
	}
	b.until("the provider list", `document.querySelector('#providers tr[data-provider="api"]') !== null`)
	b.until("the chart to draw a limit line", `document.querySelector('#chart path[data-line="limit"]') !== null`)
	b.screenshot("console-api.png")

	// A provider of several limits shows every one.
	itCLI(t, "set", "llm", "--coordination", "shares", "--limit", "40/1s", "--limit", "tokens=2000/1m", server, auth)
	b.do("opening llm", chromedp.Navigate(r.url()+"/console/#p=llm"))
	b.until("llm's config line", `document.querySelector('#config').textContent.includes('tokens=2000/1m')`)
	if got := eval[string](b, `document.querySelector('#config').textContent`); !strings.Contains(got, "limit 40 per 1s and tokens=2000/1m") {
		t.Errorf("config line %q, want it to say limit 40 per 1s and tokens=2000/1m", got)
	}
	b.until("llm's further limit in the provider list", `(document.querySelector('#providers tr[data-provider="llm"]') || {textContent: ''}).textContent.includes('tokens=2000/1m')`)
	// The layout holds at 1,280 px and on a narrow window, with a long
	// name and several limits in the providers pane, and a clock offset
	// reads in milliseconds.
	itCLI(t, "set", longName, "--coordination", "shares", "--limit", "1000/1s", "--limit", "tokens=200000/1m", "--limit", "50000/24h", server, auth)
	forgeInstance(t, cli, longName, "c1", "host-1", func(rec *schema.InstanceRecord) {
		rec.ClockKnown = true
		rec.ClockOffset = schema.Duration(203699 * time.Nanosecond)
		rec.ClockUncertainty = schema.Duration(5222128 * time.Nanosecond)
	})
	b.do("opening the long-named provider", chromedp.Navigate(r.url()+"/console/#p="+longName))
	b.until("its clock offset in milliseconds", `(document.querySelector('#instances tr[data-instance="c1"] td[data-col="clock"]') || {textContent: ''}).textContent === '+0.2 ms ± 5.2 ms'`)
	b.until("its further limits in the provider list", `(document.querySelector('#providers tr[data-provider="`+longName+`"]') || {textContent: ''}).textContent.includes('50000/24h')`)
	for _, size := range []struct {
		w, h int64
		side bool // the panes side by side
	}{{1280, 900, true}, {700, 900, false}} {
		b.do(fmt.Sprintf("a window %d px wide", size.w), chromedp.EmulateViewport(size.w, size.h))
		b.until("the new layout", fmt.Sprintf(`window.innerWidth === %d`, size.w))
		if bad := eval[[]string](b, layoutProblems); len(bad) > 0 {
			t.Errorf("at %d px wide:\n%s", size.w, strings.Join(bad, "\n"))
		}
		if size.side {
			if wide := eval[[]string](b, `[...document.querySelectorAll('#panel .scroll')].filter(e => e.scrollWidth > e.clientWidth).map(e => e.firstElementChild.id + ': ' + e.scrollWidth + ' px in ' + e.clientWidth)`); len(wide) > 0 {
				t.Errorf("at %d px wide: tables of the provider's pane are wider than it (they scroll): %s", size.w, strings.Join(wide, "; "))
			}
		}
		if side := eval[bool](b, `document.querySelector('nav').getBoundingClientRect().right <= document.querySelector('#panel').getBoundingClientRect().left`); side != size.side {
			t.Errorf("at %d px wide: the panes side by side: %v, want %v", size.w, side, size.side)
		}
		b.screenshot(fmt.Sprintf("console-%dpx.png", size.w))
	}
	b.do("the first window size again", chromedp.EmulateReset())

	b.do("back to api", chromedp.Navigate(r.url()+"/console/#p=api"))
	b.until("both instances at 200 again", shareIs("a", 200)+" && "+shareIs("b", 200))
	// Every bar of the chart is a count or says it is an estimate.
	b.until("a bar of admissions", `document.querySelector('#chart rect[data-admitted]') !== null`)
	if bad := eval[int](b, `[...document.querySelectorAll('#chart rect[data-admitted]')].filter(r => !['true', 'false'].includes(r.dataset.estimated) || (r.dataset.estimated === 'true') !== (r.getAttribute('fill') === 'url(#hatch)')).length`); bad > 0 {
		t.Errorf("%d bars of the chart do not say whether they are counts or estimates", bad)
	}

	// configd set: the new shares appear on screen without a reload.
	itCLI(t, "set", "api", "--limit", "600", "--who", "bob", server, auth)
	b.until("the shares of limit 600 on screen", shareIs("a", 300)+" && "+shareIs("b", 300))
	b.until("bob's change in the history", `[...document.querySelectorAll('#history td[data-col="change"]')].some(td => td.textContent === 'limit 400 → 600')`)

	// A change from the console: preview, then apply — not without the
	// token, not with a wrong one.
	b.do("editing the limit", typeInto("#limit", "800"), click("#preview-btn"))
	b.until("the preview", `document.querySelector('#preview').textContent.includes('limit 600 → 800')`)
	b.screenshot("console-preview.png")
	b.do("apply without a token", click("#apply"))
	b.until("the refusal", `document.querySelector('#result').textContent.startsWith('Type the admin token')`)
	b.do("apply with a wrong token", typeInto("#token", "not-the-token"), click("#apply"))
	b.until("the 403", `document.querySelector('#result').textContent.startsWith('not applied (403)')`)
	if out := itCLI(t, "get", "api", server); !strings.Contains(out, "600") {
		t.Fatalf("a refused change was written: configd get says %q", out)
	}
	b.do("preview again", click("#preview-btn"))
	b.until("the preview", `document.querySelector('#preview').textContent.includes('limit 600 → 800') && !document.querySelector('#apply').disabled`)
	b.do("apply with the token", typeInto("#token", token), click("#apply"))
	b.until("the result", `document.querySelector('#result').textContent.startsWith('api: limit 600 → 800')`)
	b.until("the shares of limit 800 on screen", shareIs("a", 400)+" && "+shareIs("b", 400))
	b.until("the console's change in the history", `(() => { const r = document.querySelector('#history tbody tr'); return !!r && r.textContent.includes('console') && r.textContent.includes('limit 600 → 800') })()`)
	b.screenshot("console-applied.png")
	itSettle(t, cli, "api", "the console's limit applied", func(sh schema.Shares) bool { return sh.Total == 800 }, members...)

	// Hostile text from etcd is text.
	b.do("opening the hostile provider", chromedp.Navigate(r.url()+"/console/#p=evil"))
	b.until("the hostile instance's row", `(() => { const c = document.querySelector('#instances tr[data-instance="x1"] td[data-col="host"]'); return !!c && c.textContent === `+jsString(hostile)+` })()`)
	injected := eval[bool](b, `document.querySelector('#instances img, #instances b') !== null`)
	title := eval[string](b, `document.title`)
	if injected || title == "pwned" {
		t.Errorf("markup from an instance record became part of the page (element found %v, title %q)", injected, title)
	}

	// A replica without a token: the same console, read-only.
	r2 := itServe(t, srv, "standby")
	b.do("opening the standby's console", chromedp.Navigate(r2.url()+"/console/#p=api"))
	b.until("the read-only note, and no form shown", `!document.querySelector('#readonly').hidden && document.querySelector('#edit').hidden && getComputedStyle(document.querySelector('#edit')).display === 'none'`)
	b.until("the standby's instances", shareIs("a", 400))

	b.checkClean()
}

// longName is a provider name long enough to wrap in the providers pane.
const longName = "payments-gateway-europe-west-checkout-settlements-v2"

// layoutProblems is a page expression: what of the layout does not hold.
// Nothing in the providers pane is wider than it, the panes do not
// overlap, nothing of the provider's pane is wider than it, and the page
// does not scroll sideways (a table too wide for a narrow window scrolls in
// its own box).
const layoutProblems = `(() => {
  const out = [];
  const box = (e) => e.getBoundingClientRect();
  const nav = box(document.querySelector('nav')), panel = box(document.querySelector('#panel'));
  const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' "' + e.textContent.trim().slice(0, 40) + '"';
  if (nav.right > panel.left + 0.5 && panel.right > nav.left + 0.5 && nav.bottom > panel.top + 0.5 && panel.bottom > nav.top + 0.5)
    out.push('the providers pane overlaps the provider\'s');
  for (const e of document.querySelectorAll('nav *')) {
    const r = box(e);
    if (r.width > 0 && (r.right > nav.right + 0.5 || r.left < nav.left - 0.5)) out.push(name(e) + ' spills out of the providers pane');
  }
  for (const e of document.querySelectorAll('#panel > *, #panel .scroll')) {
    const r = box(e);
    if (r.width > 0 && r.right > panel.right + 0.5) out.push(name(e) + ' spills out of the provider\'s pane');
  }
  if (document.documentElement.scrollWidth > window.innerWidth) out.push('the page scrolls sideways: ' + document.documentElement.scrollWidth + ' px');
  return out;
})()`

// forgeInstance writes an instance record of provider under a lease of
// its own, as a member would, with the given host; edit, if not nil,
// changes the record first.
func forgeInstance(t *testing.T, cli *clientv3.Client, provider, id, host string, edit func(*schema.InstanceRecord)) {
	t.Helper()
	ctx := ctxT(t)
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := schema.InstanceRecord{Version: schema.Version, ID: id, Host: host, Started: now, Updated: now, Demand: 5}
	if edit != nil {
		edit(&rec)
	}
	v, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := schema.DecodeInstanceRecord(v); err != nil {
		t.Fatalf("the forged record does not decode: %v", err)
	}
	if _, err := cli.Put(ctx, itKeys.Instance(provider, id), string(v), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestConsoleBrowserAdaptive: the console of an adaptive provider draws
// its ceiling above the effective limit, says both and why the limit last
// moved, and shows the controller's move in the history. The instance's
// record is written as a member pushed back by its provider would write
// it, and configd's own controller lowers the limit.
func TestConsoleBrowserAdaptive(t *testing.T) {
	b := newBrowser(t) // first: a skip costs nothing else
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	tokenFile := writeFile(t, "token", consoleTestToken)
	r := itServe(t, srv, "solo", "--admin-token-file", tokenFile)
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	itCLI(t, "set", "llm", "--limit", "1000/1s", "--adaptive", "floor=100", "--server="+r.url(), "--token-file="+tokenFile)

	b.do("opening the console", chromedp.Navigate(r.url()+"/console/#p=llm"))
	b.until("the ceiling line", `document.querySelector('#chart path[data-line="ceiling"]') !== null`)
	b.until("the adaptive note", `document.querySelector('#adaptive').textContent.startsWith('Adaptive: effective limit 1000 of the ceiling 1000 (floor 100)')`)

	// The provider pushes back: the instance's count grows until a round
	// of the controller reads it.
	var pushbacks int64
	started := time.Now().UTC()
	polls := 0
	itWait(t, "the controller to lower the limit", func() (bool, string) {
		if polls++; polls%20 == 1 {
			pushbacks += 42
			forgeInstance(t, cli, "llm", "a", "host-a", func(rec *schema.InstanceRecord) {
				rec.Started, rec.Pushbacks, rec.Enforced, rec.Demand = started, pushbacks, 1000, 1000
			})
		}
		return lowered(t, cli, "llm")
	})
	b.until("the effective limit against the ceiling", `/^Adaptive: effective limit \d+ of the ceiling 1000 \(floor 100\) · last move: /.test(document.querySelector('#adaptive').textContent)`)
	b.until("the controller's move in the history", `[...document.querySelectorAll('#history tr')].some(r => r.textContent.includes('configd adaptive') && r.textContent.includes('limit 1000 → 500'))`)
	// Some bucket's limit lies below the ceiling (a greater y on screen).
	b.until("a lowered effective limit under the ceiling in the chart", `(() => {
	  const ys = (key) => { const p = document.querySelector('#chart path[data-line="' + key + '"]');
	    return p ? p.getAttribute('d').match(/,[0-9.]+/g).map(s => +s.slice(1)) : []; };
	  const lim = ys('limit'), ceil = ys('ceiling');
	  return lim.length > 0 && ceil.length > 0 && Math.max(...lim) > Math.max(...ceil);
	})()`)
	if hidden := eval[bool](b, `document.querySelector('#legend-ceiling').hidden`); hidden {
		t.Error("the chart draws a ceiling its legend does not name")
	}
	if got := eval[string](b, `document.querySelector('#legend-limit').textContent`); got != "effective limit" {
		t.Errorf("the legend calls the limit line %q, want effective limit", got)
	}
	b.screenshot("console-adaptive.png")
	b.checkClean()
}

// lowered reports whether configd's controller has lowered provider's
// limit, by its history.
func lowered(t *testing.T, cli *clientv3.Client, provider string) (bool, string) {
	t.Helper()
	resp, err := cli.Get(ctxT(t), itKeys.History(provider), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		h, err := schema.DecodeHistoryEntry(kv.Value)
		if err == nil && h.Who == adaptWho && h.Old != nil && h.New != nil && h.New.Limit < h.Old.Limit {
			return true, ""
		}
	}
	return false, fmt.Sprintf("%d history entries, none a lowering by %s", len(resp.Kvs), adaptWho)
}

// TestConsoleBrowserClasses: the console of a provider with priority
// classes shows each class's admissions per window, summed over the
// instances from the running totals by class in their records, against
// the class's reserve: a count where every instance's records fall on the
// window's edges, an estimate marked as one (with the bounds the records
// allow) where one straddles them. The records are written as members
// would write them, with totals chosen here, so that the figures on screen
// are checked against what each instance admitted of each class.
func TestConsoleBrowserClasses(t *testing.T) {
	b := newBrowser(t) // first: a skip costs nothing else
	was := feedRefresh
	t.Cleanup(func() { feedRefresh = was }) // after the server's cleanup, which stops its feeds
	feedRefresh = 200 * time.Millisecond
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	tokenFile := writeFile(t, "token", consoleTestToken)
	r := itServe(t, srv, "solo", "--admin-token-file", tokenFile)
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	const window = 500 * time.Millisecond
	// Created on the ledger for its reserve: configd writes nothing under
	// the provider for instances that hold nothing, so the console reads
	// it on its refresh alone, which must come within the table's windows.
	itCLI(t, "set", "api", "--limit", "400/500ms", "--class", "critical=60%", "--class", "batch", "--server="+r.url(), "--token-file="+tokenFile)

	b.do("opening the console", chromedp.Navigate(r.url()+"/console/#p=api"))
	b.until("the classes, in the config's order", `[...document.querySelectorAll('#classes tbody tr')].map(r => r.dataset.class).join() === 'critical,batch' && !document.querySelector('#classes-box').hidden`)
	if got := eval[string](b, `document.querySelector('#classes tr[data-class="critical"] td[data-col="reserve"]').textContent`); got != "240" {
		t.Errorf("critical's reserve reads %q, want 240 (60%% of 400)", got)
	}

	// The console watches the provider now: a window that starts after
	// this is charted. Instances x1 and x2 report at both its edges; x3's
	// records straddle its end.
	w0 := time.Now().Truncate(window).Add(window)
	type totals map[string]int64
	for _, in := range []struct {
		id      string
		updated time.Time
		classes totals
	}{
		{"x1", w0.Add(window), totals{"critical": 150, "batch": 60}},
		{"x2", w0.Add(window), totals{"critical": 90, "batch": 40}},
		{"x3", w0.Add(2 * window), totals{"critical": 50}},
	} {
		forgeInstance(t, cli, "api", in.id, "host-"+in.id, func(rec *schema.InstanceRecord) {
			rec.Started, rec.Updated, rec.ClassAdmitted = w0.UTC(), in.updated.UTC(), in.classes
			for _, n := range in.classes {
				rec.Admitted += n
			}
		})
	}
	// critical: 150 + 90 counted, and x3's 50 over two windows, half of
	// it spread into this one: about 265, between 240 and 290. batch: 100,
	// counted.
	cell := func(class string) string {
		return fmt.Sprintf(`document.querySelector('#classes tr[data-class=%q] td[data-start=%q]')`, class, w0.UTC().Format(time.RFC3339Nano))
	}
	b.until("the window's admissions by class", `(() => { const c = `+cell("critical")+`, d = `+cell("batch")+`; return !!c && !!d && c.dataset.admitted !== undefined && d.dataset.admitted !== undefined })()`)
	for _, tc := range []struct {
		class, text, admitted, estimated, reserve, title string
	}{
		{"critical", "≈265", "265.0", "true", "240.0", "about 265 admitted of its reserve 240, an estimate: the records allow 240 to 290"},
		{"batch", "100", "100.0", "false", "0.0", "100 admitted of its reserve 0, counted"},
	} {
		got := eval[[]string](b, `(() => { const c = `+cell(tc.class)+`; return [c.textContent, c.dataset.admitted, c.dataset.estimated, c.dataset.reserve, c.title] })()`)
		if len(got) != 5 || got[0] != tc.text || got[1] != tc.admitted || got[2] != tc.estimated || got[3] != tc.reserve || !strings.HasSuffix(got[4], tc.title) {
			t.Errorf("%s in the window from %s: the page shows %q, want text %q, admitted %s, estimated %s, reserve %s, and a title ending %q",
				tc.class, w0.UTC().Format("15:04:05.000"), got, tc.text, tc.admitted, tc.estimated, tc.reserve, tc.title)
		}
	}
	if n := eval[int](b, `document.querySelectorAll('#classes img, #classes b, #classes script').length`); n > 0 {
		t.Errorf("the classes table holds %d elements of markup", n)
	}
	b.screenshot("console-classes.png")

	// Without classes, the table goes.
	itCLI(t, "set", "api", "--no-classes", "--server="+r.url(), "--token-file="+tokenFile)
	b.until("no classes table", `document.querySelector('#classes-box').hidden`)
	b.checkClean()
}
