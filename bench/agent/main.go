// Command agent measures acquisitions through sluice's local agent
// against the alternatives, in one run on one machine, for BENCHMARKS.md:
//
//   - in-process: limiter.Multi.Acquire with a permit available (no
//     socket, no lock), timed in batches (one call is shorter than two
//     clock reads);
//   - agent-http and agent-grpc: POST /v1/acquire and the gRPC Acquire
//     over the agent's Unix sockets, from 1 and from 16 client processes
//     (this binary re-executed), each call timed on its own; gRPC from
//     two clients, one of blocking system calls as the HTTP one (see
//     blockingGRPC) and grpc-go's;
//   - redis-lua: the token bucket of bench/redis, one EVALSHA per call
//     over loopback TCP, from 1 and 16 client processes, when a
//     redis-server is on PATH (else skipped, saying so);
//   - floor: the same HTTP client against a server that does no work (this
//     binary again, answering every read with a fixed 200 from a thread
//     blocked in read, as a C server would): the machine's own cost of
//     one exchange between two processes over a Unix socket, which no
//     agent can go below;
//   - python: examples/python/llm_workers.py, 8 Python processes on two
//     agents sharing one provider of requests and tokens per second,
//     counting windows over either limit at the stub (when python3 is
//     found).
//
// The agents are real: it builds configd and sluice-agent, starts configd
// serve with its embedded etcd, sets the providers and starts the agents
// as members. Every limit of the latency cases is far above what a run
// can use, so every call is a grant: the figures are the cost of a
// decision, not of a wait.
//
//	go run ./bench/agent
//	go run ./bench/agent -duration 5s -python-windows 10
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-go/sluice/agent/agentpb"
	"github.com/sluice-go/sluice/bench/internal/redisbucket"
	"github.com/sluice-go/sluice/limiter"
)

// clientEnv makes this binary a client process: mode|target|duration.
const clientEnv = "SLUICE_BENCH_AGENT_CLIENT"

// result is what a client process reports: calls made, and a sample of
// their latencies in nanoseconds.
type result struct {
	N   int64   `json:"n"`
	CPU int64   `json:"cpu"` // ns of user and system time over the timed calls
	Lat []int64 `json:"lat"`
	Err string  `json:"err,omitempty"`
}

// floorEnv makes this binary the floor case's server, on the Unix socket
// it names.
const floorEnv = "SLUICE_BENCH_AGENT_FLOOR"

