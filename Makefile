# make demo                - set up .venv, build the toy task, train the tiny models on CPU, print BLEU
# DATA=multi30k make demo  - the same three models on Multi30k (MULTI30K_DIR=dir with the files, else download)
# make test                - set up .venv, run the test suite
# make test-fast           - the same without the slow tier (end-to-end training, several processes, matrices off
#                            their diagonal): under 4 minutes on 2 cores
# make gpu-bundle          - .gpu_bundle/: what a bare GPU image lacks (fairseq sdist, hydra-core, omegaconf, antlr4,
#                            bitarray for PYVER=3.12; Multi30k), for an offline set-up there (scripts/gpu_check.sh)
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test test-fast bench gpu-bundle clean

setup:
	@bash scripts/setup_env.sh

demo: setup
ifeq ($(DATA),multi30k)
	@bash scripts/recipes/multi30k_demo.sh
else
	@bash scripts/recipes/toy_demo.sh
endif

test: setup
	@python -m pytest -q tests --durations=15

test-fast: setup
	@python -m pytest -q tests -m "not slow"

gpu-bundle: setup
	@bash scripts/make_gpu_bundle.sh

bench: setup
	@python scripts/bench.py $(BENCH_ARGS)

clean:
	rm -rf data/toy checkpoints/toy_* results/demo
