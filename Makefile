# sluice — every target installs or builds what it needs with the Go
# toolchain; nothing else has to be installed by hand.

GO       ?= go
PKGS     ?= ./...
FUZZTIME ?= 3s
BENCHCOUNT ?= 6

export PATH := $(PATH):/usr/local/go/bin:$(shell $(GO) env GOPATH 2>/dev/null)/bin

.PHONY: all build bin proto proto-tools proto-check python-test test vet fmt-check chromium unit guarantee fuzz oracle rebalance bench accuracy multi soak scale shards faults demo screenshot clean

all: build test

build:
	$(GO) build $(PKGS)

## bin: the programs as binaries in bin/: configd, the local agent
## (sluice-agent), and the demo with the instances it starts. A binary exits with its own status (configd: 2 on a
## usage error), where go run exits 1 on any error; and killing a binary's
## PID stops it, where killing go run's leaves its child running.
BINS = ./configd ./agent/sluice-agent ./examples/demo ./examples/demo/instance ./examples/httphandler
bin:
	$(GO) build -o bin/ $(BINS)

## proto: regenerate the agent's gRPC code (agent/agentpb) from its .proto
## with Debian's protoc (protobuf-compiler, installed with apt-get as root
## when missing) and protoc-gen-go / protoc-gen-go-grpc at the versions
## pinned here, installed into .tools/. proto-check regenerates into a
## temporary directory and fails if the checked-in code differs (CI).
PROTOC_GEN_GO      = google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC = google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
TOOLS = $(CURDIR)/.tools
PROTO_DIR = agent/agentpb
proto-tools:
	@command -v protoc >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=sudo; \
		else echo "no protoc, and neither root nor sudo: install Debian's protobuf-compiler"; exit 1; fi; \
		$$sudo apt-get update && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y --no-install-recommends protobuf-compiler; }
	GOBIN=$(TOOLS) $(GO) install $(PROTOC_GEN_GO)
	GOBIN=$(TOOLS) $(GO) install $(PROTOC_GEN_GO_GRPC)

proto: proto-tools
	PATH=$(TOOLS):$$PATH protoc --proto_path=$(PROTO_DIR) \
		--go_out=$(PROTO_DIR) --go_opt=paths=source_relative \
		--go-grpc_out=$(PROTO_DIR) --go-grpc_opt=paths=source_relative $(PROTO_DIR)/agent.proto

proto-check: proto-tools
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	PATH=$(TOOLS):$$PATH protoc --proto_path=$(PROTO_DIR) \
		--go_out=$$tmp --go_opt=paths=source_relative \
		--go-grpc_out=$$tmp --go-grpc_opt=paths=source_relative $(PROTO_DIR)/agent.proto; \
	for f in agent.pb.go agent_grpc.pb.go; do \
		if ! cmp -s $$tmp/$$f $(PROTO_DIR)/$$f; then echo "$(PROTO_DIR)/$$f is not what agent.proto generates: run make proto"; diff $$tmp/$$f $(PROTO_DIR)/$$f | head -20; exit 1; fi; \
	done; echo "$(PROTO_DIR): generated code is current"

