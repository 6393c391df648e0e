"""third_party/fairseq-0.12.2/, the patch in four parts: they apply in order to the official sdist, exactly, and give
the installed fairseq; a fairseq may stop after any part; each part names every hunk with a one-line reason. What
the patch must keep working in fairseq itself: TorchScript export of the Transformer and of its SequenceGenerator
(fairseq's own TestJitSequenceGenerator checks, plus equal hypotheses), and `fairseq-train --bf16` on CPU without a
TPU. The plugin archs refuse torch.jit.script in one line."""
import argparse
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import fairseq
import pytest
import torch
from fairseq import checkpoint_utils, utils
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator

from helpers.small_task import run1, small_data, train_cmd
from helpers.stock_fairseq import PATCHES, SDIST

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))

from fairseq_plugins.schemes import SCHEMES  # noqa: E402

TABLE_ARCHS = [s.arch("tiny") for s in SCHEMES.values() if s.arch_prefix]  # every scheme with architectures
# the plugins' (fairseq's own `transformer` scripts: tested above)
PLUGIN_ARCHS = [s.arch("tiny") for s in SCHEMES.values() if s.arch_prefix and s.family != "transformer"]



PARTS = ["01-compat.patch", "02-fixes.patch", "03-plugin-hooks.patch", "04-fused-update.patch"]


def hunks(part):
    """(path, line) of each hunk of a part: its file and the first line it changes in the tree it applies to."""
    found, path = [], None
    for line in (PATCHES / part).read_text().splitlines():
        if line.startswith("--- a/"):
            path = line[len("--- a/"):].split("\t")[0]
        elif line.startswith("@@ -") and path:
            found.append((path, int(re.match(r"@@ -(\d+)", line).group(1))))
    return found


def unpacked_sdist(folder):
    assert SDIST.exists(), f"{SDIST}: the fairseq sdist (make setup downloads it)"
    subprocess.run(["tar", "xzf", str(SDIST), "--no-same-owner", "-C", str(folder)], check=True)
    return folder / "fairseq-0.12.2"


def apply(tree, part):
    """`patch -p1` as scripts/setup_env.sh runs it, but exact: no fuzz, and no hunk at another line than written."""
    proc = subprocess.run(["patch", "-p1", "--fuzz=0", "--no-backup-if-mismatch"], input=(PATCHES / part).read_text(),
                          text=True, capture_output=True, cwd=tree)
    assert proc.returncode == 0 and "offset" not in proc.stdout, f"{part}: {proc.stdout}{proc.stderr}"


def test_the_patch_is_four_parts_each_naming_its_hunks_with_a_reason():
    assert sorted(p.name for p in PATCHES.iterdir()) == PARTS
    for part in PARTS:
        text = (PATCHES / part).read_text()
        preamble = text[:text.index("\ndiff -ruN ")]
        # one line a hunk, "  path:line  why", in the order of the hunks
        listed = [(m.group(1), int(m.group(2))) for m in re.finditer(r"^  (\S+):(\d+)  \S.*$", preamble, flags=re.M)]
        assert hunks(part) and listed == hunks(part), part


