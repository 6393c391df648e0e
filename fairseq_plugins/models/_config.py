"""Shared helpers for the plugin models' build_model hooks and flags."""
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

