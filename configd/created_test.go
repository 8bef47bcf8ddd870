package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestDryRunOfACreateWithAReserveSaysTheLedger: configd set --dry-run of
// a provider that does not exist, with a class reserve and no
// --coordination, previews what the same command then creates: the
// ledger (ProviderConfig.Created).
func TestDryRunOfACreateWithAReserveSaysTheLedger(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	args := []string{"set", "api", "--limit", "1000/1s", "--class", "critical=60%", "--class", "default", "--class", "batch", "--server", r.url()}
	dry := cliOK(t, append(args, "--dry-run")...)
	real := cliOK(t, args...)
	if strings.Contains(real, "coordination=ledger") && !strings.Contains(dry, "coordination=ledger") {
		t.Errorf("the dry run said\n%s\nand the same command then wrote\n%s", dry, real)
	}
}

// TestRepairOfAMalformedSharesConfigKeepsTheShares: a shares provider
// with a class reserve, created with no coordination named, whose stored
// config is then malformed. PUTting its config back repairs it (as
// store.write says) and keeps the shares: only a provider with no config
// stored at all is created on the ledger for its reserve.
func TestRepairOfAMalformedSharesConfigKeepsTheShares(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	body := `{"limit":1000,"window":"1s","classes":[{"name":"critical","reserve":"60%"},{"name":"default"}]}`
	var legacy schema.ProviderConfig
	if err := json.Unmarshal([]byte(body), &legacy); err != nil {
		t.Fatal(err)
	}
	legacy.Name = "api"
	legacy = legacy.WithDefaults()
	val, err := schema.Encode(legacy) // as configd wrote it before Created: coordination omitted, the shares
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctxT(t), keys.Config("api"), string(val)); err != nil {
		t.Fatal(err)
	}
	addInstance(t, cli, "api", "i1")
	waitShares(t, cli, "api", "i1's share published", func(sh schema.Shares) bool { return sh.Shares["i1"] > 0 })
	if _, err := cli.Put(ctxT(t), keys.Config("api"), "{damaged"); err != nil {
		t.Fatal(err)
	}
	status, resp := do(t, "PUT", r.url()+"/v1/providers/api", nil, body)
	if status != 200 || !strings.Contains(resp, `"limit": 1000`) || strings.Contains(resp, `"coordination": "ledger"`) {
		t.Errorf("PUT of api's own body over its damaged config: %d %s\nwant it repaired, on the shares its instances follow", status, resp)
	}
}