@pytest.mark.fresh_processes  # imports each prefix's fairseq in a process of its own
def test_the_parts_apply_in_order_give_the_installed_fairseq_and_any_prefix_runs(tmp_path):
    tree = unpacked_sdist(tmp_path)
    installed = Path(fairseq.__file__).parent
    compiled = [p.relative_to(installed) for p in installed.rglob("*.so")]  # no part changes a compiled source
    for n, part in enumerate(PARTS, 1):
        apply(tree, part)
        prefix = tmp_path / f"upto{n}"
        for package in ("fairseq", "fairseq_cli"):
            shutil.copytree(tree / package, prefix / package)
        for so in compiled:
            shutil.copy2(installed / so, prefix / "fairseq" / so)
        # a fairseq that stops after this part imports, trains' parser builds, and has what the parts so far add
        probe = ("import fairseq, fairseq.trainer, fairseq_cli.train\n"
                 "from fairseq import options\n"
                 "args = options.parse_args_and_arch(options.get_training_parser(), "
                 "['data-bin', '--arch', 'transformer', '--optimizer', 'adam', '--bf16'])\n"
                 "import importlib.util\n"
                 "print(fairseq.__file__, args.tpu, importlib.util.find_spec('fairseq.plugins_patch') is not None,"
                 " hasattr(args, 'fused_update'))")
        proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, text=True, capture_output=True,
                              env={**os.environ, "PYTHONPATH": str(prefix)})
        assert proc.returncode == 0, f"{part}: {proc.stderr[-2000:]}"
        where, tpu, marker, fused = proc.stdout.split()
        assert where == str(prefix / "fairseq" / "__init__.py")
        assert (tpu, marker, fused) == (str(n < 2), str(n >= 3), str(n >= 4)), part  # --bf16 implied --tpu before 02
    for package in ("fairseq", "fairseq_cli"):  # all four: the installed fairseq, file for file
        made = {p.relative_to(tree): p.read_bytes() for p in (tree / package).rglob("*.py")}
        have = {p.relative_to(installed.parent): p.read_bytes() for p in (installed.parent / package).rglob("*.py")}
        differ = sorted(str(f) for f in made.keys() | have.keys() if made.get(f) != have.get(f))
        assert differ == [], f"{package}: the parts give other files than the installed fairseq's (make setup?)"



from helpers import tiny_models  # noqa: E402
from helpers.tiny_models import one_thread  # noqa: E402, F401  (autouse fixture)


class Task:
    def __init__(self, vocab=100):
        d = Dictionary()
        for i in range(vocab):
            d.add_symbol(str(i), n=1000)
        self.source_dictionary = self.target_dictionary = d


TASK = Task()


