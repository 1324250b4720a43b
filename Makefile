GO      ?= go
PKGS    ?= ./...
BENCH   ?= .
BIN     ?= bin

.PHONY: all build test bench lint fuzz dev

all: lint build test

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: every test, with the race detector
test:
	$(GO) test -race -count=1 $(PKGS)

## bench: the engine's benchmarks (targets in DESIGN.md section 10)
bench:
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem $(PKGS)

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

## fuzz: a short run of every decoder's fuzz test
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseConfig -fuzztime=30s .
	$(GO) test -run='^$$' -fuzz=FuzzDecodeBatch -fuzztime=30s ./crdt

## dev: check the example configuration against the engine
dev:
	$(GO) run ./cmd/allot example
