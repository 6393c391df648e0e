"""Scaffolding for tests that build tiny models in-process: the plugins registered, a 24-word task, and one
intra-op thread per test module (import ``one_thread`` into the module: it is an autouse fixture)."""
import argparse
from pathlib import Path

import pytest
import torch
from fairseq import utils
from fairseq.data import Dictionary

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))

VOCAB = 24


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one intra-op thread avoids spinning threads fighting over a busy machine's cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Task:
    def __init__(self):
        d = Dictionary()
        for i in range(VOCAB - len(d)):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


TASK = Task()
PAD, EOS = TASK.source_dictionary.pad(), TASK.source_dictionary.eos()


def build_with_args(arch, seed=0, dropout=0.0, **kw):
    """(model, its args): an untrained `arch` on the 24-word task, built as fairseq builds it, seeded."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    torch.manual_seed(seed)
    args = argparse.Namespace(arch=arch, dropout=dropout, **kw)
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, TASK), args


def build(arch, seed=0, dropout=0.0, **kw):
    """An untrained `arch` on the 24-word task (every test that builds a tiny model in-process uses this)."""
    return build_with_args(arch, seed, dropout, **kw)[0]
