# dlock — make targets. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
GO ?= go
# Every module of the workspace (go.work), as directories.
MODULES = $(shell $(GO) list -m -f '{{.Dir}}')
# Debian packages providing the servers the tests start.
# gcc builds the safety harness's clock shim (safety/clock); zookeeper
# brings the server jar and default-jre (java) that zklock's tests start;
# postgresql and pgbouncer are started by internal/testserver (as the
# postgres user when the tests run as root); prometheus brings promtool,
# which checks and unit-tests dlockprom/alerts.yml; spin model-checks the
# protocols' Promela models (model/, make model).
DEB_PKGS := redis-server redis-sentinel gcc zookeeper postgresql pgbouncer prometheus spin
SERVER_BINS := redis-server redis-sentinel gcc java psql pgbouncer promtool spin
SERVER_FILES := /usr/share/java/zookeeper.jar /usr/lib/postgresql/*/bin/postgres
TEST_TIMEOUT ?= 20m
# How many modules' tests run at once, and how many of a package's
# parallel tests (t.Parallel) run at once: the tests mostly wait on
# servers and leases, so the latter exceeds the machine's cores. Two
# modules at once is the fastest on 2 cores (a fresh clone with a warm
# build cache: 10m33s, against 10m47s with 3 and 11m34s with 4) and
# starves the test processes least: with 4, the run queue stayed between
# 10 and 66 and a test process went unscheduled for seconds.
TEST_JOBS ?= 2
TEST_PARALLEL ?= 8
# test-long runs one module at a time: its scale tests (thousands of
# locks, a hundred waiters on a small pool) keep both cores busy on their
# own, and a module's tests run beside another's went unscheduled for
# seconds (a Redlock node "not answering" for 1s). It has no time budget.
LONG_JOBS ?= 1
# Modules test-long runs (default: all), as directories: make test-long
# LONG=redislock.
LONG ?=

# How long each fuzzer runs in `make test` (a smoke run on top of the
# committed seed corpora; run `make fuzz FUZZTIME=5m` for a real session).
# A count, not a duration: Go 1.26's fuzz coordinator can fail a target
# with "context deadline exceeded" when a duration ends while a worker is
# mid-call (golang/go#75804, fixed in Go 1.27), with no crasher found.
FUZZTIME ?= 20000x

.PHONY: all deps test test-long model vet fmt-check fuzz fuzz-quick release-check safety safety-quick safety-repro bench bench-quick demo examples build clean

all: test

## deps: install missing server binaries from Debian packages (as root).
deps:
	@missing=""; \
	for b in $(SERVER_BINS); do \
	  command -v $$b >/dev/null 2>&1 || [ -x /usr/sbin/$$b ] || [ -x /usr/bin/$$b ] || missing="$$missing $$b"; \
	done; \
	for f in $(SERVER_FILES); do ls $$f >/dev/null 2>&1 || missing="$$missing $$f"; done; \
	if [ -z "$$missing" ]; then echo "deps: all servers present ($(SERVER_BINS))"; exit 0; fi; \
	echo "deps: missing:$$missing"; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "deps: not root; install them with: sudo apt-get install -y $(DEB_PKGS)"; exit 1; \
	fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends $(DEB_PKGS) >/dev/null && \
	echo "deps: installed $(DEB_PKGS)"
	@# The TairString module (Tair's CAS and CAD for redis-server), a test
	@# fixture beside the checkout: built where internal/testserver looks
	@# for it (testserver.TairStringTarget). Tests that need it build it
	@# themselves too, or take DLOCK_TAIRSTRING.
	@src=../shared/tairstring; out="$${XDG_CACHE_HOME:-$$HOME/.cache}/dlock/tairstring.so"; \
	if [ -f $$src/build.sh ]; then \
	  mkdir -p "$$(dirname "$$out")" && bash $$src/build.sh "$$out.make.tmp" >/dev/null && mv "$$out.make.tmp" "$$out" && \
	  echo "deps: built the TairString module ($$out)"; \
	else echo "deps: no $$src beside the checkout: the Tair tests will skip (set DLOCK_TAIRSTRING to a built module)"; fi

## model: check every protocol model in model/ with SPIN (exhaustive),
## and make sure SPIN catches each model's mutants: one line per model
## (MODEL <name> states=N ... errors=0) and per mutant (MUTANT <name>/<n>
## errors=K); fails on an error in a model or a mutant not caught.
model: deps
	@echo "== model"
	@bash model/check.sh

## fmt-check: fail if gofmt would change a file.
fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## vet: go vet every module. make test sets VETFLAGS=-race, so that vet
## reuses the packages its race-enabled tests compiled instead of
## compiling every dependency once more.
VETFLAGS ?=
vet:
	@for m in $(MODULES); do (cd $$m && $(GO) vet $(VETFLAGS) ./...) || exit 1; done

## test: deps and the gofmt check, then race-enabled tests of every
## module (the long ones left out: -short), and beside them a short run
## of the small packages' fuzzers, the release check, a short safety run,
## the protocol models (make model, under a minute) and go vet (last: it
## reuses the tests' builds). The case studies run as
## the examples module's tests, not as programs a second time. It ends
## with each module's and step's wall time and the slowest tests.
test: deps fmt-check
	@$(GO) run ./internal/testrun -short -jobs $(TEST_JOBS) -parallel $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) \
	  -also '$(MAKE) --no-print-directory fuzz-quick' \
	  -also '$(MAKE) --no-print-directory release-check' \
	  -also '$(MAKE) --no-print-directory safety-quick' \
	  -also '$(MAKE) --no-print-directory model' \
	  -also '$(MAKE) --no-print-directory vet VETFLAGS=-race'

## test-long: the tests too long for every run (scale, failover
## matrices, repetition: each says why in its doc), with every other test
## of the modules in LONG (default: all), then every fuzzer and the full
## safety matrix (written to a temporary file; `make safety` rewrites
## docs/safety.md).
test-long: deps
	@set -e; t0=$$SECONDS; \
	$(GO) run ./internal/testrun -jobs $(LONG_JOBS) -parallel $(TEST_PARALLEL) -timeout 60m $(LONG); \
	if [ -z "$(LONG)" ]; then $(MAKE) --no-print-directory fuzz; fi; \
	t1=$$SECONDS; \
	if [ -z "$(LONG)" ]; then out=$$(mktemp); (cd safety && $(GO) run ./cmd/safety -out $$out); rm -f $$out; fi; \
	t2=$$SECONDS; \
	echo; echo "== make test-long: module tests $$((t1-t0))s, safety $$((t2-t1))s; $$((t2-t0))s in all"

## release-check: prove the modules install the way a user gets them: pack
## every module into a local module proxy at a throw-away version, then
## build, vet and `go install` a consumer with GOWORK=off and no replace.
release-check:
	@echo "== release-check"
	@$(GO) run ./internal/releasecheck

## fuzz: run each fuzzer for FUZZTIME (seed corpora in testdata/fuzz).
fuzz: fuzz-quick
	@echo "== fuzz FuzzParseURL ($(FUZZTIME))"
	@cd cmd/dlock && $(GO) test -run '^$$' -fuzz '^FuzzParseURL$$' -fuzztime $(FUZZTIME) -timeout 5m .

## fuzz-quick: the fuzzers of the small packages (make test runs these;
## FuzzParseURL's corpus runs in every go test of cmd/dlock, and its
## fuzzing, which builds the whole CLI instrumented, in make fuzz and
## make test-long).
fuzz-quick:
	@set -e; for f in FuzzNewConfig FuzzValidateKey; do \
	  echo "== fuzz $$f ($(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) -timeout 5m . ; \
	done
	@echo "== fuzz FuzzEscapeKey ($(FUZZTIME))"
	@cd zklock && $(GO) test -run '^$$' -fuzz '^FuzzEscapeKey$$' -fuzztime $(FUZZTIME) -timeout 5m .
	@echo "== fuzz FuzzParseNode ($(FUZZTIME))"
	@cd zklock && $(GO) test -run '^$$' -fuzz '^FuzzParseNode$$' -fuzztime $(FUZZTIME) -timeout 5m .
	@echo "== fuzz FuzzDecodeRecord ($(FUZZTIME))"
	@cd guard && $(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME) -timeout 5m .
	@echo "== fuzz FuzzRecordState ($(FUZZTIME))"
	@cd filelock && $(GO) test -run '^$$' -fuzz '^FuzzRecordState$$' -fuzztime $(FUZZTIME) -timeout 5m .

## build: the dlock command in bin/, its version (dlock version) from
## git describe when git is there (else the module's, or "devel").
build:
	$(GO) build -ldflags "-X main.version=$$(git describe --tags --always --dirty 2>/dev/null)" -o bin/dlock ./cmd/dlock

## demo: the fencing story with real processes, zero set-up (file backend).
demo: build
	./bin/dlock demo

## examples: run the case studies (examples/: inventory, nightly,
## transfer) on servers they start themselves; each prints its invariant
## lines and fails if one is not as expected. `make test` runs the same
## scenarios and checks as the examples module's tests.
examples: deps
	@set -e; for ex in inventory nightly transfer; do \
	  echo "== examples/$$ex"; \
	  (cd examples && $(GO) run ./$$ex); \
	done

## safety: the safety harness (safety/): worker processes under real
## faults on real servers; rewrites docs/safety.md. SEED=N replays a run.
SEED ?=
safety: deps
	cd safety && $(GO) run ./cmd/safety -out ../docs/safety.md $(if $(SEED),-seed $(SEED))

## safety-repro: replay one cell of the matrix: make safety-repro
## CASE=redis/client-pause SEED=<the seed in its row>.
safety-repro: deps
	@test -n "$(CASE)" -a -n "$(SEED)" || { echo "usage: make safety-repro CASE=backend/fault SEED=N"; exit 2; }
	cd safety && $(GO) run ./cmd/safety -case '$(CASE)' -seed $(SEED)

## safety-quick: a short run of the harness (part of make test), so it
## cannot rot: fails if the negative control shows no violation or the
## fenced register accepted a stale write.
safety-quick: deps
	@echo "== safety-quick"
	@cd safety && $(GO) run ./cmd/safety -quick $(if $(SEED),-seed $(SEED))

## bench: dlock against the raw-Redis floor and peer libraries, in one run
## on servers it starts itself; rewrites docs/benchmarks.md (~4 minutes).
bench: deps
	cd bench && $(GO) run ./cmd/dlockbench -out ../docs/benchmarks.md

## bench-quick: the same, short (a smoke test of the harness, ~1 minute).
bench-quick: deps
	cd bench && $(GO) run ./cmd/dlockbench -quick

clean:
	$(GO) clean -testcache
