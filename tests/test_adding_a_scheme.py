"""docs/position_schemes.md's "Adding a scheme" is what a new scheme needs: every file its steps name exists (a
``<name>`` in a path: for each scheme of the table that has one), every home from which the tests read a scheme
(its reference, its flags' values, its embedding's evaluation positions, its figures' title and equation, its
WMT14 config) is named in the steps and exists where they say, and the docs' table has a row for every row of
``SCHEMES``."""
import dataclasses
import re

import pytest

from conftest import REPO
from helpers import scheme_references
from fairseq_plugins.modules.position_scheme import PositionScheme
from fairseq_plugins.schemes import FAMILY_SCHEMES, NEW_SCHEMES, SCHEMES

DOC = REPO / "docs" / "position_schemes.md"
TESTS = REPO / "tests" / "test_position_schemes.py"


def steps():
    """The numbered steps of "Adding a scheme": one paragraph."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("**Adding a scheme**")
    return text[start:text.index("\n\n", start)]


def named(text):
    """What the text names in backquotes."""
    return set(re.findall(r"`([^`]+)`", text))


def test_every_file_the_steps_name_exists():
    paths = [n for n in named(steps()) if re.fullmatch(r"[\w./<>-]+\.(py|yaml|md)|[\w/]+/", n)]
    assert "tests/helpers/scheme_references.py" in paths and "configs/scheme/<name>.yaml" in paths, paths
    for path in paths:
        names = NEW_SCHEMES if "<name>" in path else ("",)
        for name in names:
            concrete = path.replace("<name>", name)
            where = [REPO / concrete, REPO / "fairseq_plugins" / concrete]  # modules/...: the package's
            assert any(p.exists() for p in where), f"docs/position_schemes.md, Adding a scheme, names {concrete}"


def test_the_steps_name_every_home_the_tests_read_a_scheme_from():
    tests = TESTS.read_text(encoding="utf-8")
    homes = {  # what a step must name: whether it is where the docs say
        scheme_references.HOME: (REPO / scheme_references.HOME).is_file(),
        "REFERENCES": isinstance(scheme_references.REFERENCES, dict),
        "OTHER_VALUES": "\nOTHER_VALUES = {" in tests,
        "first_block_input_naive": "\ndef first_block_input_naive(" in tests,
        "tests/test_position_schemes.py": TESTS.is_file(),
        "SCHEMES": all(row.name == name for name, row in SCHEMES.items()),  # the table: its rows by name
        "fairseq_plugins/schemes.py": (REPO / "fairseq_plugins" / "schemes.py").is_file(),
        "title": isinstance(PositionScheme.title, str),
        "equation": isinstance(PositionScheme.equation, str),
        "configs/scheme/<name>.yaml": all((REPO / "configs" / "scheme" / f"{n}.yaml").is_file() for n in NEW_SCHEMES),
        "tests/test_configs.py": (REPO / "tests" / "test_configs.py").is_file(),
        "tests/data/golden_architectures.json": (REPO / "tests" / "data" / "golden_architectures.json").is_file(),
    }
    text = steps()
    missing = sorted(home for home in homes if home not in named(text))
    assert not missing, f"docs/position_schemes.md, Adding a scheme, does not name {', '.join(missing)}"
    assert all(homes.values()), [home for home, there in homes.items() if not there]
    # the failure the steps quote is the one the tests give
    quoted = re.search(r'"(no reference for) NAME"', text)
    assert quoted, "the steps quote the missing reference's failure"
    with pytest.raises(LookupError, match=f"^{quoted.group(1)} throwaway: add one to {scheme_references.HOME}"):
        scheme_references.reference("throwaway")


def test_the_docs_table_has_every_scheme():
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    in_docs = [re.match(r"\| `(\w+)`", line).group(1) for line in rows]
    assert in_docs == list(SCHEMES), "docs/position_schemes.md's table: one row per row of SCHEMES, in its order"


def test_a_row_without_its_model_class_fails_naming_the_class_the_steps_show(monkeypatch):
    """Step 2's model class: the plugins' import checks that every row of position_transformer's family has its
    class, in the table's order; a row without one fails naming the class to write, which is the steps' form."""
    from fairseq_plugins.models import position_transformer as pt

    pt.check_family_models()  # today's table and classes
    monkeypatch.setitem(SCHEMES, "throwaway", dataclasses.replace(SCHEMES["alibi"], name="throwaway",
                                                                  arch_prefix="throwaway_transformer"))
    decorator, = (n for n in named(steps()) if n.startswith("@register_model("))
    cls, = (n for n in named(steps()) if n.startswith("class <Name>"))
    form = f"{decorator} {cls}".replace("<name>", "throwaway").replace("<Name>", "Throwaway")
    last = FAMILY_SCHEMES[-1]
    with pytest.raises(ImportError, match=f"scheme throwaway needs its model class, after the class of {last} "
                                          rf"\(the table's order\): {re.escape(form)}$"):
        pt.check_family_models((*FAMILY_SCHEMES, "throwaway"))
    # a class missing, or out of the table's order, is named the same way
    without = {n: m for n, m in pt.FAMILY_MODELS.items() if n != "rope"}
    with pytest.raises(ImportError, match=r"scheme rope needs its model class, after the class of fire .*"
                                          r"class RopeTransformerModel\(PositionTransformerModel, family=\"rope\"\)"):
        pt.check_family_models(models=without)


# ---- the worked example, followed on a copy of the package ------------------------------------------------------

DECODE_CHECK = """
import sys, torch
from fairseq import checkpoint_utils
import fairseq_plugins
assert fairseq_plugins.__file__.startswith(sys.argv[2]), fairseq_plugins.__file__  # the copy, not the repo's
torch.set_num_threads(1)
models, _, _ = checkpoint_utils.load_model_ensemble_and_task([sys.argv[1]])
model = models[0].double().eval()
print(type(model).__name__, type(model.encoder.position_scheme).__name__)
EOS, PAD = 2, 1
src = torch.tensor([[4, 5, 6, 7, 8, EOS], [PAD, PAD, 9, 5, 10, EOS]])
prev = torch.tensor([[EOS, 8, 7, 6, 5, 4], [EOS, 11, 5, 12, PAD, PAD]])
with torch.no_grad():
    encoder_out = model.encoder(src, src_lengths=src.ne(PAD).sum(1))
    full = model.get_normalized_probs(model.decoder(prev, encoder_out=encoder_out), log_probs=True)
    state = {}
    for t in range(prev.size(1)):
        step = model.get_normalized_probs(model.decoder(prev[:, :t + 1], encoder_out=encoder_out,
                                                        incremental_state=state), log_probs=True)
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=1e-9)
print("incremental == full")
"""


def worked_example():
    """The three code blocks of the worked example: the module, the row, the model class."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("**A worked example")
    section = text[start:text.index("\n## ", start)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 3, "the worked example is three python blocks: the module, the row, the class"
    module_file, = re.findall(r"saved as `fairseq_plugins/(modules/\w+\.py)`", section)
    import_line, = re.findall(r"`(from \.modules\.\w+ import \w+)`", section)
    return blocks, module_file, import_line


@pytest.mark.slow
def test_the_worked_example_trains_and_decodes(tmp_path, tmp_path_factory):
    """docs/position_schemes.md's worked example, followed as written on a copy of the package: its module saved
    where it says, its row last in SCHEMES with the import it names, its model class after the others; then
    fairseq-train trains the new architecture on the small corpus (the loss falls), fairseq-generate decodes with
    it, and step-by-step decoding of the checkpoint equals its full forward."""
    import shutil
    import subprocess
    import sys

    from conftest import BIN, env
    from helpers.small_task import ONE_THREAD, small_data, train_cmd

    (module, row, model_class), module_file, import_line = worked_example()
    package = tmp_path / "fairseq_plugins"
    shutil.copytree(REPO / "fairseq_plugins", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / module_file).write_text(module, encoding="utf-8")
    schemes = (package / "schemes.py").read_text(encoding="utf-8")
    last_import = schemes.index("\n", schemes.index("from .modules.t5_bias import T5Bias"))
    end_of_table = schemes.index("\n)}\n")
    schemes = (schemes[:last_import] + "\n" + import_line + schemes[last_import:end_of_table] + "\n"
               + row.rstrip("\n") + schemes[end_of_table:])
    (package / "schemes.py").write_text(schemes, encoding="utf-8")
    models = (package / "models" / "position_transformer.py").read_text(encoding="utf-8")
    after_last_class = models.index("\n\ndef check_slots(")
    models = models[:after_last_class] + "\n\n\n" + model_class.rstrip("\n") + models[after_last_class:]
    (package / "models" / "position_transformer.py").write_text(models, encoding="utf-8")
    name = re.search(r'family="(\w+)"', model_class).group(1)
    arch = f"{name}_transformer_tiny"

    data = small_data(tmp_path_factory)
    copy_env = {**env(), **ONE_THREAD, "PYTHONPATH": str(tmp_path)}  # the copy alone: not the repository's

    def run_here(cmd):
        proc = subprocess.run(cmd, cwd=tmp_path, env=copy_env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
        assert proc.returncode == 0, proc.stdout[-3000:]
        return proc.stdout

    log = run_here(train_cmd(data, tmp_path / "ckpt", arch, max_update=30))
    losses = [float(x) for x in re.findall(r"\| train_inner \|.*? loss=([\d.]+)", log)]
    assert len(losses) == 30 and sum(losses[-5:]) < sum(losses[:5]) - 1.0, losses
    out = run_here([str(BIN / "fairseq-generate"), str(data / "bin"), "--user-dir", "fairseq_plugins", "--path",
                    str(tmp_path / "ckpt" / "checkpoint_last.pt"), "--gen-subset", "valid", "--beam", "2",
                    "--max-tokens", "512", "--cpu", "--num-workers", "0"])
    hypotheses = re.findall(r"^H-\d+\t", out, flags=re.M)
    assert len(hypotheses) == 40, out[-2000:]
    out = run_here([sys.executable, "-c", DECODE_CHECK, str(tmp_path / "ckpt" / "checkpoint_last.pt"),
                    str(package)])
    model_name, scheme_name = (re.search(r"class (\w+)", block).group(1) for block in (model_class, module))
    assert out.splitlines()[-2:] == [f"{model_name} {scheme_name}", "incremental == full"], out
