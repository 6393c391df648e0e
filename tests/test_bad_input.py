"""Bad input fails with one clear line that names the culprit (a flag, a file), as the last line of stderr,
and leaves no partial output.

What "one line" means where: our own scripts (prepare_bitext.sh) print exactly one line on stderr. fairseq's own
flag errors go through argparse, which prints the usage and then the error as the last line (exit status 2,
no traceback); the plugins' flags print only the error line. Errors raised inside fairseq (an unreadable
or refused checkpoint, a checkpoint of another architecture, a sentence longer than the model's positions) end
in a short Python traceback whose last line is the message: no chained traceback, no state-dict dump. The
checkpoint messages come from our fairseq patch (third_party/fairseq-0.12.2/: torch_load_checkpoint in
01-compat.patch, Trainer.load_checkpoint in 02-fixes.patch); the too-long sentence is fairseq's own size check, made
before anything is translated.
"""
import subprocess
import sys

import pytest

from conftest import BIN, REPO, env
from helpers.small_task import VOCAB, run_split, small_data, tiny_checkpoint, train_cmd
from fairseq_plugins.schemes import SCHEMES


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def last_line(proc):
    assert proc.returncode != 0, proc.stdout[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    return lines[-1]


def assert_no_traceback(proc):
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def assert_short_traceback(proc):
    """A fairseq-internal error: one traceback, not chained, and no state-dict dump."""
    assert proc.stderr.count("Traceback") == 1, proc.stderr[-3000:]
    assert "During handling of the above exception" not in proc.stderr
    assert "Missing key(s)" not in proc.stderr and "Unexpected key(s)" not in proc.stderr


def no_checkpoints(save):
    return not save.exists() or not list(save.glob("*.pt"))


# -- data preparation ---------------------------------------------------------------------------------------


def write_corpus(raw, pairs=("a b\nc d\n", "x y\nz w\n"), **override):
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for lang, text in zip(("src", "tgt"), pairs):
            (raw / f"{split}.{lang}").write_text(override.get(f"{split}.{lang}", text))
    return raw


@pytest.mark.parametrize("override,message", [
    ({"test.tgt": "x y\n"}, "{raw}/test.src has 2 lines but {raw}/test.tgt has 1 (must be line-aligned)"),
    # a last line without its newline is a line (wc -l would count 1 line on each side here)
    ({"test.src": "a b\nc d", "test.tgt": "x y\n"},
     "{raw}/test.src has 2 lines but {raw}/test.tgt has 1 (must be line-aligned)"),
    ({"train.src": ""}, "missing or empty file {raw}/train.src"),
    ({"train.tgt": "\n \n"}, "missing or empty file {raw}/train.tgt"),  # blank lines only: no text
], ids=["misaligned", "misaligned-no-final-newline", "empty", "blank-lines-only"])
def test_prepare_rejects_bad_corpus(tmp_path, override, message):
    raw = write_corpus(tmp_path / "raw", **override)
    out = tmp_path / "out"
    proc = run_split(["bash", "scripts/prepare_bitext.sh", str(raw), str(out), "src", "tgt", VOCAB])
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["prepare_bitext.sh: " + message.format(raw=raw)]
    assert not out.exists()


# -- fairseq-train flags ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch,flags,message", [
    ("no_such_arch", [], "fairseq-train: error: argument --arch/-a: invalid choice: 'no_such_arch' (choose from"),
    ("relative_transformer_tiny", ["--max-relative-positions", "-1"],
     "fairseq-train: error: argument --max-relative-positions: must be >= 0 (got -1)"),
    ("floater_transformer_tiny", ["--floater-dt", "0"], "fairseq-train: error: argument --floater-dt: must be > 0"),
    ("floater_transformer_tiny", ["--floater-method", "foo"],
     "fairseq-train: error: argument --floater-method: invalid choice: 'foo' (choose from"),
], ids=["unknown-arch", "negative-k", "dt-zero", "unknown-ode-method"])
def test_train_rejects_bad_flags(data, tmp_path, arch, flags, message):
    save = tmp_path / "save"
    proc = run_split(train_cmd(data, save, arch, *flags))
    assert proc.returncode == 2
    assert last_line(proc).startswith(message), last_line(proc)
    assert_no_traceback(proc)
    if arch != "no_such_arch":  # the plugins' flags print no usage: the error is the only line
        assert proc.stderr.strip().splitlines() == [last_line(proc)]
    assert not save.exists()


# -- checkpoints --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformer_ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory, "transformer_tiny")


def damaged(ckpt, tmp_path, how):
    path = tmp_path / f"{how}.pt"
    data = ckpt.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"not a checkpoint\n",
                      "empty": b""}[how])
    return path


