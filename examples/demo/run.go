package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/examples/loadgen"
	"github.com/sluice-go/sluice/internal/child"
	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/ntptest"
	"github.com/sluice-go/sluice/internal/stub"
)

const (
	provider = "demo-api"
	window   = time.Second
	leaseTTL = 3 * time.Second // instances' lease: a SIGKILLed one is counted this long
	// failStatic is the provider's fail_static: a crashed instance's
	// grants end at most this long after its lease expires, and configd
	// hands its room to the others then (shorter than the 10s default, so
	// the demo shows the hand-back).
	failStatic = 3 * time.Second
	skewAfter  = 400 * time.Millisecond
)

// instance is one instance process, as the demo knows it.
type instance struct {
	id, kind   string // kind: load, kafka, http
	p          *child.Proc
	metricsURL string
	driver     *loadgen.Generator // the load loop driving the HTTP handler (kind http)
	stopDriver context.CancelFunc
	rate       int
	gone       string // "", "killed", "stopped"
	note       string

	m        metrics // last scrape
	admitted float64 // admitted counter at the last view
	offered  float64
	refused  float64
	rates    [3]float64 // per second since the last view: offered, admitted, refused
}

// demo is the running demo's state.
type demo struct {
	cfg  config
	out  *printer
	tmp  string
	bins struct{ configd, instance, httphandler string }

	etcdURL  string
	cli      *clientv3.Client
	ntp      *ntptest.Server
	stub     *stub.Stub
	stubURL  string
	configd  *child.Proc
	adminURL string
	client   *http.Client

	mu       sync.Mutex
	insts    []*instance   // in start order, gone ones included
	ledger   *ledger.State // the provider's ledger, as last read
	events   []*event
	started  []*child.Proc // every child, to check none is left
	stopFns  []func()      // in-process servers, stopped last, in reverse
	maxShare int64         // the largest grant seen in the ledger for one window
}

func run(ctx context.Context, cfg config, stdout io.Writer, tty bool) error {
	d := &demo{cfg: cfg, out: &printer{w: stdout, tty: tty}, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	defer d.client.CloseIdleConnections()
	var err error
	d.tmp, err = os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return err
	}
	if cfg.keep {
		defer fmt.Fprintf(stdout, "kept %s (the log of every process is there)\n", d.tmp)
	} else {
		defer os.RemoveAll(d.tmp)
	}
	defer d.stopAll()
	if err := d.setup(ctx); err != nil {
		return err
	}
	err = d.scenario(ctx)
	d.stopAll()
	d.summary()
	if errors.Is(err, context.Canceled) {
		d.out.linef("interrupted: everything is stopped")
		return nil
	}
	return err
}

