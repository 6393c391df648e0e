"""What users and checkpoints depend on in each architecture the plugins register, recorded from the code: its
registered model; its values of that model's flags once fairseq-train's parser and the architecture function ran;
and the model fairseq-train builds from them (a 100-symbol dictionary, fairseq's default seed), every parameter and
buffer in ``named_parameters()`` / ``named_buffers()`` order with its shape, dtype and a digest of its seeded
initial values. Per model: every flag its ``add_args`` adds, its default and whether ``--arch X --help`` lists it.

The order matters beyond names: an optimizer's state is restored by position (two same-shaped tensors swapped
would swap their Adam moments without a word), and the build's order fixes which random draws each tensor gets.
tests/data/golden_architectures.json holds today's record; tests/test_golden_architectures.py compares."""
import argparse
import contextlib
import hashlib
import io
import json
import re
from pathlib import Path

import torch
from fairseq import options
from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_REGISTRY

from helpers import tiny_models  # noqa: F401  (registers the plugins)
from tooling import atomic
from tooling.bench.models import synthetic_dictionary

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden_architectures.json"
SYMBOLS = 100  # fairseq's 4 specials + 96 words: small embeddings, so that the big archs build at their own dims
SEED = 1  # fairseq-train's default --seed
DIGEST_HEX = 16  # 64 bits of each tensor's sha256: any change shows, and the file stays small
# fairseq's mark of the model's dtype (SinusoidalPositionalEmbedding's torch.FloatTensor(1)): allocated and never
# written, so its value is whatever the memory held (two builds differ); its name, shape and dtype still count
UNSET = "_float_tensor"


class Task:
    """What build_model reads of fairseq's translation task: one dictionary of SYMBOLS, shared."""

    def __init__(self):
        self.source_dictionary = self.target_dictionary = synthetic_dictionary(SYMBOLS)


def plugin_architectures():
    """Every architecture whose model class the plugins define, sorted."""
    return sorted(a for a, model in ARCH_MODEL_REGISTRY.items() if model.__module__.startswith("fairseq_plugins"))


def jsonable(value):
    """A flag's value as JSON keeps it: numbers, strings, booleans and None as they are, anything else its repr."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return repr(value)


def model_parser(model):
    parser = argparse.ArgumentParser(add_help=False)
    MODEL_REGISTRY[model].add_args(parser)
    return parser


def model_flags(model):
    """The model's flags in the order add_args adds them: "--flag [--other] -> dest = default", "(unlisted)" where
    --help does not show it (another scheme's flag: accepted, hidden)."""
    lines = []
    for action in model_parser(model)._actions:
        unlisted = " (unlisted)" if action.help == argparse.SUPPRESS else ""
        lines.append(f"{' '.join(action.option_strings)} -> {action.dest} = "
                     f"{json.dumps(jsonable(action.default))}{unlisted}")
    return lines


def arch_args(arch):
    """fairseq-train's arguments for ``--arch arch`` alone: parsed, then the architecture function's values."""
    return options.parse_args_and_arch(options.get_training_parser(),
                                       ["data", "--arch", arch, "--user-dir", str(REPO / "fairseq_plugins")])


def help_listing(arch):
    """The flags ``fairseq-train --arch arch --help`` lists (each option line's), from fairseq's own parser."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        options.parse_args_and_arch(options.get_training_parser(), ["data", "--arch", arch, "--user-dir",
                                                                    str(REPO / "fairseq_plugins"), "--help"])
    return {flag for line in text.getvalue().splitlines() if line.startswith("  -")
            for flag in re.findall(r"(?:^|, )(--?[\w-]+)", line.strip())}


def arch_values(arch, args):
    """The arch's values of its model's flags where they differ from the flag's default (the model's record has
    the defaults): what the architecture function sets."""
    defaults = {a.dest: a.default for a in model_parser(ARCH_MODEL_NAME_REGISTRY[arch])._actions}
    return {dest: jsonable(getattr(args, dest)) for dest, default in sorted(defaults.items())
            if hasattr(args, dest) and jsonable(getattr(args, dest)) != jsonable(default)}


def digest(tensor):
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


def tensors(model, digests=True):
    """(parameters, buffers): one line per tensor in the model's own order, "name shape dtype [digest]"; a buffer
    that a checkpoint does not hold says so."""
    saved = set(model.state_dict())

    def line(name, t):
        shape = "x".join(map(str, t.shape)) or "scalar"
        entry = f"{name} {shape} {str(t.dtype).replace('torch.', '')}"
        if digests:
            entry += " unset" if name.rsplit(".", 1)[-1] == UNSET else f" {digest(t)}"
        return entry + ("" if name in saved else " (not saved)")

    return ([line(n, p) for n, p in model.named_parameters()], [line(n, b) for n, b in model.named_buffers()])


def record(arch, digests=True):
    """The arch's record; digests=False builds on the meta device (names, shapes and dtypes only, at no cost)."""
    args = arch_args(arch)
    values = arch_values(arch, args)
    torch.manual_seed(SEED)
    with torch.device("cpu" if digests else "meta"):
        model = ARCH_MODEL_REGISTRY[arch].build_model(args, Task())
    parameters, buffers = tensors(model, digests)
    return {"model": ARCH_MODEL_NAME_REGISTRY[arch], "values": values, "parameters": parameters, "buffers": buffers}


def without_digests(arch_record):
    """A recorded arch as record(arch, digests=False) gives it."""
    def strip(line):
        name, shape, dtype, _digest, *saved = line.split(" ", 4)
        return " ".join((name, shape, dtype, *saved))
    return {**arch_record, "parameters": [strip(x) for x in arch_record["parameters"]],
            "buffers": [strip(x) for x in arch_record["buffers"]]}


def torch_release():
    """torch's major.minor: the seeded values are its random draws (a cluster's own torch may draw otherwise)."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def full_record():
    archs = plugin_architectures()
    return {"symbols": SYMBOLS, "seed": SEED, "torch": torch_release(),
            "models": {m: model_flags(m) for m in sorted({ARCH_MODEL_NAME_REGISTRY[a] for a in archs})},
            "architectures": {a: record(a) for a in archs}}


def first_difference(recorded, got, where):
    """None, or one line naming `where` and the first entry that differs between two records (dicts by key,
    lists by position)."""
    if isinstance(recorded, dict) and isinstance(got, dict):
        for key in sorted(set(recorded) | set(got)):
            if key not in got or key not in recorded:
                what, value = ("missing", recorded[key]) if key not in got else ("new", got[key])
                return f"{where}: {key!r} is {what} ({value!r})"
            found = first_difference(recorded[key], got[key], f"{where} {key}")
            if found:
                return found
        return None
    if isinstance(recorded, list) and isinstance(got, list):
        for i, (old, new) in enumerate(zip(recorded, got)):
            if old != new:
                return f"{where}[{i}]: recorded {old!r}, now {new!r}"
        n = min(len(recorded), len(got))
        if len(recorded) > n:
            return f"{where}[{n}]: missing {recorded[n]!r}"
        if len(got) > n:
            return f"{where}[{n}]: new {got[n]!r}"
        return None
    return None if recorded == got else f"{where}: recorded {recorded!r}, now {got!r}"


def write(path=GOLDEN):
    """Record today's code."""
    atomic.write_text(path, json.dumps(full_record(), indent=1, sort_keys=True) + "\n")
    return path
