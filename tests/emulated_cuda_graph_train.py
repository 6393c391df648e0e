"""fairseq-train with CUDA graphs emulated on CPU (tests/cuda_graph_emulation.py), so that FLOATER's training
solves take their CUDA-graph path: one process, or one rank of a --distributed-no-spawn run."""
import argparse
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from fairseq import utils  # noqa: E402
from fairseq_cli.train import cli_main  # noqa: E402

from cuda_graph_emulation import capture_count, emulated_cuda_graphs  # noqa: E402

if __name__ == "__main__":
    utils.import_user_module(argparse.Namespace(user_dir=str(TESTS.parent / "fairseq_plugins")))
    sys.argv[0] = "fairseq-train"
    with emulated_cuda_graphs():
        cli_main()
    print(f"emulated CUDA graphs captured: {capture_count()}", flush=True)