// setup builds the binaries and starts etcd, the SNTP responder, the
// provider stub and configd, and sets the provider's config.
func (d *demo) setup(ctx context.Context) error {
	o := d.out
	o.linef("sluice demo: provider %q, limit %d calls per %v, %v of scenario", provider, d.cfg.limit, window, d.cfg.duration)
	if d.cfg.binDir == "" {
		t := time.Now()
		o.linef("building configd, examples/demo/instance and examples/httphandler into %s ...", d.tmp)
		bins, err := harness.Build(d.tmp, "./configd", "./examples/demo/instance", "./examples/httphandler")
		if err != nil {
			return err
		}
		d.bins.configd, d.bins.instance, d.bins.httphandler = bins[0], bins[1], bins[2]
		o.linef("built in %v", time.Since(t).Round(100*time.Millisecond))
	} else {
		d.bins.configd = filepath.Join(d.cfg.binDir, "configd")
		d.bins.instance = filepath.Join(d.cfg.binDir, "instance")
		d.bins.httphandler = filepath.Join(d.cfg.binDir, "httphandler")
	}

	etcd, url, err := harness.StartEtcd("demo", filepath.Join(d.tmp, "etcd"))
	if err != nil {
		return err
	}
	d.etcdURL = url
	d.stopFns = append(d.stopFns, etcd.Close)
	d.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	o.linef("etcd: embedded in this process at %s", url)

	d.ntp, err = ntptest.Start()
	if err != nil {
		return err
	}
	// A root dispersion of 5ms: every instance's clock uncertainty is a few
	// milliseconds, kept as a guard band at each window boundary.
	d.ntp.SetRootDistance(0, 5*time.Millisecond)
	o.linef("SNTP responder (true time = this machine's clock) at %s; every instance measures its clock there every 2s", d.ntp.Addr())

	d.stub = stub.New(d.cfg.limit, window)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: d.stub, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	d.stopFns = append(d.stopFns, func() { srv.Close() })
	d.stubURL = "http://" + ln.Addr().String() + "/call"
	o.linef("provider stub at %s: %d calls per aligned %v, counted by arrival; a window over the limit is flagged", d.stubURL, d.cfg.limit, window)

	d.configd, err = d.startProc("configd", d.bins.configd, "serve", "--etcd-endpoints", url, "--listen", "127.0.0.1:0", "--replica-id", "demo", "--log-format", "text")
	if err != nil {
		return err
	}
	addr, err := d.configdAddr(ctx)
	if err != nil {
		return err
	}
	d.adminURL = "http://" + addr
	o.linef("console: %s/console/#p=%s   (open it in a browser: who holds what and why, live)", d.adminURL, provider)
	o.linef("configd serve: pid %d, admin API %s", d.configd.Pid(), d.adminURL)
	return d.configdCLI(ctx, "set", provider, "--limit", strconv.FormatInt(d.cfg.limit, 10), "--window", window.String(), "--algorithm", "fair",
		"--fail-static", failStatic.String())
}

// configdAddr reads configd's admin address from its log line
// `msg="configd serving" ... listen=ADDR`.
func (d *demo) configdAddr(ctx context.Context) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		b, _ := os.ReadFile(filepath.Join(d.tmp, "configd.log"))
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.Contains(l, `msg="configd serving"`) {
				continue
			}
			for _, f := range strings.Fields(l) {
				if a, ok := strings.CutPrefix(f, "listen="); ok {
					return a, nil
				}
			}
		}
		if d.configd.Exited() {
			return "", fmt.Errorf("configd exited: %v\n%s", d.configd.ExitErr(), b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	return "", errors.New("configd serve did not start within 30s (see configd.log with -keep)")
}

// configdCLI runs the configd CLI against the admin API, printing the
// command as an operator would type it, and its output.
func (d *demo) configdCLI(ctx context.Context, args ...string) error {
	args = append(args, "--server", d.adminURL, "--who", "demo")
	d.out.linef("$ configd %s", strings.Join(args, " "))
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	out, err := child.Command(cctx, d.bins.configd, args...).CombinedOutput()
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		d.out.linef("    %s", l)
	}
	if err != nil {
		return fmt.Errorf("configd %s: %w", args[0], err)
	}
	return nil
}

// startProc starts a child, logging its stderr to NAME.log in the temp dir,
// and remembers it.
func (d *demo) startProc(name, bin string, args ...string) (*child.Proc, error) {
	p, err := child.Start(name, filepath.Join(d.tmp, name+".log"), bin, args...)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.started = append(d.started, p)
	d.mu.Unlock()
	return p, nil
}

