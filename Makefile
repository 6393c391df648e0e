# make demo                - set up .venv, build the toy task, train the tiny models on CPU, print BLEU
# DATA=multi30k make demo  - the same three models on Multi30k (MULTI30K_DIR=dir with the files, else download)
# make test                - set up .venv, run the test suite
# make test-fast           - the same without the slow tier (end-to-end training, several processes, matrices off
#                            their diagonal): under 4 minutes on 2 cores
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test test-fast bench clean

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

bench: setup
	@python scripts/bench.py $(BENCH_ARGS)

clean:
	rm -rf data/toy checkpoints/toy_* results/demo