func main() {
	if spec := os.Getenv(clientEnv); spec != "" {
		json.NewEncoder(os.Stdout).Encode(client(spec))
		return
	}
	if sock := os.Getenv(floorEnv); sock != "" {
		if err := floorServer(sock); err != nil {
			fmt.Fprintln(os.Stderr, "bench/agent floor:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/agent:", err)
		os.Exit(1)
	}
}

type config struct {
	duration      time.Duration
	agentProcs    int // GOMAXPROCS of the agents, 0: Go's default
	clientProcs   int // GOMAXPROCS of the client processes, 0: Go's default
	procs         []int
	pythonWindows int
	keep          bool
	cases         map[string]bool
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var c config
	fs.DurationVar(&c.duration, "duration", 3*time.Second, "how long each case runs at each concurrency")
	ps := fs.String("procs", "1,16", "client processes (goroutines in-process), comma-separated")
	fs.IntVar(&c.pythonWindows, "python-windows", 5, "one-second windows of the Python run (0: none)")
	fs.BoolVar(&c.keep, "keep", false, "keep the temporary directory (logs)")
	fs.IntVar(&c.agentProcs, "agent-gomaxprocs", 0, "GOMAXPROCS of the agents (0: Go's default, the cores)")
	fs.IntVar(&c.clientProcs, "client-gomaxprocs", 0, "GOMAXPROCS of each Go client process (0: Go's default)")
	only := fs.String("cases", "inproc,floor,http,grpc,redis,python", "the cases to run, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.cases = map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		c.cases[strings.TrimSpace(s)] = true
	}
	if !c.cases["python"] {
		c.pythonWindows = 0
	}
	for _, s := range strings.Split(*ps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-procs: %q", s)
		}
		c.procs = append(c.procs, n)
	}
	dir, err := os.MkdirTemp("", "sluice-bench-agent-")
	if err != nil {
		return err
	}
	if !c.keep {
		defer os.RemoveAll(dir)
	}
	fmt.Fprintf(out, "bench/agent: %s, GOMAXPROCS %d (agents %s, clients %s), %d s per case\n", runtime.Version(), runtime.GOMAXPROCS(0),
		procsName(c.agentProcs), procsName(c.clientProcs), int(c.duration.Seconds()))
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(out, "load average at start: %s", b)
	}
	bin := filepath.Join(dir, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./configd", "./agent/sluice-agent")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building: %w", err)
	}
	etcd := "http://" + freeAddr()
	data := filepath.Join(dir, "configd.etcd")
	cd, err := start(dir, "configd", filepath.Join(bin, "configd"), "serve", "--data-dir", data, "--listen", "127.0.0.1:0",
		"--embedded-client-url", etcd, "--embedded-peer-url", "http://"+freeAddr())
	if err != nil {
		return err
	}
	defer cd.stop()
	m, err := cd.waitLine(regexp.MustCompile(`msg="configd serving".* listen=(\S+)`))
	if err != nil {
		return err
	}
	admin := "http://" + m[1]
	for _, set := range [][]string{
		{"set", "bench", "--limit", "1000000000/1s"},
		{"set", "llm", "--limit", "100/1s", "--limit", "tokens=40000/1s"},
	} {
		if b, err := exec.Command(filepath.Join(bin, "configd"), append(set, "--server", admin)...).CombinedOutput(); err != nil {
			return fmt.Errorf("configd %v: %v: %s", set, err, b)
		}
	}
	var socks []string
	var agentPID int // agent a's: the one the latency cases call
	for _, name := range []string{"a", "b"} {
		sock := filepath.Join(dir, name+".sock")
		ag, err := startEnv(dir, "agent-"+name, gomaxprocsEnv(c.agentProcs), filepath.Join(bin, "sluice-agent"), "--socket", sock, "--grpc-socket", filepath.Join(dir, name+"-grpc.sock"),
			"--etcd-endpoints", etcd, "--etcd-username", "instance", "--etcd-password-file", filepath.Join(data, "credentials", "instance"),
			"--id", "agent-"+name, "--provider", "bench,llm", "--log-level", "warn")
		if err != nil {
			return err
		}
		defer ag.stop()
		if agentPID == 0 {
			agentPID = ag.cmd.Process.Pid
		}
		socks = append(socks, sock)
	}
	for _, s := range socks {
		for _, p := range []string{"bench", "llm"} {
			if err := waitShare(s, p); err != nil {
				return err
			}
		}
	}

	type row struct {
		name              string
		procs             int
		r                 result
		dur               time.Duration
		server, clientCPU time.Duration // CPU time spent, by the server called and by the clients
	}
	var rows []row
	for _, n := range c.procs {
		if !c.cases["inproc"] {
			break
		}
		r, d := inProcess(n, c.duration)
		rows = append(rows, row{name: "in-process Acquire", procs: n, r: r, dur: d})
	}
	type benchCase struct {
		name, only   string // only: the -cases name that selects it
		mode, target string
		pid          int // the server's
	}
	var cases []benchCase
	if c.cases["floor"] {
		sock := filepath.Join(dir, "floor.sock")
		self, err := os.Executable()
		if err != nil {
			return err
		}
		fl, err := startEnv(dir, "floor", []string{floorEnv + "=" + sock}, self)
		if err != nil {
			return err
		}
		defer fl.stop()
		if _, err := fl.waitLine(regexp.MustCompile(`^floor ready`)); err != nil {
			return err
		}
		// The floor's clients are the HTTP case's: "http" mode.
		cases = append(cases, benchCase{"floor: no-op server, Unix socket", "floor", "http", sock, fl.cmd.Process.Pid})
	}
	grpcSock := filepath.Join(dir, "a-grpc.sock")
	cases = append(cases, []benchCase{
		{"agent HTTP, Unix socket", "http", "http", socks[0], agentPID},
		{"agent gRPC, Unix socket, blocking client", "grpc", "grpc-block", grpcSock, agentPID},
		{"agent gRPC, Unix socket, grpc-go client", "grpc", "grpc", grpcSock, agentPID},
	}...)
	if !c.cases["redis"] {
		// not asked for
	} else if rs, err := startRedis(dir); err != nil {
		fmt.Fprintf(out, "redis-lua: skipped: %v\n", err)
	} else {
		defer rs.stop()
		cases = append(cases, benchCase{"Redis Lua token bucket, TCP", "redis", "redis", rs.addr, rs.cmd.Process.Pid})
	}
	for _, cs := range cases {
		if !c.cases[cs.only] {
			continue
		}
		for _, n := range c.procs {
			before := cpuOf(cs.pid)
			r, cpu, err := clients(cs.mode, cs.target, n, c.duration, c.clientProcs)
			if err != nil {
				return fmt.Errorf("%s: %w", cs.name, err)
			}
			rows = append(rows, row{cs.name, n, r, c.duration, cpuOf(cs.pid) - before, cpu})
		}
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tclients\tp50\tp99\tacquisitions/s\tserver CPU/call\tclient CPU/call\t")
	for _, r := range rows {
		slices.Sort(r.r.Lat)
		perCall := func(d time.Duration) string {
			if d <= 0 || r.r.N == 0 {
				return "-"
			}
			return fmtDur(int64(d) / r.r.N)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.name, r.procs, pct(r.r.Lat, 0.50), pct(r.r.Lat, 0.99),
			thousands(int64(float64(r.r.N)/r.dur.Seconds())), perCall(r.server), perCall(r.clientCPU))
	}
	tw.Flush()
	fmt.Fprintln(out, "(clients: processes, each one connection and one call at a time; in-process: goroutines, latency per call averaged over batches of 100;")
	fmt.Fprintln(out, " CPU/call: user+system time of the server process called (agent a, redis-server) and of all client processes, over the calls timed)")
	if c.pythonWindows > 0 {
		py, err := python()
		if err != nil {
			fmt.Fprintf(out, "python: skipped: %v\n", err)
			return nil
		}
		cmd := exec.Command(py, "examples/python/llm_workers.py", "--socket", strings.Join(socks, ","), "--provider", "llm",
			"--workers", "8", "--windows", strconv.Itoa(c.pythonWindows))
		cmd.Stdout, cmd.Stderr = out, os.Stderr
		fmt.Fprintln(out, "\n8 Python processes (examples/python/llm_workers.py) on two agents sharing llm:")
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("python workers: %w", err)
		}
	}
	return nil
}

