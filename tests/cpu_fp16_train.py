"""fairseq-train for --fp16 runs on CPU: fairseq's FP16Optimizer puts its flat float32 buffer on
``torch.cuda.current_device()``, which must name the CPU's device index (None) there. Nothing else differs."""
import sys

import torch

from fairseq_cli.train import cli_main

if __name__ == "__main__":
    torch.cuda.current_device = lambda: None
    sys.argv[0] = "fairseq-train"
    cli_main()