## test: vet, formatting, the race-enabled test suite (with the console's
## test in headless Chromium), the Python client's tests, the guarantee's oracles over thousands of
## random histories, and a short fuzz run of every decoder and arithmetic
## target (about 8-12 minutes on 2 cores).
test: vet fmt-check chromium unit python-test guarantee fuzz

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# The console's browser test (configd's TestConsoleBrowser) drives headless
# Chromium. When none is on PATH it is installed from the distribution's
# packages (Debian: chromium) as root, or through sudo without a password;
# otherwise the test skips, saying so — unless CI is set, where it fails.
CHROMIUM_NAMES = chromium chromium-browser google-chrome google-chrome-stable
chromium:
	@for b in $(CHROMIUM_NAMES); do command -v $$b >/dev/null 2>&1 && exit 0; done; \
	if [ -n "$$SLUICE_CHROMIUM" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=sudo; \
	else echo "no Chromium, and neither root nor sudo: the console's browser test will skip (and fail if CI is set)"; exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then echo "no Chromium and no apt-get: install Chromium, or set SLUICE_CHROMIUM"; exit 0; fi; \
	echo "installing Chromium for the console's browser test"; \
	$$sudo apt-get update && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y chromium

# The Python client's tests (clients/python, pytest) against a real
# sluice-agent, configd and its embedded etcd, which they start from bin/.
# A python3 with pytest is looked for as PYTHON, then /usr/bin/python3; with
# neither, Debian's python3 and python3-pytest are installed with apt-get as
# root (or through sudo without a password). About 5 s.
PYTHON ?= python3
python-test: bin
	@py=; for p in $(PYTHON) /usr/bin/python3; do \
		if command -v $$p >/dev/null 2>&1 && $$p -c 'import pytest' 2>/dev/null; then py=$$p; break; fi; done; \
	if [ -z "$$py" ]; then \
		if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=sudo; \
		else echo "no python3 with pytest, and neither root nor sudo: install Debian's python3 and python3-pytest"; exit 1; fi; \
		echo "installing Debian's python3 and python3-pytest for the Python client's tests"; \
		$$sudo apt-get update && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y --no-install-recommends python3 python3-pytest || exit 1; \
		py=/usr/bin/python3; \
	fi; \
	cd clients/python && SLUICE_BIN_DIR=$(CURDIR)/bin $$py -m pytest -q -p no:cacheprovider

unit:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

# The oracles again without the race detector, which slows them tenfold:
# 20,000 limiter histories, 5,000 histories of several limits, 10,000
# histories of a budget taken by several instances, 200 histories of configd's writes of share records and 1,000
# histories of the ledger in the simulated world (internal/world), new
# seeds each run (make oracle runs ten times more or so).
guarantee:
	$(GO) test -count=1 -run '^TestOracle$$' ./limiter -oracle.n=20000
	$(GO) test -count=1 -run '^TestMultiOracle$$' ./limiter -multi.n=5000
	$(GO) test -count=1 -run '^TestBudgetOracle$$' ./limiter/cluster -budget.n=10000
	$(GO) test -count=1 -run '^TestShareLayoutOracle$$' ./configd -layout.n=200
	$(GO) test -count=1 -run '^TestHistories$$' ./internal/world -world.n=1000

# Each fuzz target runs for FUZZTIME on top of its seed corpus (which the
# unit run already executes).
FUZZ_TARGETS = \
	./limiter:FuzzLimiter \
	./limiter:FuzzOracle \
	./limiter:FuzzMultiOracle \
	./limiter:FuzzWindowArithmetic \
	./configd/alloc:FuzzAlgorithms \
	./limiter/skew:FuzzMeasure \
	./internal/ntptest:FuzzRespond \
	./internal/schema:FuzzDecodeProviderConfig \
	./internal/schema:FuzzDecodeProviderConfigInput \
	./internal/schema:FuzzDecodeInstanceRecord \
	./internal/schema:FuzzDecodeShares \
	./internal/schema:FuzzDecodeShareRecord \
	./internal/schema:FuzzDecodeHistoryEntry \
	./internal/schema:FuzzDecodeBudgetRecord \
	./internal/schema:FuzzKeysParse \
	./internal/ledger:FuzzDecode \
	./configd:FuzzPreconditions \
	./limiter/cluster:FuzzObserve \
	./consumer:FuzzDeadLetter \
	./consumer:FuzzClass \
	./examples/httphandler:FuzzBudgetHeader \
	./examples/httphandler:FuzzParseRetryAfter \
	./examples/httphandler:FuzzClassHeader \
	./agent:FuzzDecodeAcquire \
	./agent:FuzzHandler

# go test -fuzz can end a short run with a bare "context deadline exceeded"
# when its time runs out mid-exchange with a worker (no failing input is
# written): such a run is repeated once; a real finding never is.
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		for try in 1 2; do \
			if $(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg > /tmp/sluice-fuzz.log 2>&1; then break; fi; \
			if [ $$try = 1 ] && grep -q 'context deadline exceeded' /tmp/sluice-fuzz.log && ! grep -q 'Failing input written' /tmp/sluice-fuzz.log; then \
				echo "  the fuzzer's own deadline flake; running it again"; continue; fi; \
			cat /tmp/sluice-fuzz.log; exit 1; \
		done; \
	done

## oracle: the guarantee's oracles over many more random histories than
## make test runs: ORACLE_N limiter histories (about 40 s per 100,000 here),
## MULTI_N histories of several limits (about 15 s per 10,000), BUDGET_N histories of a
## budget (about 7 s per 10,000) and LAYOUT_N histories of configd's
## writes of share records on an embedded etcd (about 6 s per 100) and
## WORLD_N histories of the ledger in the simulated world (internal/world,
## about 5 s per 100), and the scenarios found by the old protocol search
## (internal/world/testdata/found) under four seeds each, liveness waited for after every configd
## clock (tens of minutes: a clock 44 minutes ahead is played out). A
## failure prints its seed and how to replay it.
ORACLE_N ?= 200000
MULTI_N  ?= 50000
BUDGET_N ?= 100000
LAYOUT_N ?= 5000
WORLD_N  ?= 20000
oracle:
	$(GO) test -count=1 -run '^TestOracle$$' -v -timeout 60m ./limiter -oracle.n=$(ORACLE_N)
	$(GO) test -count=1 -run '^TestMultiOracle$$' -v -timeout 60m ./limiter -multi.n=$(MULTI_N)
	$(GO) test -count=1 -run '^TestBudgetOracle$$' -v -timeout 60m ./limiter/cluster -budget.n=$(BUDGET_N)
	$(GO) test -count=1 -run '^TestShareLayoutOracle$$' -v -timeout 60m ./configd -layout.n=$(LAYOUT_N)
	$(GO) test -count=1 -run '^TestHistories$$' -v -timeout 60m ./internal/world -world.n=$(WORLD_N)
	WORLD_FOUND_LONG=4 $(GO) test -count=1 -run '^TestFoundScenarios$$' -v -timeout 120m ./internal/world

## rebalance: the Kafka consumer's rebalance oracle over REBALANCE_ROUNDS
## random rounds (make test runs 4), on kfake; ~1 s a round.
REBALANCE_ROUNDS ?= 100
rebalance:
	$(GO) test -race -count=1 -v -timeout 30m -run '^TestRevokedPartitionsStartNoCall$$' ./consumer/ -consumer.rounds=$(REBALANCE_ROUNDS)

## bench: the hot-path and slow-path benchmarks, repeated for benchstat.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCHCOUNT) ./limiter/ | tee bench.txt

## accuracy: 8 instance processes, configd, embedded etcd and a provider stub:
## fair vs even, and +200ms clock skew without/with NTP (about 5 minutes).
accuracy:
	$(GO) run ./bench/accuracy $(ACCURACY_FLAGS)

## multi: two limits of one provider (requests 2000/1s, tokens 60000/10s),
## 8 examples/httphandler processes joining both (cluster.JoinProvider), 3x
## the tokens limit offered: windows over and utilization per limit (about
## 1.5 minutes). MULTI_FLAGS=-one-provider=false: a provider per limit.
multi:
	$(GO) run ./bench/multi $(MULTI_FLAGS)

## soak: configd with its embedded etcd and 50 busy instances (5 processes)
## for 10 minutes: etcd's database size every 30 s, and whether it levels
## off under the embedded etcd's auto-compaction (SOAK_FLAGS=-retention=0
## shows it without).
soak:
	$(GO) run ./bench/soak $(SOAK_FLAGS)

## scale: N real members (one process, a client each) against an embedded
## etcd and a configd process, N = 100 to 2000: what each member receives,
## etcd's and configd's load, retune latency, windows over the limit
## (SCALE_FLAGS=-n 100,1000 for fewer sizes).
scale:
	$(GO) run ./bench/scale $(SCALE_FLAGS)

## shards: providers spread over configd replicas: P providers of I
## instances (records and an acknowledger, not processes) led by 3 configd
## processes: hand-out, retunes of every provider, CPU per replica, a
## replica killed (SHARDS_FLAGS=-replicas 1 for one replica's capacity,
## -coordination both for the shares and the ledger).
shards:
	$(GO) run ./bench/shards $(SHARDS_FLAGS)

## faults: the fault suite — real processes under a leader kill, a zombie
## instance, an etcd outage, a 3-member etcd losing its leader, a flood of
## joins and leaves, a network cut, a clock step and NTP loss, configd's clock
## 2 s off, a window change with late records, a Kafka broker restart, a
## rebalance storm and a Kafka soak (about 5 minutes; CI runs it).
faults:
	SLUICE_FAULTS=1 $(GO) test -count=1 -v -timeout 15m ./faults/

## demo: the main job on one machine: configd with embedded etcd, a provider
## stub, several instance processes (one a Kafka consumer, one an HTTP handler),
## a live view, a retune, a crash, a join and a clock offset; ends on its own.
## The demo runs as a binary in make's place (exec): killing make's PID
## stops it, and it stops every process it started.
demo: bin
	exec bin/demo -bin-dir bin $(DEMO_FLAGS)

## screenshot: the README's picture of configd's console (docs/console.png),
## taken by headless Chromium from a running demo at the end of its scenario,
## in a window 1280 px wide (about 70 s; installs Chromium as make chromium
## does).
screenshot: bin chromium
	exec bin/demo -bin-dir bin -screenshot docs/console.png $(DEMO_FLAGS)

clean:
	rm -f bench.txt