func python() (string, error) {
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
	}
	return "", errors.New("no python3")
}

func pct(s []int64, q float64) string {
	if len(s) == 0 {
		return "-"
	}
	return fmtDur(s[min(len(s)-1, int(q*float64(len(s))))])
}

func fmtDur(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1e3)
	}
	return fmt.Sprintf("%.2f ms", float64(d.Nanoseconds())/1e6)
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// inProcess runs n goroutines of Multi.Acquire for d.
func inProcess(n int, d time.Duration) (result, time.Duration) {
	m, err := limiter.NewMulti([]limiter.Limit{{Quota: 1_000_000_000_000, Window: time.Hour}})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	const batch = 100
	ctx := context.Background()
	var mu sync.Mutex
	var total result
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Go(func() {
			var lat []int64
			var calls int64
			for time.Since(start) < d {
				t := time.Now()
				for range batch {
					if _, err := m.Acquire(ctx, 0); err != nil {
						panic(err)
					}
				}
				lat = append(lat, int64(time.Since(t))/batch)
				calls += batch
			}
			mu.Lock()
			total.N += calls
			total.Lat = append(total.Lat, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return total, time.Since(start)
}

// clients runs n client processes of mode against target for d and
// merges what they report.
func clients(mode, target string, n int, d time.Duration, procs int) (result, time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, 0, err
	}
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for range n {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), append(gomaxprocsEnv(procs), fmt.Sprintf("%s=%s|%s|%s", clientEnv, mode, target, d))...)
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, os.Stderr
		if err := cmd.Start(); err != nil {
			return result{}, 0, err
		}
		cmds, outs = append(cmds, cmd), append(outs, &b)
	}
	var total result
	var cpu time.Duration
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return result{}, 0, err
		}
		var r result
		if err := json.Unmarshal(outs[i].Bytes(), &r); err != nil {
			return result{}, 0, fmt.Errorf("client said %q: %w", outs[i].Bytes(), err)
		}
		if r.Err != "" {
			return result{}, 0, errors.New(r.Err)
		}
		total.N += r.N
		total.Lat = append(total.Lat, r.Lat...)
		cpu += time.Duration(r.CPU)
	}
	return total, cpu, nil
}