def fairseq_test_transformer():
    """The model of fairseq's TestJitSequenceGeneratorBase: the `transformer` defaults, 2 encoder layers, 1 decoder."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    TransformerModel.add_args(parser)
    args = parser.parse_args([])
    args.encoder_layers, args.decoder_layers = 2, 1
    return TransformerModel.build_model(args, TASK).eval()


def sample(seed=0):
    g = torch.Generator().manual_seed(seed)
    eos = TASK.target_dictionary.eos()
    src = torch.cat([torch.randint(3, 50, (2, 10), generator=g), torch.full((2, 1), eos)], dim=1)
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([11, 11])}}


def test_transformer_and_ensemble_script():
    model = fairseq_test_transformer()
    torch.jit.script(model)
    torch.jit.script(EnsembleModel([model]))


def test_scripted_sequence_generator_gives_the_unscripted_hypotheses(tmp_path):
    torch.manual_seed(0)
    model = fairseq_test_transformer()
    generator = SequenceGenerator([model], TASK.target_dictionary, beam_size=2, no_repeat_ngram_size=2, max_len_b=10)
    scripted = torch.jit.script(generator)
    scripted.save(str(tmp_path / "generator.pt"))
    loaded = torch.jit.load(str(tmp_path / "generator.pt"))
    expected = generator.forward(sample())
    for got in (scripted.forward(sample()), loaded.forward(sample())):
        assert len(got) == len(expected)
        for hypos, want in zip(got, expected):
            assert len(hypos) == len(want) == 2
            for h, w in zip(hypos, want):
                assert torch.equal(h["tokens"], w["tokens"])
                torch.testing.assert_close(h["positional_scores"], w["positional_scores"], rtol=0, atol=1e-5)
                assert abs(float(h["score"]) - float(w["score"])) < 1e-5
                torch.testing.assert_close(h["attention"], w["attention"], rtol=0, atol=1e-5)


def build(arch):
    return tiny_models.build(arch, task=TASK).eval()


@pytest.mark.parametrize("arch", PLUGIN_ARCHS)
def test_plugin_archs_refuse_torchscript_in_one_line(arch):
    model = build(arch)
    name = arch.removesuffix("_tiny")
    for target in (model, SequenceGenerator([model], TASK.target_dictionary, beam_size=2)):
        with pytest.raises(RuntimeError) as error:
            torch.jit.script(target)
        message = str(error.value)
        assert "\n" not in message
        assert message.startswith(f"{name} cannot be exported with torch.jit.script: "), message
    # the model itself is untouched and still generates
    SequenceGenerator([model], TASK.target_dictionary, beam_size=2, max_len_b=5).forward(sample())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


# one fairseq-train process per case: the fast loop trains FLOATER and the memory-efficient optimizer
@pytest.mark.parametrize("arch,optimizer", [
    pytest.param(arch, "FP16Optimizer", marks=() if arch == "floater_transformer_tiny" else pytest.mark.slow)
    for arch in TABLE_ARCHS] + [("transformer_tiny", "MemoryEfficientFP16Optimizer")])
def test_bf16_trains_on_cpu_without_a_tpu(data, tmp_path, arch, optimizer):
    flag = "--bf16" if optimizer == "FP16Optimizer" else "--memory-efficient-bf16"
    proc = run1(train_cmd(data, tmp_path, arch, flag, "--disable-validation", max_update=3))
    log = proc.stdout
    assert "Traceback" not in log, log[-2000:]
    losses = [float(x) for x in re.findall(r"train_inner \| .*? loss=([-0-9.naif]+),", log)]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), log[-2000:]
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "checkpoint_last.pt"))
    assert state["cfg"]["common"]["bf16"] and not state["cfg"]["common"]["tpu"]
    # the bf16 mixed-precision optimizer ran (fp32 training would record the plain Adam)
    assert state["optimizer_history"][-1]["optimizer_name"] == optimizer
    assert state["optimizer_history"][-1]["num_updates"] == 3


@pytest.mark.slow  # trains a checkpoint, then fairseq-generate three times
@pytest.mark.parametrize("flag,dtype", [("--bf16", "bfloat16"), ("--fp16", "float16")])
def test_generate_decodes_in_the_precision_asked_for(data, tmp_path_factory, flag, dtype):
    """fairseq-generate --bf16 decoded in float32 once --bf16 stopped meaning TPU (fairseq only knew --fp16):
    the patch casts the model as asked. The hypotheses' scores carry the low precision's rounding."""
    from helpers.small_task import run_split, tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path_factory, "floater_transformer_tiny")

    def scores(*extra):
        proc = run_split([str(Path(sys.executable).parent / "fairseq-generate"), str(data / "bin"), "--user-dir",
                          "fairseq_plugins", "--path", str(ckpt), "--gen-subset", "valid", "--beam", "4",
                          "--cpu", "--num-workers", "0", "--max-sentences", "8", "--max-len-b", "8", *extra])
        assert proc.returncode == 0, proc.stderr[-2000:]
        hyps = [line.split("\t") for line in proc.stdout.splitlines() if line.startswith("H-")]
        return {h[0]: (h[2], float(h[1])) for h in hyps}  # sentence id: (hypothesis, score)

    full, low = scores(), scores(flag)
    assert len(full) == len(low) == 40 and all(math.isfinite(s) for _, s in low.values())
    assert [s for _, s in full.values()] != [s for _, s in low.values()]  # float32 would give the same scores
    # the same search result for most sentences (the rounding may flip a close beam decision, which changes the
    # hypothesis and so its score by more than rounding), and for those the score within the low precision's
    # rounding of the log-probabilities of a few tokens
    same = [i for i in full if full[i][0] == low[i][0]]
    assert len(same) >= 30, f"only {len(same)} of 40 hypotheses survive {flag}"
    assert max(abs(full[i][1] - low[i][1]) for i in same) < 0.1


def test_config_conversion_says_nothing_about_fairseqs_hydra_api():
    """fairseq's convert_namespace_to_omegaconf (every command, every checkpoint load) used to print six Hydra
    1.0 deprecation notices under hydra-core 1.3; the patch silences those, and only those."""
    import warnings

    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), ["data-bin", "--arch", "transformer_tiny"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = convert_namespace_to_omegaconf(args)
        warnings.warn("a notice of the user's own", UserWarning)
    assert cfg.model.arch == "transformer_tiny"
    assert [str(w.message) for w in caught] == ["a notice of the user's own"]
