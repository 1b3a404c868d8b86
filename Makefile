# Loom developer targets. CI runs .ci/run, which runs the same checks as `make lint test`.
GO ?= go
FUZZTIME ?= 3s
STATICCHECK ?= $(shell $(GO) env GOPATH)/bin/staticcheck

.PHONY: build test lint bench gpu-test fuzz

# A plain build: backend/cpu's vector kernels are Go assembly, chosen at run time by CPU
# feature detection (LOOM_CPU_KERNELS forces a set; -tags purego leaves the portable ones).
build:
	CGO_ENABLED=0 $(GO) build -o loom ./cmd/loom

test:
	$(GO) test ./...

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	$(STATICCHECK) ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# GPU tests skip themselves where no GPU is found; with LOOM_REQUIRE_GPU=1 (internal/gputest) a
# missing GPU, or fewer GPUs than a test needs, fails instead. The machine needs 2 GPUs for the
# peer, NCCL and tp=2 tests; LOOM_LONG_CONTEXT=1 adds the 32,000-token bf16-against-f32 run.
# On the GPU machine (no Go there): CGO_ENABLED=0 go test -c -o .bin/cuda.test ./backend/cuda,
# then LOOM_REQUIRE_GPU=1 .bin/cuda.test -test.v (LOOM_CUDA_TIMINGS=1 adds kernel timings).
gpu-test:
	NCCL_NVLS_ENABLE=0 LOOM_REQUIRE_GPU=1 $(GO) test -v ./internal/gputest/ ./cubind/... ./backend/cuda/... ./dist/nccl/...
	NCCL_NVLS_ENABLE=0 LOOM_REQUIRE_GPU=1 LOOM_LONG_CONTEXT=1 $(GO) test -v -timeout 30m -run 'CUDA|Device|MultiProc' ./engine/
	LOOM_REQUIRE_GPU=1 $(GO) test -v -run TestGenerateDevice ./cmd/loom/

# Every fuzz target (tools/fuzz.sh finds them) for FUZZTIME each, e.g. make fuzz FUZZTIME=1m.
fuzz:
	FUZZTIME=$(FUZZTIME) tools/fuzz.sh
