// Command retune is the operator example: it changes a provider's total
// while its instances run under load, and shows them follow without a
// restart. It prints each instance's share, demand and admissions (what
// `configd status` shows) before the change, sets the new limit, waits
// until every live instance enforces shares of the new total, and prints
// the table again with how long that took.
//
// Against a running configd's admin API (the change is recorded in
// `configd history`):
//
//	go run ./examples/retune -server http://127.0.0.1:7070 -provider payments-api -limit 1200
//
// or straight against etcd (an etcd transaction on the config key; no
// history entry is written, so prefer -server where configd runs):
//
//	go run ./examples/retune -etcd-endpoints http://127.0.0.1:2379 -provider payments-api -limit 1200
//
// Writes are conditional on the revision read, like `configd set
// --if-revision`, so a concurrent edit is never silently overwritten.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/schema"
)

func main() {
	var server, endpoints, name, tokenFile string
	var limit int64
	var timeout time.Duration
	flag.StringVar(&server, "server", "", "admin API of a running configd, e.g. http://127.0.0.1:7070")
	flag.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated etcd URLs (instead of -server)")
	flag.StringVar(&name, "provider", "", "provider to retune")
	flag.Int64Var(&limit, "limit", 0, "the new total, permits per window")
	flag.StringVar(&tokenFile, "token-file", "", "file holding the admin API bearer token (with -server)")
	flag.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the instances to follow")
	flag.Parse()
	if (server == "") == (endpoints == "") || name == "" || schema.ValidateLimit(limit) != nil {
		fmt.Fprintln(os.Stderr, "retune: give -provider, a valid -limit, and one of -server or -etcd-endpoints")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var b backend
	if server != "" {
		a := &apiBackend{base: strings.TrimRight(server, "/"), client: &http.Client{Timeout: 10 * time.Second}}
		if tokenFile != "" {
			t, err := os.ReadFile(tokenFile)
			if err != nil {
				fmt.Fprintln(os.Stderr, "retune:", err)
				os.Exit(2)
			}
			a.token = strings.TrimSpace(string(t))
		}
		b = a
	} else {
		cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			fmt.Fprintln(os.Stderr, "retune:", err)
			os.Exit(1)
		}
		defer cli.Close()
		b = &etcdBackend{cli: cli, keys: schema.DefaultKeys()}
	}
	if err := run(ctx, b, name, limit, timeout, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "retune:", err)
		os.Exit(1)
	}
}

// view is what status shows: config, published shares, live instances.
type view struct {
	Config         *schema.ProviderConfig `json:"config"`
	ConfigRevision int64                  `json:"config_revision"`
	Shares         *schema.Shares         `json:"shares"`
	Instances      []instanceView         `json:"instances"`
}

type instanceView struct {
	ID     string                 `json:"id"`
	Record *schema.InstanceRecord `json:"record,omitempty"`
	Share  int64                  `json:"share"`
}

// backend reads a provider's status and writes its config.
type backend interface {
	status(ctx context.Context, name string) (view, error)
	setLimit(ctx context.Context, cfg schema.ProviderConfig, rev int64) error
}

