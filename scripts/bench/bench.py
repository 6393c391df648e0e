#!/usr/bin/env python
"""The benchmark: what each position scheme costs against fairseq's Transformer (python scripts/bench/bench.py
--help; the flags and what they measure: scripts/tooling/bench/cli.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling library
from tooling.bench.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
