#!/usr/bin/env python
"""What each position scheme costs, as ratios to fairseq's Transformer measured in the same run: training
update, beam-search decoding and peak memory per sequence length, or (--count-ops) operators and host syncs.

The protocol is in scripts/tooling/bench/phases.py's docstring (the measurements); scripts/tooling/bench/report.py
writes the markdown. Usage: python scripts/bench/bench.py [--quick] [--device cpu|cuda] [--out-json F] [--out-md F]
(make bench: BENCH_ARGS).

--regime measures instead what users train with (scripts/tooling/bench/regime.py's docstring): a newstest-like
length mix batched by fairseq under --max-tokens, fairseq's Trainer in each --precision, beam-4 decoding; tokens
per second, ratios to the Transformer, FLOPs per update and the fraction of the device's bf16 matmul rate.
Verified on CPU only (tests/test_bench.py, tiny dims); it has not yet run on a GPU.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling library
from tooling.bench.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