@pytest.mark.parametrize("how,why", [
    ("truncated", "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"),
    ("garbage", "UnpicklingError: Unsupported operand 110"),  # b"n", read as a pickle opcode
    ("empty", "EOFError"),
])
def test_loader_rejects_unreadable_checkpoint(transformer_ckpt, tmp_path, how, why):
    """fairseq's loader (what fairseq-train, -generate, -interactive and the hub interface all call)."""
    from fairseq import checkpoint_utils

    path = damaged(transformer_ckpt, tmp_path, how)
    with pytest.raises(RuntimeError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert str(err.value) == f"{path}: not a readable fairseq checkpoint (truncated or corrupt): {why}"


def test_generate_rejects_truncated_checkpoint(data, transformer_ckpt, tmp_path):
    path = damaged(transformer_ckpt, tmp_path, "truncated")
    proc = run_split([str(BIN / "fairseq-generate"), str(data / "bin"), "--user-dir", "fairseq_plugins",
                      "--path", str(path), "--cpu", "--beam", "2"])
    assert last_line(proc).startswith(f"RuntimeError: {path}: not a readable fairseq checkpoint "
                                      "(truncated or corrupt): "), last_line(proc)
    assert_short_traceback(proc)
    assert "H-" not in proc.stdout


def test_train_restore_rejects_truncated_checkpoint(data, transformer_ckpt, tmp_path):
    path = damaged(transformer_ckpt, tmp_path, "truncated")
    save = tmp_path / "save"
    proc = run_split(train_cmd(data, save, "transformer_tiny", "--restore-file", str(path)))
    assert last_line(proc) == (f"RuntimeError: {path}: not a readable fairseq checkpoint (truncated or corrupt): "
                               "RuntimeError: PytorchStreamReader failed reading zip archive: "
                               "failed finding central directory")
    assert_short_traceback(proc)
    assert no_checkpoints(save)


@pytest.mark.parametrize("how", ["--restore-file", "--finetune-from-model"])
def test_train_rejects_checkpoint_of_another_arch(data, transformer_ckpt, tmp_path, how):
    save = tmp_path / "save"
    proc = run_split(train_cmd(data, save, "relative_transformer_tiny", how, str(transformer_ckpt)))
    line = last_line(proc)
    assert line.startswith(f"Exception: Cannot load model parameters from checkpoint {transformer_ckpt}: it holds "
                           "a transformer_tiny model, this run builds relative_transformer_tiny: "), line
    # and says how they differ: the relative tables are missing, the sinusoidal tables' buffers unexpected
    assert "tensors missing from the checkpoint (e.g. encoder.layers.0.self_attn.relative_keys)" in line
    assert "tensors not in this model (e.g. encoder.embed_positions._float_tensor)" in line
    assert_short_traceback(proc)
    assert no_checkpoints(save)


# -- a sentence longer than a learned position table --------------------------------------------------------


@pytest.mark.slow  # trains a checkpoint, then a fairseq-generate process
def test_generate_refuses_sentence_longer_than_learned_positions(data, tmp_path_factory):
    """transformer_every_layer_pos --learned-pos has 16 source positions; the test split has longer sentences.
    fairseq-generate stops with fairseq's size error before translating anything: no sentence is truncated or
    skipped (skipping takes an explicit --skip-invalid-size-inputs-valid-test)."""
    ckpt = tiny_checkpoint(tmp_path_factory, "transformer_every_layer_pos_tiny", "--learned-pos",
                           "--max-source-positions", "16", "--max-target-positions", "64",
                           "--skip-invalid-size-inputs-valid-test")
    proc = run_split([str(BIN / "fairseq-generate"), str(data / "bin"), "--user-dir", "fairseq_plugins",
                      "--path", str(ckpt), "--gen-subset", "test", "--cpu", "--beam", "2"])
    line = last_line(proc)
    assert line.startswith("Exception: Size of sample #") and "since max_positions=(16, 64)" in line, line
    assert_short_traceback(proc)
    assert "H-" not in proc.stdout


def test_demo_rejects_an_unknown_model_before_writing(tmp_path):
    """make demo's MODELS takes architectures or the table of schemes' model names; anything else is one line
    naming it, before any data, checkpoint or result is written."""
    out = tmp_path / "demo"
    proc = subprocess.run(["bash", "scripts/demos/toy_demo.sh"], cwd=REPO, text=True, capture_output=True,
                          env={**env(), "MODELS": "transformer shaw_transformer_tiny", "OUT": str(out)})
    assert proc.returncode == 1
    models = ", ".join(s.model for s in SCHEMES.values())  # the table's model names, in its order
    assert proc.stderr.splitlines() == [
        f"fairseq_plugins: unknown model 'shaw_transformer_tiny': expected one of {models} or one of their "
        "architectures"]
    assert not out.exists()


# -- text that is not UTF-8 ---------------------------------------------------------------------------------


def test_prepare_rejects_non_utf8_before_writing(tmp_path):
    raw = write_corpus(tmp_path / "raw")
    (raw / "valid.src").write_bytes(b"a b\nthe caf\xe9 dog\n")  # Latin-1
    out = tmp_path / "out"
    proc = run_split(["bash", "scripts/prepare_bitext.sh", str(raw), str(out), "src", "tgt", VOCAB])
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"prepare_bitext.sh: {raw}/valid.src line 2 is not UTF-8 (byte 0xe9 at "
                                        "offset 7); re-encode the file, e.g. iconv -f latin1 -t utf-8"]
    assert not out.exists()