// client is one client process: a warm-up, then calls until the
// duration has passed, each timed; it reports at most 20,000 latencies,
// evenly strided, so that every process weighs by its calls.
func client(spec string) result {
	parts := strings.SplitN(spec, "|", 3)
	d, _ := time.ParseDuration(parts[2])
	call, closeFn, err := dialer(parts[0], parts[1])
	if err != nil {
		return result{Err: err.Error()}
	}
	defer closeFn()
	for range 200 {
		if err := call(); err != nil {
			return result{Err: err.Error()}
		}
	}
	lat := make([]int64, 0, 1<<20)
	cpu0 := selfCPU()
	start := time.Now()
	for time.Since(start) < d {
		t := time.Now()
		if err := call(); err != nil {
			return result{Err: err.Error()}
		}
		lat = append(lat, int64(time.Since(t)))
	}
	r := result{N: int64(len(lat)), CPU: int64(selfCPU() - cpu0)}
	step := max(1, len(lat)/20000)
	for i := 0; i < len(lat); i += step {
		r.Lat = append(r.Lat, lat[i])
	}
	return r
}

func dialer(mode, target string) (func() error, func(), error) {
	ctx := context.Background()
	switch mode {
	case "http":
		// A plain HTTP/1.1 exchange on one kept connection, as the Python
		// client makes it, with blocking system calls as Python's socket
		// module makes them: Go's netpoller and net/http's client would add
		// goroutine hand-offs to every call, which the clients of the
		// agent (Python, Node, Java threads) do not pay.
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, nil, err
		}
		if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: target}); err != nil {
			syscall.Close(fd)
			return nil, nil, err
		}
		body := `{"provider":"bench","caller":"bench"}`
		raw := []byte(fmt.Sprintf("POST /v1/acquire HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
		buf := make([]byte, 4096)
		return func() error {
			if _, err := syscall.Write(fd, raw); err != nil {
				return err
			}
			return readAnswer(fd, buf)
		}, func() { syscall.Close(fd) }, nil
	case "http-go":
		// The same over Go's net.Conn and http.ReadResponse.
		conn, err := net.Dial("unix", target)
		if err != nil {
			return nil, nil, err
		}
		body := `{"provider":"bench","caller":"bench"}`
		raw := []byte(fmt.Sprintf("POST /v1/acquire HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
		br := bufio.NewReader(conn)
		return func() error {
			if _, err := conn.Write(raw); err != nil {
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("acquire: %d %s", resp.StatusCode, b)
			}
			return nil
		}, func() { conn.Close() }, nil
	case "grpc-block":
		c, err := dialBlockingGRPC(target, &agentpb.AcquireRequest{Provider: "bench", Caller: "bench"})
		if err != nil {
			return nil, nil, err
		}
		return c.call, c.close, nil
	case "grpc":
		conn, err := grpc.NewClient("unix://"+target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		c := agentpb.NewAgentClient(conn)
		req := &agentpb.AcquireRequest{Provider: "bench", Caller: "bench"}
		return func() error {
			_, err := c.Acquire(ctx, req)
			return err
		}, func() { conn.Close() }, nil
	case "redis":
		rdb := redis.NewClient(&redis.Options{Addr: target, PoolSize: 1, DisableIdentity: true})
		script := redis.NewScript(redisbucket.Script)
		return func() error {
			now := time.Now().UnixMicro()
			n, err := script.Run(ctx, rdb, []string{"bench"}, 1e12, 1e12, now, 1, 60).Int()
			if err == nil && n != 1 {
				err = errors.New("redis refused")
			}
			return err
		}, func() { rdb.Close() }, nil
	}
	return nil, nil, fmt.Errorf("mode %q", mode)
}

// proc is a child process whose stderr goes to a log file, read line by
// line for waitLine.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
}

func start(dir, name, bin string, args ...string) (*proc, error) {
	return startEnv(dir, name, nil, bin, args...)
}

// gomaxprocsEnv is the environment that sets a child's GOMAXPROCS to n
// (nothing for 0).
func gomaxprocsEnv(n int) []string {
	if n <= 0 {
		return nil
	}
	return []string{"GOMAXPROCS=" + strconv.Itoa(n)}
}

func procsName(n int) string {
	if n <= 0 {
		return "default"
	}
	return strconv.Itoa(n)
}

// startEnv is start with env added to the child's environment.
func startEnv(dir, name string, env []string, bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		close(p.lines)
	}()
	return p, nil
}

func (p *proc) waitLine(rx *regexp.Regexp) ([]string, error) {
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return nil, fmt.Errorf("%s exited before saying %v", p.cmd.Path, rx)
			}
			if m := rx.FindStringSubmatch(l); m != nil {
				return m, nil
			}
		case <-timeout:
			return nil, fmt.Errorf("%s did not say %v", p.cmd.Path, rx)
		}
	}
}