// startInstance starts an instance process of kind load, kafka or http and
// waits until it serves its metrics.
func (d *demo) startInstance(ctx context.Context, id, kind string, rate int, extra ...string) (*instance, error) {
	in := &instance{id: id, kind: kind, rate: rate}
	common := []string{"-etcd-endpoints", d.etcdURL, "-provider", provider, "-ntp-servers", d.ntp.Addr(), "-ntp-interval", "2s"}
	var err error
	switch kind {
	case "http":
		args := append([]string{"-listen", "127.0.0.1:0", "-downstream", d.stubURL, "-instance-id", id, "-budget", "100ms", "-call-time", "10ms"}, common...)
		in.p, err = d.startProc(id, d.bins.httphandler, append(args, extra...)...)
	default:
		args := append([]string{"-mode", kind, "-id", id, "-stub", d.stubURL, "-lease-ttl", leaseTTL.String()}, common...)
		in.p, err = d.startProc(id, d.bins.instance, append(args, extra...)...)
	}
	if err != nil {
		return nil, err
	}
	if kind == "http" {
		l, err := in.p.WaitLine(ctx, "listening on http://", 60*time.Second)
		if err != nil {
			return nil, err
		}
		base := strings.Fields(strings.TrimPrefix(l, "listening on "))[0]
		in.metricsURL = base + "metrics"
		dctx, cancel := context.WithCancel(ctx)
		in.stopDriver = cancel
		in.driver = loadgen.New(nil, func(ctx context.Context) error { return d.callHandler(ctx, base) }, loadgen.WithMaxInFlight(512))
		in.driver.SetRate(rate)
		go in.driver.Run(dctx)
	} else {
		l, err := in.p.WaitLine(ctx, "ready ", 60*time.Second)
		if err != nil {
			return nil, err
		}
		_, in.metricsURL, _ = strings.Cut(l, "metrics=")
		in.p.Send("rate %d", rate)
	}
	d.mu.Lock()
	d.insts = append(d.insts, in)
	d.mu.Unlock()
	d.out.linef("started %s (%s, pid %d), offering %d/s", id, kindName(kind), in.p.Pid(), rate)
	return in, nil
}

func kindName(kind string) string {
	switch kind {
	case "http":
		return "HTTP handler, 100ms budget"
	case "kafka":
		return "Kafka consumer, in-process broker"
	}
	return "load loop"
}

// callHandler is one request to the HTTP handler instance; its 503 (no
// permit within the budget) counts as refused.
func (d *demo) callHandler(ctx context.Context, base string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base, nil)
	if err != nil {
		return err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusServiceUnavailable:
		return loadgen.ErrRefused
	}
	return errors.New(resp.Status)
}

// setRate changes an instance's offered load.
func (d *demo) setRate(in *instance, rate int) {
	d.mu.Lock()
	in.rate = rate
	d.mu.Unlock()
	if in.driver != nil {
		in.driver.SetRate(rate)
		return
	}
	in.p.Send("rate %d", rate)
}

// stopInstance stops an instance: gracefully (kill false: SIGTERM, it
// leaves and its lease is revoked) or with SIGKILL.
func (d *demo) stopInstance(in *instance, kill bool) {
	if in.stopDriver != nil {
		in.stopDriver()
	}
	if kill {
		in.p.Kill()
	} else {
		in.p.Stop(5 * time.Second)
	}
	d.mu.Lock()
	in.gone = map[bool]string{true: "killed", false: "stopped"}[kill]
	d.mu.Unlock()
}

// stopAll stops every child (instances first, then configd) and the
// in-process servers. It is idempotent.
func (d *demo) stopAll() {
	d.mu.Lock()
	insts := append([]*instance(nil), d.insts...)
	fns := d.stopFns
	d.stopFns = nil
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, in := range insts {
		if in.stopDriver != nil {
			in.stopDriver()
		}
		if !in.p.Exited() {
			wg.Go(func() { in.p.Stop(5 * time.Second) })
		}
	}
	wg.Wait()
	if d.configd != nil && !d.configd.Exited() {
		d.configd.Stop(10 * time.Second)
	}
	d.mu.Lock()
	for _, p := range d.started {
		if !p.Exited() {
			p.Kill()
		}
	}
	d.mu.Unlock()
	if d.cli != nil {
		d.cli.Close()
		d.cli = nil
	}
	if d.ntp != nil {
		d.ntp.Close()
	}
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}
