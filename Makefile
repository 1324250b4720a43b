GO      ?= go
PKGS    ?= ./...
BENCH   ?= .
BIN     ?= bin

.PHONY: all build test bench lint fuzz dev sim k8s chaos

all: lint build test

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: every test, with the race detector, then the manifests' checks
## (K8S_TEST, as make k8s), through internal/testsummary: go test's usual
## output, then "N passed, N failed, N skipped" and, when tests skipped
## for a missing program (redis-server, promtool, chromium), a line that
## counts them by program; under CI=true a missing program fails its tests
test:
	$(GO) build -o $(BIN)/testsummary ./internal/testsummary
	GO='$(GO)' $(BIN)/testsummary -race -count=1 $(PKGS) --- $(K8S_TEST)

## k8s: render deploy/kubernetes with kustomize and check every object, the
## alert rules and the Dockerfile (its own module: deploy/kubernetes/validate;
## -count=1 because the manifests live outside that module's folder)
K8S_TEST = -C deploy/kubernetes/validate -count=1 ./...
k8s:
	$(GO) test $(K8S_TEST)

## bench: the engine's benchmarks (targets in docs/design.md section 10)
bench:
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem $(PKGS)

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

## fuzz: a short run of every decoder's fuzz test
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseConfig -fuzztime=30s .
	$(GO) test -run='^$$' -fuzz=FuzzParseEnvoyConfig -fuzztime=30s .
	$(GO) test -run='^$$' -fuzz=FuzzDecodeBatch -fuzztime=30s ./crdt
	$(GO) test -run='^$$' -fuzz=FuzzCheckItems -fuzztime=30s ./regional
	$(GO) test -run='^$$' -fuzz=FuzzDecodeMessage -fuzztime=30s ./regional/peersync
	$(GO) test -run='^$$' -fuzz=FuzzFleetAck -fuzztime=30s ./coordinator/wire

## sim: run every simulator scenario; reports and plots in sim/out/NAME
sim:
	$(GO) build -o $(BIN)/allot ./cmd/allot
	@for f in sim/scenarios/*.yaml; do n=$$(basename $$f .yaml); \
		$(BIN)/allot sim run $$f --out sim/out/$$n > sim/out-$$n.log 2>&1 || { cat sim/out-$$n.log; exit 1; }; \
		rm -f sim/out-$$n.log; echo "sim/out/$$n"; done

## chaos: the chaos end-to-end test's long form over a local cluster of real
## processes: ALLOT_CHAOS_DURATION (default 10m) in ~60 s chaos cycles;
## ALLOT_CHAOS_DIR keeps logs and report.md
chaos:
	ALLOT_CHAOS_DURATION=$${ALLOT_CHAOS_DURATION:-10m} $(GO) test -count=1 -run '^TestChaos$$' -v -timeout 0 ./internal/chaos/

## dev: the embedded default (gRPC 127.0.0.1:8081, HTTP 127.0.0.1:8080)
dev:
	$(GO) run ./cmd/allot dev

## proto: regenerate the Go code of proto/ with pinned plugins
PROTOC_GEN_GO      := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
PROTO_FILES        := $(shell find proto -name '*.proto')

.PHONY: proto verify-proto proto-tools
proto-tools:
	@command -v protoc >/dev/null || { echo "protoc is missing: apt-get install -y protobuf-compiler"; exit 1; }
	GOBIN=$(CURDIR)/$(BIN) $(GO) install $(PROTOC_GEN_GO)
	GOBIN=$(CURDIR)/$(BIN) $(GO) install $(PROTOC_GEN_GO_GRPC)

proto: proto-tools
	PATH=$(CURDIR)/$(BIN):$$PATH protoc -I proto -I /usr/include \
		--go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
		$(PROTO_FILES)

## verify-proto: fail if the committed generated code differs from a fresh run
verify-proto: proto-tools
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	PATH=$(CURDIR)/$(BIN):$$PATH protoc -I proto -I /usr/include \
		--go_out=$$tmp --go_opt=paths=source_relative \
		--go-grpc_out=$$tmp --go-grpc_opt=paths=source_relative \
		$(PROTO_FILES) && \
	for f in $$(cd $$tmp && find . -name '*.go'); do \
		cmp -s $$tmp/$$f proto/$$f || { echo "proto/$$f is out of date: run make proto"; exit 1; }; \
	done; \
	extra=$$(cd proto && find . -name '*.pb.go' | while read f; do [ -f $$tmp/$$f ] || echo $$f; done); \
	[ -z "$$extra" ] || { echo "generated files without a .proto: $$extra"; exit 1; }; \
	echo "proto: generated code is up to date"
