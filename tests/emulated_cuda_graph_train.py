"""fairseq-train with CUDA graphs emulated on CPU (tests/helpers/cuda_graph_emulation.py), so that FLOATER's training
solves take their CUDA-graph path: one process, or one rank of a --distributed-no-spawn run."""
import argparse
import sys
from pathlib import Path

from fairseq import utils
from fairseq_cli.train import cli_main

from helpers.cuda_graph_emulation import capture_count, emulated_cuda_graphs  # beside this file: its directory is on sys.path

TESTS = Path(__file__).resolve().parent

if __name__ == "__main__":
    utils.import_user_module(argparse.Namespace(user_dir=str(TESTS.parent / "fairseq_plugins")))
    sys.argv[0] = "fairseq-train"
    with emulated_cuda_graphs():
        cli_main()
    print(f"emulated CUDA graphs captured: {capture_count()}", flush=True)
