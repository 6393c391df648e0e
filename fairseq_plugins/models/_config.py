"""Shared helper for the plugin models' build_model hooks."""
import argparse

from omegaconf import OmegaConf


def as_namespace(args):
    """The model args as a plain Namespace.

    Under fairseq-hydra-train they arrive as an OmegaConf DictConfig, and fairseq's
    TransformerConfig.from_namespace copies only its own fields from one (it finds the extra keys with vars()),
    so the plugins' flags would be lost; from a Namespace it keeps them.
    """
    if OmegaConf.is_config(args):
        return argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
    return args


class OneLineFlag(argparse.Action):
    """A plugin flag parsed and checked by ``parse`` (text → value, ValueError with the message): a bad value
    stops the command with one line on stderr, where argparse's own ``type=``/``choices=`` errors print
    fairseq's whole usage first."""

    def __init__(self, option_strings, dest, parse=str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.parse = parse

    def __call__(self, parser, namespace, text, option_string=None):
        try:
            value = self.parse(text)
        except ValueError as err:
            parser.exit(2, f"{parser.prog}: error: argument {option_string}: {err}\n")
        setattr(namespace, self.dest, value)


def positive(kind):
    """A finite number (kind float) or an integer (kind int) > 0."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise ValueError(f"must be > 0, got {text}")
        return value

    return parse


def at_least(kind, low):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not value >= low:
            raise ValueError(f"must be >= {low}, got {text}")
        return value

    return parse


def one_of(names, why=""):
    def parse(text):
        if text not in names:
            raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(names)}){why}")
        return text

    return parse


def add_attention_backend_arg(parser):
    """--attention-backend: the self-attention kernel of the score-bias schemes and Shaw's attention."""
    from ..modules.fused_attention import BACKENDS
    parser.add_argument("--attention-backend", action=OneLineFlag, parse=one_of(BACKENDS), metavar="NAME",
                        help="self-attention kernel: sdpa (default: the path measured so far; torch's SDPA for the "
                             "score biases, the project's own kernel for Shaw's; flex on an H100 recompiled until "
                             "dynamo's limit and ran unfused, 1.5-41x slower: results/gpu_check_notes.md; it now "
                             "compiles once per kind of call, not yet measured on a GPU) or "
                             "flex (torch's FlexAttention, compiled on CUDA, eager and unfused on CPU; no (T, S) "
                             "tensor for Shaw's value term; no attention dropout; incremental decoding keeps sdpa)")