def test_interactive_skips_a_non_utf8_line_and_translates_the_rest(data, transformer_ckpt, tmp_path):
    text = tmp_path / "input.txt"
    text.write_bytes(b"a b c\nthe caf\xe9 dog\nd e f\n")
    proc = run_split([str(BIN / "fairseq-interactive"), str(data / "bin"), "--user-dir", "fairseq_plugins",
                      "--path", str(transformer_ckpt), "--cpu", "--beam", "2", "--bpe", "sentencepiece",
                      "--sentencepiece-model", str(data / "spm.model"), "--input", str(text)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{text} line 2: not UTF-8 (byte 0xe9 at offset 7): line skipped" in proc.stderr
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 2, proc.stdout


# -- a plugin architecture without --user-dir ---------------------------------------------------------------


def test_train_without_user_dir_names_it(data, tmp_path):
    cmd = [a for a in train_cmd(data, tmp_path / "save", "rope_transformer_tiny") if a not in ("--user-dir", "fairseq_plugins")]
    proc = run_split(cmd)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "fairseq-train: error: argument --arch/-a: 'rope_transformer_tiny' is not a fairseq architecture, and no "
        "--user-dir was given: a plugin's architecture needs its package (--user-dir fairseq_plugins for the "
        "position-scheme architectures)"]


MISSING = ("ValueError: unknown model architecture 'rope_transformer_tiny' (--arch, or the checkpoint's): a plugin's "
           "architecture needs its package loaded first: --user-dir fairseq_plugins on the command line for the "
           "position-scheme architectures, or `import fairseq_plugins` before from_pretrained")


@pytest.fixture(scope="module")
def rope_ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory, "rope_transformer_tiny")


@pytest.mark.slow  # a fairseq-generate process
def test_generate_without_user_dir_names_it(data, rope_ckpt):
    proc = run_split([str(BIN / "fairseq-generate"), str(data / "bin"), "--path", str(rope_ckpt), "--cpu",
                      "--beam", "2"])
    assert last_line(proc) == MISSING
    assert "IndexError" not in proc.stderr


def test_hub_without_import_names_it(data, rope_ckpt):
    code = ("from fairseq.models.transformer import TransformerModel\n"
            f"TransformerModel.from_pretrained({str(rope_ckpt.parent)!r}, checkpoint_file={rope_ckpt.name!r}, "
            f"data_name_or_path={str(data / 'bin')!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), text=True, capture_output=True)
    assert last_line(proc) == MISSING


# -- flags that would do nothing ----------------------------------------------------------------------------


@pytest.mark.parametrize("arch,flags,message", [
    ("rope_transformer_tiny", ["--t5-num-buckets", "64"],
     "FlagError: --t5-num-buckets is a t5 flag, and this model's position schemes are rope (encoder) and rope "
     "(decoder): it would do nothing"),
    ("rope_transformer_tiny", ["--shape-max-shift", "10"],
     "FlagError: --shape-max-shift is a shape flag, and this model's position schemes are rope (encoder) and rope "
     "(decoder): it would do nothing"),
    ("t5_transformer_tiny", ["--encoder-learned-pos"],
     "FlagError: --encoder-learned-pos does nothing with the encoder's position scheme t5; for learned positions "
     "use --encoder-position-scheme learned on position_transformer"),
    ("nope_transformer_tiny", ["--decoder-learned-pos"],
     "FlagError: --decoder-learned-pos does nothing with the decoder's position scheme nope; for learned positions "
     "use --decoder-position-scheme learned on position_transformer"),
    ("rope_transformer_tiny", ["--position-scheme", "alibi"],
     "FlagError: --position-scheme alibi contradicts --arch rope_transformer*: use alibi_transformer* or "
     "position_transformer --position-scheme alibi"),
], ids=["t5-flag-on-rope", "shape-flag-on-rope", "learned-pos-on-t5", "learned-pos-on-nope", "scheme-vs-arch"])
def test_train_refuses_flags_that_would_do_nothing(data, tmp_path, arch, flags, message):
    save = tmp_path / "save"
    proc = run_split(train_cmd(data, save, arch, *flags))
    assert proc.returncode != 0
    assert last_line(proc) == message
    assert_no_traceback(proc)
    assert not save.exists() or not list(save.glob("*.pt"))


def test_position_transformer_says_what_it_builds(caplog):
    from helpers.tiny_models import build_with_args

    build_with_args("position_transformer", position_scheme="rope")
    assert ("--arch position_transformer builds fairseq's transformer (base) dims, 6+6 layers of 512, with rope "
            "(encoder) and rope (decoder) positions") in caplog.text
