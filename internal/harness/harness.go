// Package harness holds what the bench report programs (bench/retune,
// bench/accuracy) share to run sluice as real processes on one machine: the
// module's binaries built with `go build`, an etcd embedded in the report
// process, `configd serve` as a separate process, a watcher of a provider's
// shares in etcd, a gRPC counter of an instance's etcd traffic, and the
// machine facts every report prints.
//
// Times across processes are compared on the one machine's wall clock.
package harness

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// ModuleRoot returns the directory of the sluice module's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run from inside the sluice module")
	}
	return filepath.Dir(gomod), nil
}

// Build builds each package (a path relative to the module root, such as
// "./configd") into dir, named after its last element, in one go build (so
// the packages compile in parallel), and returns the binaries' paths in the
// same order. A failed build's error carries the compiler's output.
func Build(dir string, pkgs ...string) ([]string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	bins := make([]string, len(pkgs))
	for i, p := range pkgs {
		bins[i] = filepath.Join(dir, filepath.Base(p))
	}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	return bins, nil
}

// StartEtcd starts a single-member etcd named name with its data in dir on
// free loopback ports, logging nothing (TickMs=10, ElectionMs=100), and
// returns it with its client URL. embed registers its metrics on the
// default Prometheus registerer (see EtcdHealth).
func StartEtcd(name, dir string) (*embed.Etcd, string, error) {
	cu, pu := url.URL{Scheme: "http", Host: FreeAddr()}, url.URL{Scheme: "http", Host: FreeAddr()}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.MaxTxnOps = EtcdMaxTxnOps
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, "", errors.New("embedded etcd: not ready after 30s")
	}
	return e, cu.String(), nil
}

// EtcdMaxTxnOps is StartEtcd's --max-txn-ops: configd's embedded etcd's.
const EtcdMaxTxnOps = 2048

// FreeAddr returns a free TCP address on 127.0.0.1 ("127.0.0.1:PORT").
func FreeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Facts returns a line of machine facts: date, Go version, OS/arch, CPUs
// and CPU model.
func Facts() string {
	return fmt.Sprintf("date %s; %s %s/%s; nproc %d; cpu %s", time.Now().UTC().Format(time.RFC3339), runtime.Version(),
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), CPUModel())
}

// CPUModel returns the first "model name" of /proc/cpuinfo, or "unknown".
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// EtcdHealth summarises the embedded etcd's disk and apply latencies from
// its metrics (embed registers them on the default Prometheus registry):
// a slow disk or a starved process shows there, and explains outliers.
func EtcdHealth() string {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, mf := range mfs {
		switch mf.GetName() {
		case "etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds":
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				n := h.GetSampleCount()
				var under float64
				slowest := math.Inf(1) // the bound of the first bucket holding every sample
				for _, b := range h.GetBucket() {
					if b.GetUpperBound() <= 0.512 {
						under = float64(b.GetCumulativeCount())
					}
					if b.GetCumulativeCount() == n {
						slowest = min(slowest, b.GetUpperBound())
					}
				}
				name := strings.TrimSuffix(strings.TrimPrefix(mf.GetName(), "etcd_disk_"), "_duration_seconds")
				parts = append(parts, fmt.Sprintf("%s: %d, %d slower than 0.512s, mean %.1fms, slowest ≤ %gs",
					name, n, n-uint64(under), 1000*h.GetSampleSum()/max(1, float64(n)), slowest))
			}
		case "etcd_server_slow_apply_total", "etcd_server_slow_read_indexes_total", "etcd_server_heartbeat_send_failures_total":
			for _, m := range mf.GetMetric() {
				parts = append(parts, fmt.Sprintf("%s %g", strings.TrimPrefix(mf.GetName(), "etcd_server_"), m.GetCounter().GetValue()))
			}
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// Pct returns the p-th percentile of d (nearest rank), rounded to the
// millisecond.
func Pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100 // nearest rank
	return s[max(0, min(len(s), i)-1)].Round(time.Millisecond)
}

// Sum returns the sum of m's values.
func Sum(m map[string]int64) (s int64) {
	for _, v := range m {
		s += v
	}
	return s
}

// Mean returns the mean of v (NaN when empty).
func Mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// CPUSeconds returns the user and system CPU time of process pid, from
// /proc (0 where there is none).
func CPUSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces) start after ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ is 100 on Linux
}

// Weights parses -weights: comma-separated shares of the offered load, one
// per instance, at least least of them, none negative and some above 0.
// It returns them normalised to add up to 1.
func Weights(s string, least int) ([]float64, error) {
	var ws []float64
	var sum float64
	for _, f := range strings.Split(s, ",") {
		w, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || w < 0 || math.IsInf(w, 0) {
			return nil, fmt.Errorf("bad -weights %q", s)
		}
		ws = append(ws, w)
		sum += w
	}
	if len(ws) < least || sum <= 0 {
		return nil, fmt.Errorf("-weights: at least %d instances, with some load", least)
	}
	for i := range ws {
		ws[i] /= sum
	}
	return ws, nil
}