func (p *proc) stop() {
	p.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitShare polls the agent's status until it enforces a share of every
// limit of provider.
func waitShare(sock, provider string) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := hc.Get("http://agent/v1/status")
		if err == nil {
			var st struct {
				Providers []struct {
					Name   string
					Ready  bool
					Limits []struct{ Quota int64 }
				}
			}
			json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			for _, p := range st.Providers {
				if p.Name == provider && p.Ready && len(p.Limits) > 0 && !slices.ContainsFunc(p.Limits, func(l struct{ Quota int64 }) bool { return l.Quota == 0 }) {
					return nil
				}
			}
		}
		time.Sleep(20 * time.Millisecond) // polling the agent's progress
	}
	return fmt.Errorf("%s: no share of %s within a minute", sock, provider)
}

type redisServer struct {
	cmd  *exec.Cmd
	addr string
}

func startRedis(dir string) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("no redis-server on PATH (Debian: apt-get install redis-server)")
	}
	addr := freeAddr()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no")
	logf, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	rs := &redisServer{cmd: cmd, addr: addr}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true})
	defer rdb.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if rdb.Ping(context.Background()).Err() == nil {
			return rs, nil
		}
		if time.Now().After(deadline) {
			rs.stop()
			return nil, errors.New("redis-server did not answer within 10 s")
		}
		time.Sleep(20 * time.Millisecond) // polling redis-server's start
	}
}

func (r *redisServer) stop() {
	r.cmd.Process.Kill()
	r.cmd.Wait()
}

// selfCPU is this process's user and system time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuOf is process pid's user and system time so far, from /proc (0 where
// there is none).
func cpuOf(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc's times: 100 on Linux.
const clockTicks = 100

// readAnswer reads one HTTP/1.1 answer from fd into buf with blocking
// reads, and fails unless it is a 200.
func readAnswer(fd int, buf []byte) error {
	n := 0
	for {
		m, err := syscall.Read(fd, buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if m == 0 {
			return io.ErrUnexpectedEOF
		}
		n += m
		head, rest, ok := bytes.Cut(buf[:n], []byte("\r\n\r\n"))
		if !ok {
			if n == len(buf) {
				return errors.New("answer head too large")
			}
			continue
		}
		_, v, ok := bytes.Cut(head, []byte("Content-Length: "))
		if !ok {
			return fmt.Errorf("no Content-Length: %q", head)
		}
		if i := bytes.IndexByte(v, '\r'); i >= 0 {
			v = v[:i]
		}
		cl, err := strconv.Atoi(string(v))
		if err != nil || len(head)+4+cl > len(buf) {
			return fmt.Errorf("Content-Length %q", v)
		}
		if len(rest) < cl {
			continue
		}
		if !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) {
			return fmt.Errorf("acquire: %s", buf[:n])
		}
		return nil
	}
}

// floorAnswer is the size and shape of the agent's answer to an
// acquisition.
const floorAnswer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: Sun, 06 Dec 2026 16:00:00 GMT\r\n" +
	"Content-Length: 58\r\n\r\n{\"grant\":\"g0123456-1.0123456789abc\",\"cost\":{\"requests\":1}}\n"

// floorServer answers every read on every connection to sock with
// floorAnswer, each connection on its own OS thread blocked in read: a
// server that does no work and no Go scheduling (no netpoller), to
// measure what one exchange costs the machine. It runs until killed.
func floorServer(sock string) error {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		return err
	}
	if err := syscall.Listen(fd, 128); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "floor ready")
	answer := []byte(floorAnswer)
	for {
		c, _, err := syscall.Accept(fd)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		go func() {
			runtime.LockOSThread()
			defer syscall.Close(c)
			buf := make([]byte, 4096)
			for {
				n, err := syscall.Read(c, buf)
				if err == syscall.EINTR {
					continue
				}
				if err != nil || n == 0 {
					return
				}
				if _, err := syscall.Write(c, answer); err != nil {
					return
				}
			}
		}()
	}
}