func run(ctx context.Context, b backend, name string, limit int64, timeout time.Duration, out io.Writer) error {
	before, err := b.status(ctx, name)
	if err != nil {
		return err
	}
	if before.Config == nil {
		return fmt.Errorf("provider %s has no (valid) config: create it with configd set", name)
	}
	fmt.Fprintf(out, "before: %s, limit %d per %v\n", name, before.Config.Limit, before.Config.Window)
	printTable(out, before)
	cfg := *before.Config
	old := cfg.Limit
	cfg.Limit = limit
	fmt.Fprintf(out, "\nsetting %s's limit %d → %d (if still at revision %d)\n", name, old, limit, before.ConfigRevision)
	set := time.Now()
	if err := b.setLimit(ctx, cfg, before.ConfigRevision); err != nil {
		return err
	}
	// Followed: the shares of the new total are published, all of it is
	// handed out, and every live instance applies that generation or a
	// later one.
	deadline := time.Now().Add(timeout)
	for {
		v, err := b.status(ctx, name)
		if err != nil {
			return err
		}
		if followed(v, limit) {
			fmt.Fprintf(out, "\nafter %.1fs: every instance enforces a share of the new total, none restarted\n", time.Since(set).Seconds())
			printTable(out, v)
			return nil
		}
		if time.Now().After(deadline) {
			printTable(out, v)
			return fmt.Errorf("the instances did not follow within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func followed(v view, limit int64) bool {
	sh := v.Shares
	if sh == nil || sh.Total != limit || len(v.Instances) == 0 {
		return false
	}
	var sum int64
	for _, s := range sh.Shares {
		sum += s
	}
	if sum != limit {
		return false
	}
	for _, in := range v.Instances {
		if in.Record == nil || in.Record.AppliedGeneration < sh.Generation {
			return false
		}
	}
	return true
}

func printTable(out io.Writer, v view) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tSHARE\tDEMAND\tADMITTED\tCLOCK OFFSET\tGENERATION")
	for _, in := range v.Instances {
		r := in.Record
		if r == nil {
			fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t(malformed record)\n", in.ID, in.Share)
			continue
		}
		off := "unknown"
		if r.ClockKnown {
			off = time.Duration(r.ClockOffset).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\n", in.ID, in.Share, r.Demand, r.Admitted, off, r.AppliedGeneration)
	}
	tw.Flush()
	if sh := v.Shares; sh != nil {
		fmt.Fprintf(out, "published: generation %d, total %d over %d instances\n", sh.Generation, sh.Total, sh.Instances)
	}
}

// apiBackend talks to configd's admin API.
type apiBackend struct {
	base, token string
	client      *http.Client
}

func (a *apiBackend) status(ctx context.Context, name string) (view, error) {
	var v view
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/v1/providers/"+name+"/instances", nil)
	if err != nil {
		return v, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return v, fmt.Errorf("status: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

func (a *apiBackend) setLimit(ctx context.Context, cfg schema.ProviderConfig, rev int64) error {
	body, err := schema.Encode(cfg)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, a.base+"/v1/providers/"+cfg.Name, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-Match", strconv.Quote(strconv.FormatInt(rev, 10)))
	req.Header.Set("X-Sluice-Actor", "examples/retune")
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("set: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// etcdBackend reads and writes the records in etcd directly.
type etcdBackend struct {
	cli  *clientv3.Client
	keys schema.Keys
}

func (e *etcdBackend) status(ctx context.Context, name string) (view, error) {
	var v view
	resp, err := e.cli.Get(ctx, e.keys.Provider(name), clientv3.WithPrefix())
	if err != nil {
		return v, err
	}
	set := schema.NewShareSet(e.keys, name)
	for _, kv := range resp.Kvs {
		k, err := e.keys.Parse(string(kv.Key))
		if err != nil {
			continue
		}
		switch k.Kind {
		case schema.KindConfig:
			if c, err := schema.DecodeProviderConfig(kv.Value); err == nil {
				v.Config, v.ConfigRevision = &c, kv.ModRevision
			}
		case schema.KindShares:
			set.Apply(string(kv.Key), kv.Value, false) // a malformed record is left out
		case schema.KindInstance:
			in := instanceView{ID: k.Instance}
			if r, err := schema.DecodeInstanceRecord(kv.Value); err == nil {
				in.Record = &r
			}
			v.Instances = append(v.Instances, in)
		}
	}
	if sh, ok := set.View(); ok {
		v.Shares = &sh
	}
	for i := range v.Instances {
		if v.Shares != nil {
			v.Instances[i].Share = v.Shares.Shares[v.Instances[i].ID]
		}
	}
	slices.SortFunc(v.Instances, func(a, b instanceView) int { return strings.Compare(a.ID, b.ID) })
	return v, nil
}

func (e *etcdBackend) setLimit(ctx context.Context, cfg schema.ProviderConfig, rev int64) error {
	b, err := schema.Encode(cfg)
	if err != nil {
		return err
	}
	key := e.keys.Config(cfg.Name)
	resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return errors.New("the config changed since it was read (another edit): run again")
	}
	return nil
}
