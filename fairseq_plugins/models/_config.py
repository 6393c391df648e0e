"""Shared helpers for the plugin models' build_model hooks and flags."""
import argparse

from omegaconf import OmegaConf

from ..flags import OneLineFlag, one_of


def as_namespace(args):
    """The model args as a plain Namespace.

    Under fairseq-hydra-train they arrive as an OmegaConf DictConfig, and fairseq's
    TransformerConfig.from_namespace copies only its own fields from one (it finds the extra keys with vars()),
    so the plugins' flags would be lost; from a Namespace it keeps them.
    """
    if OmegaConf.is_config(args):
        return argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
    return args


def add_attention_backend_arg(parser):
    """--attention-backend: the self-attention kernel of the score-bias schemes and Shaw's attention."""
    from ..modules.fused_attention import BACKENDS
    parser.add_argument("--attention-backend", action=OneLineFlag, parse=one_of(BACKENDS), metavar="NAME",
                        help="self-attention kernel: sdpa (default: the path measured so far; torch's SDPA for the "
                             "score biases, the project's own kernel for Shaw's) or flex (opt-in: on an H100 and an "
                             "H200 T5's and ALiBi's update took 2.1-6.4x the Transformer's against 0.8-1.5x on "
                             "sdpa, Shaw's 6.2-8.7x: results/gpu_check_notes.md; "
                             "torch's FlexAttention, compiled on CUDA, eager and unfused on CPU; no (T, S) "
                             "tensor for Shaw's value term; no attention dropout; incremental decoding keeps sdpa)")
