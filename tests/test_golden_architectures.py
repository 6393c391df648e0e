"""What users and checkpoints depend on, for every architecture the plugins register, is what
tests/data/golden_architectures.json recorded (tests/helpers/architecture_record.py): the architecture names and
their registered models; each model's flags, defaults and --help listing; each architecture's values of them; and
the model fairseq-train builds (a 100-symbol dictionary, seed 1), every parameter and buffer by name, shape and dtype
in its order, and a digest of its seeded initial values. A failure names the architecture (or model) and the first
entry that differs.

A deliberate change (a new scheme's architectures, a new flag, a parameter renamed with its checkpoint upgrade) is
recorded again with

    python tests/test_golden_architectures.py --write

and the diff of tests/data/golden_architectures.json is then exactly what the change does to users and checkpoints.

Names, shapes and dtypes are compared for every architecture in the fast tier (built on the meta device: no
values, no cost), and so are the tiny architectures' values; the other sizes' values (fairseq's big at its own dims,
about 40 CPU s in all) in the slow tier."""
import json
import sys

import pytest

from conftest import REPO  # noqa: F401  (this checkout's code first on the path, also when run as a script)
from helpers import architecture_record as golden
from helpers.tiny_models import one_thread  # noqa: F401  (autouse)

RECORDED = json.loads(golden.GOLDEN.read_text(encoding="utf-8"))
ARCHS = sorted(RECORDED["architectures"])
AGAIN = "a deliberate change: python tests/test_golden_architectures.py --write, then read its diff"


def check(got, recorded, where):
    difference = golden.first_difference(recorded, got, where)
    assert difference is None, f"{difference}\n({AGAIN})"


def test_the_record_has_every_plugin_architecture_and_no_other():
    registered = golden.plugin_architectures()
    new, gone = sorted(set(registered) - set(ARCHS)), sorted(set(ARCHS) - set(registered))
    assert not new and not gone, f"registered, not recorded: {new}; recorded, no longer registered: {gone}\n({AGAIN})"
    check({a: golden.ARCH_MODEL_NAME_REGISTRY[a] for a in registered},
          {a: r["model"] for a, r in RECORDED["architectures"].items()}, "registered model of")
    check(golden.SYMBOLS, RECORDED["symbols"], "dictionary size")
    check(golden.SEED, RECORDED["seed"], "seed")


@pytest.mark.parametrize("model", sorted(RECORDED["models"]))
def test_each_model_s_flags_defaults_and_help_listing(model):
    check(golden.model_flags(model), RECORDED["models"][model], f"{model}'s flags")


@pytest.mark.parametrize("model", sorted(RECORDED["models"]))
def test_the_recorded_listing_is_what_help_prints(model):
    """What the record calls listed is what ``fairseq-train --arch X --help`` prints, for each arch of the model."""
    for arch in [a for a in ARCHS if RECORDED["architectures"][a]["model"] == model]:
        printed = golden.help_listing(arch)
        for line in RECORDED["models"][model]:
            listed = not line.endswith(" (unlisted)")
            for flag in line.split(" -> ")[0].split():
                assert (flag in printed) == listed, f"--arch {arch} --help {'omits' if listed else 'lists'} {flag}"


@pytest.mark.parametrize("arch", ARCHS)
def test_parameters_and_buffers_by_name_shape_dtype_and_order(arch):
    """The meta-device build: also each architecture's registered model and flag values."""
    check(golden.record(arch, digests=False), golden.without_digests(RECORDED["architectures"][arch]), arch)


@pytest.mark.parametrize("arch", [pytest.param(a, marks=() if a.endswith("_tiny") else pytest.mark.slow)
                                  for a in ARCHS])
def test_seeded_initial_values(arch):
    if golden.torch_release() != RECORDED["torch"]:  # names, shapes and order are still compared above
        pytest.skip(f"the values were drawn by torch {RECORDED['torch']}'s generator; this is torch "
                    f"{golden.torch_release()} (make setup's .venv has the pinned one)")
    check(golden.record(arch), RECORDED["architectures"][arch], arch)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write  (records today's code in {golden.GOLDEN})")
    print(f"wrote {golden.write()}")
