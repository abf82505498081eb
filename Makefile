# zerobench's entry point. Every target does the setup it depends on.
#
#   make setup   Debian packages + libtorch 2.11.0 from the PyPI wheels (idempotent)
#   make build   release binaries: target/release/zerobench, target/release/zerobench-worker
#   make env     the export lines a shell needs to run them:  eval "$(make -s env)"
#   make test    cargo fmt --check, clippy and rustdoc -D warnings, then every test, against real
#                MPI processes, real libtorch and a real local Slurm
#   make demo    the main job: a small sweep end to end on this host, then its tables
#   make mutants mutation testing of schema, launcher and ingest (cargo-mutants; hours)

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

ROOT := $(CURDIR)
CACHE ?= $(ROOT)/.cache
LIBTORCH := $(CACHE)/libtorch
BIN := $(ROOT)/target/release

# What the binaries and cargo need; `make env` prints the same.
export LIBTORCH
export LD_LIBRARY_PATH := $(LIBTORCH)/lib$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH))
export ZEROBENCH_WORKER := $(BIN)/zerobench-worker
# Open MPI refuses root unless told; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

CARGO ?= cargo
CARGO_FLAGS ?= --release --locked

.PHONY: setup setup-system setup-libtorch build env test demo mutants clean-cache

setup: setup-system setup-libtorch

setup-system:
	@scripts/setup-system.sh

setup-libtorch:
	@ZEROBENCH_CACHE=$(CACHE) scripts/setup-libtorch.sh

build: setup
	$(CARGO) build $(CARGO_FLAGS) --workspace --bins

env:
	@echo "export LIBTORCH=$(LIBTORCH)"
	@echo "export LD_LIBRARY_PATH=$(LD_LIBRARY_PATH)"
	@echo "export PATH=$(BIN):\$$PATH"
	@echo "export ZEROBENCH_WORKER=$(ZEROBENCH_WORKER)"
	@echo "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"

test: build
	scripts/test.sh

demo: build
	scripts/demo.sh

# Mutation testing of schema, launcher and ingest (hours on 2 cores; not part of `make test`).
mutants:
	scripts/mutants.sh
	python3 scripts/mutants-summary.py > bench/results/mutants-summary.json

clean-cache:
	rm -rf $(CACHE)
