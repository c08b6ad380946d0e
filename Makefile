# Quill — the two commands a newcomer needs are `make dev` and `make test`.
SHELL := /bin/bash
GO ?= go
export DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/quill?sslmode=disable
export NATS_URL ?= nats://127.0.0.1:4222

# The public modules (decision 0095): their own go.mod each, tested, vetted
# and fuzzed in their own directories; the server's module requires them
# through a replace.
PUBLIC_MODULES := contract client consumer

# CI=true adds the race detector.
RACE := $(if $(filter true,$(CI)),-race,)
# A count, not a duration: Go 1.26's fuzz coordinator can report a spurious
# "context deadline exceeded" when a -fuzztime duration ends mid-execution
# (golang/go#75804, fixed in Go 1.27); a count has no deadline to race.
FUZZTIME ?= 200000x

.PHONY: dev demo test soak lint lint-prometheus release-check fuzz bench-api bench-relay bench-worker bench-scaleout bench-hostile bench-webhooks build services

build: ## build the shipped programs (cmd/*) into ./bin; the bench and demo scripts build their tools/ themselves
	$(GO) build -buildvcs=auto -o bin/ ./cmd/...

services: ## make sure PostgreSQL (and NATS) answer, starting them when needed
	@bash scripts/ensure-postgres.sh
	@bash scripts/ensure-nats.sh

dev: ## run the whole system (API, relay, attachment worker, webhook dispatcher) against the local PostgreSQL and NATS
	bash scripts/dev.sh

demo: ## the article's story against the running system (run make dev first)
	bash scripts/demo.sh

test: ## all tests against real PostgreSQL (QUILL_TEST_DATABASE_URL or the local quill_test database), some through PgBouncer
	@bash scripts/ensure-postgres.sh
	@bash scripts/ensure-pgbouncer.sh
	$(GO) test $(RACE) -count=1 -timeout 20m ./...
	@# A module of its own (Prometheus's PromQL parser stays out of go.mod): the dashboard's and the rules' queries against the running programs.
	cd deploy/dashboard && $(GO) test $(RACE) -count=1 -timeout 10m ./...
	@# The chart, linted and rendered by Helm's SDK into Kubernetes' types (a module of its own: the server's go.mod gains no Kubernetes).
	cd deploy/helm && $(GO) test $(RACE) -count=1 -timeout 10m ./...
	@# The public modules' own tests (the client's against the real API run above, in internal/clientsuite); the consumer's
	@# run the nats-server go.mod pins as a process (consumer/internal/testenv), built into .data/bin once.
	@bash -c 'source scripts/lib.sh && nats_server_bin'
	@for m in $(PUBLIC_MODULES); do echo "cd $$m && $(GO) test $(RACE) -count=1 ./..."; (cd $$m && QUILL_NATS_SERVER=$(CURDIR)/.data/bin/nats-server $(GO) test $(RACE) -count=1 -timeout 15m ./...) || exit 1; done
	@# The memory measurements are built without the race detector (its shadow memory would be measured too).
	$(if $(RACE),$(GO) test -count=1 -run '^TestImageBombsStayWithinTheDecodeBudget$$' ./cmd/attachment-worker/,)

soak: ## the fault suites' long profiles (50,000 operations each, single server and three-node cluster; ~20 min here) with their figures
	@bash scripts/ensure-postgres.sh
	QUILL_E2E_PROFILE=soak $(GO) test -count=1 -run '^(TestFaults|TestClusterFaults)$$' -v -timeout 90m ./e2e/

lint: lint-prometheus release-check ## gofmt, go vet (deploy/dashboard's, deploy/helm's and the public modules too), staticcheck (the version go.mod pins as a tool), api/asyncapi.yaml through the AsyncAPI parser (needs node and npm), lint-prometheus and release-check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd deploy/dashboard && $(GO) vet ./...
	cd deploy/helm && $(GO) vet ./...
	@for m in $(PUBLIC_MODULES); do echo "cd $$m && $(GO) vet ./..."; (cd $$m && $(GO) vet ./...) || exit 1; done
	$(GO) tool staticcheck ./... $(foreach m,$(PUBLIC_MODULES),github.com/quillhq/quill/$(m)/...)
	bash scripts/validate-asyncapi.sh

release-check: ## .goreleaser.yaml checked by GoReleaser's own `check` (pinned in tools/release/go.mod, a module of its own)
	cd tools/release && $(GO) tool goreleaser check -f ../../.goreleaser.yaml

lint-prometheus: ## promtool: deploy/prometheus's configuration and alerting rules, and the rules' unit tests (Debian's prometheus package ships promtool)
	@command -v promtool >/dev/null || { echo "promtool is missing: apt-get install prometheus (Debian's package ships it)"; exit 1; }
	promtool check config deploy/prometheus/prometheus.yml
	promtool check rules deploy/prometheus/quill.rules.yml
	cd deploy/prometheus && promtool test rules quill.rules.test.yml

fuzz: ## run every fuzz target for FUZZTIME each
	@for mod in . $(PUBLIC_MODULES); do \
	  for pkg in $$(cd $$mod && $(GO) list ./...); do \
	    for f in $$(cd $$mod && $(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	      echo "fuzz $$pkg $$f"; (cd $$mod && $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg) || exit 1; \
	    done; \
	  done; \
	done

bench-api: ## load benchmark of the API against a raw pgbench ceiling (see bench/README.md)
	bash scripts/bench-api.sh

bench-relay: ## relay throughput vs raw JetStream, and commit → ack latency (see bench/README.md)
	bash scripts/bench-relay.sh

bench-worker: ## attachments/s through JetStream → worker → commit vs the raw processing rate, with the ratio
	bash scripts/bench-worker.sh

bench-hostile: ## a legitimate workload alone, then beside slowloris, bad tokens, a flooding tenant, image bombs, invented methods and one host's idle connections, each from its own address: its p99, throughput, lost/duplicated operations, 429s, peak RSS, the API's series and health probe side by side (see bench/README.md)
	bash scripts/bench-hostile.sh

bench-webhooks: ## webhook deliveries/s through the dispatcher vs the same signed POSTs sent directly (ratio, target ≥ 0.5), and commit → delivered p99 at 200 events/s (target < 100 ms) (see bench/README.md)
	bash scripts/bench-webhooks.sh

bench-scaleout: ## 2 vs 1 relays and workers, each under a cgroup CPU cap, and the relay on a three-node R3 cluster (see bench/README.md)
	BENCH_RELAY_SCALEOUT=1 bash scripts/bench-relay.sh
