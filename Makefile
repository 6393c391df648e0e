# make demo                - set up .venv, build the toy task, train the tiny models on CPU, print BLEU
# DATA=multi30k make demo  - the same three models on Multi30k (MULTI30K_DIR=dir with the files, else download)
# make test                - set up .venv, run the test suite
# make test-fast           - the same without the slow tier (end-to-end training, several processes, matrices off
#                            their diagonal): under 4 minutes on 2 cores; fails if a test it runs takes over
#                            TIER_MAX_SECONDS (30) CPU seconds on its own
# make gpu-bundle          - .gpu_bundle/: what a bare GPU image lacks (fairseq sdist, hydra-core, omegaconf, antlr4,
#                            bitarray for PYVER=3.12; Multi30k), for an offline set-up there (scripts/gpu/gpu_check.sh)
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test test-fast bench gpu-bundle clean

setup:
	@bash scripts/setup_env.sh

demo: setup
ifeq ($(DATA),multi30k)
	@bash scripts/demos/multi30k_demo.sh
else
	@bash scripts/demos/toy_demo.sh
endif

# Both tiers run one pytest-xdist worker per core, two at most (JOBS=1: one process); loadfile keeps each test
# file on one worker, so a module fixture is made once. (Not loadgroup: pytest-xdist 3.8 marks a group by
# rewriting an item's _nodeid, which pytest 9 no longer reads, so groups are silently ignored.) The fast tier fails
# listing any test not marked slow that took over TIER_MAX_SECONDS on its own (tests/helpers/tier_clock.py).
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 2 ? n : 2 )))
TIER_MAX_SECONDS ?= 30
PYTEST := python -m pytest -q tests -n $(JOBS) --dist loadfile --durations=15

test: setup
	@$(PYTEST)

test-fast: setup
	@TIER_MAX_SECONDS=$(TIER_MAX_SECONDS) $(PYTEST) -m "not slow"

gpu-bundle: setup
	@bash scripts/gpu/make_gpu_bundle.sh

bench: setup
	@python scripts/bench/bench.py $(BENCH_ARGS)

clean:
	rm -rf data/toy checkpoints/toy_* results/demo
