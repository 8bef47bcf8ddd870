package main

// The README's picture of configd's console, taken from a running demo
// (`make screenshot`, or -screenshot FILE): headless Chromium, driven over
// the Chrome DevTools protocol as the console's browser test drives it,
// watches the console from the scenario's start and, at its end, when the
// chart holds the whole run, saves what a window 1,280 px wide shows.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/chromedp/chromedp"
)

// Size of the window the picture shows.
const shotWidth, shotHeight = 1280, 1000

// chromiumPath returns the browser to drive: $SLUICE_CHROMIUM, or the
// first of the usual names on $PATH (make chromium installs Debian's).
func chromiumPath() (string, error) {
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("-screenshot needs Chromium: none of chromium, chromium-browser, google-chrome is on $PATH, and $SLUICE_CHROMIUM is not set (make chromium installs Debian's as root)")
}

// Errors of the browser are formatted with %v, not wrapped: one that is
// context.Canceled must not pass for the operator's Ctrl-C.

// shooter is a headless Chromium tab on the console of the demo's
// provider. It opens when the scenario starts, because the console charts
// only what its feed watched: a tab opened at the end would show an empty
// chart.
type shooter struct {
	ctx   context.Context // the tab's
	close func()
}

// openConsole starts Chromium on the console; close the shooter when done.
func (d *demo) openConsole(ctx context.Context) (*shooter, error) {
	browser, err := chromiumPath()
	if err != nil {
		return nil, err
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.WindowSize(shotWidth, shotHeight),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	// Cancelling the allocator's context ends the browser process and
	// waits for it to exit.
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	tctx, cancelTab := chromedp.NewContext(actx)
	sh := &shooter{ctx: tctx, close: func() { cancelTab(); cancelAlloc() }}
	// The first action on a context starts the browser, which lives as
	// long as that context: it must be the tab's own, with no deadline.
	if err := chromedp.Do(tctx, chromedp.Func(func(context.Context, *chromedp.Target) error { return nil })); err != nil {
		sh.close()
		return nil, fmt.Errorf("screenshot: starting Chromium: %v", err)
	}
	url := fmt.Sprintf("%s/console/#p=%s", d.adminURL, provider)
	octx, cancel := context.WithTimeout(tctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(octx, chromedp.EmulateViewport(shotWidth, shotHeight), chromedp.Navigate(url)); err != nil {
		sh.close()
		return nil, fmt.Errorf("screenshot: opening %s: %v", url, err)
	}
	d.out.linef("headless Chromium watches the console, %d px wide, for -screenshot", shotWidth)
	return sh, nil
}

// take saves what the tab shows to file, once the console lists the
// instances and its chart draws bars and the limit.
func (sh *shooter) take(d *demo, file string) error {
	ctx, cancel := context.WithTimeout(sh.ctx, 60*time.Second)
	defer cancel()
	const ready = `document.querySelectorAll('#instances tbody tr').length > 0 &&
		document.querySelector('#chart rect[data-admitted]') !== null &&
		document.querySelector('#chart path[data-line="limit"]') !== null`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](ready)); err != nil {
		return fmt.Errorf("screenshot: waiting for the console to show the instances and the chart: %v", err)
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		return fmt.Errorf("screenshot: %v", err)
	}
	if err := os.WriteFile(file, png, 0o644); err != nil {
		return err
	}
	d.out.linef("saved the console as it is now (%d×%d) to %s", shotWidth, shotHeight, file)
	return nil
}
