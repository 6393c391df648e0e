# make demo  - set up .venv, build the toy task, train the tiny models on CPU, print BLEU
# make test  - set up .venv, run the test suite
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test clean

setup:
	@bash scripts/setup_env.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	@python -m pytest -q tests

clean:
	rm -rf data/toy checkpoints/toy_* results/toy_*
