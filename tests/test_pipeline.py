"""The stack and the pipeline in miniature: install, preprocess, train, resume, generate, score."""
import json
import re
import sys

import pytest

from conftest import BIN, run


def test_imports_and_cli_help():
    run([sys.executable, "-c", "import fairseq, fairseq_plugins, torchdiffeq, sacrebleu, sentencepiece"])
    out = run([str(BIN / "fairseq-train"), "--user-dir", "fairseq_plugins", "--help"]).stdout
    assert "--arch" in out


def test_help_lists_the_archs_flags():
    """`fairseq-train --arch X --help` shows X's own flags (the patch defers -h to fairseq's final parse), and not
    another scheme's (each scheme's architectures have a model class of their own); position_transformer's all."""
    for arch, flags, others in [
            ("relative_transformer_wmt_en_de", ["--max-relative-positions", "--no-relative-values",
                                                "--relative-shared-heads"], ["--floater-dt", "--t5-num-buckets"]),
            ("floater_transformer_wmt_en_de", ["--floater-dt", "--floater-method", "--floater-update-every"],
             ["--max-relative-positions", "--rope-base"]),
            ("shape_transformer_wmt_en_de", ["--shape-max-shift", "--shape-eval-offset"],
             ["--t5-bias-init", "--t5-num-buckets", "--floater-dt"]),
            ("position_transformer", ["--shape-max-shift", "--t5-bias-init", "--floater-dt", "--rope-base"], []),
            ("transformer_wmt_en_de", ["--encoder-embed-dim"], ["--floater-dt"])]:
        out = run([str(BIN / "fairseq-train"), "--user-dir", "fairseq_plugins", "--arch", arch, "--help"]).stdout
        for flag in flags:
            assert flag in out, (arch, flag)
        for flag in others:
            assert flag not in out, (arch, flag)


def test_train_resume_generate_score(toy_data, tmp_path):
    """1 epoch, then the same command with 2 epochs resumes from checkpoint_last.pt (which proves
    checkpoints load under torch's weights_only loader), then every test sentence gets a hypothesis."""
    save = tmp_path / "ckpt"
    cmd = ["bash", "scripts/train_small.sh", str(toy_data / "bin"), str(save), "transformer_tiny"]
    envs = {}
    first = run(cmd, env_extra={**envs, "EPOCHS": "1"}).stdout
    assert (save / "checkpoint_last.pt").is_file()
    updates_1 = int(re.findall(r"num_updates (\d+)", first)[-1])

    second = run(cmd, env_extra={**envs, "EPOCHS": "2"}).stdout
    assert re.search(rf"Loaded checkpoint .*checkpoint_last\.pt \(epoch 2 @ {updates_1} updates\)", second)
    assert re.search(r"epoch 002 \|.*num_updates " + str(2 * updates_1), second)

    out = tmp_path / "test.json"
    run(["bash", "scripts/generate.sh", str(toy_data), str(save / "checkpoint_last.pt"), "test", str(out)])
    result = json.loads(out.read_text())
    n_refs = len((toy_data / "raw" / "test.tgt").read_text().splitlines())
    hyps = (tmp_path / "test.hyp").read_text().splitlines()
    assert result["sentences"] == n_refs == len(hyps) == 500
    assert result["sacrebleu_signature"].startswith("nrefs:1|")
    assert 0.0 <= result["bleu"] <= 100.0

    # REUSE=1 keeps a translation only if it is newer than the checkpoint and was made with the same settings
    def generate(*extra, **env):
        return run(["bash", "scripts/generate.sh", str(toy_data), str(save / "checkpoint_last.pt"), "test", str(out),
                    *extra], env_extra={"REUSE": "1", **env}).stdout

    stamp = out.stat().st_mtime_ns
    assert "reusing" in generate() and out.stat().st_mtime_ns == stamp
    for extra, env, key, value in [((), {"BEAM": "2"}, "beam", "2"), ((), {"LENPEN": "1.0"}, "lenpen", "1.0"),
                                   (("--max-len-b", "50"), {}, "generate_args", "--max-len-b 50")]:
        assert "reusing" not in generate(*extra, **env)
        assert json.loads(out.read_text())[key] == value
    assert "reusing" in generate("--max-len-b", "50")
    (save / "checkpoint_last.pt").touch()  # a newer checkpoint
    assert "reusing" not in generate("--max-len-b", "50")


def test_score_refuses_missing_hypotheses(toy_data, tmp_path):
    log = tmp_path / "gen.out"
    log.write_text("S-0\tx\nH-0\t-0.1\t▁ka\n")  # one hypothesis for a 500-line reference
    proc = run([sys.executable, "scripts/score.py", "--generate-log", str(log), "--spm", str(toy_data / "spm.model"),
                "--ref", str(toy_data / "raw" / "test.tgt"), "--out", str(tmp_path / "r.json")], check=False)
    assert proc.returncode != 0
    assert "has 1 hypotheses for 500 reference lines" in proc.stdout
    assert not (tmp_path / "r.json").exists()


def test_prepare_refuses_misaligned_corpus(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        (raw / f"{split}.src").write_text("a b\nc d\n")
        (raw / f"{split}.tgt").write_text("x y\n" if split == "valid" else "x y\nz w\n")
    proc = run(["bash", "scripts/prepare_bitext.sh", str(raw), str(tmp_path / "out"), "src", "tgt", "50"], check=False)
    assert proc.returncode == 1
    assert "valid.src has 2 lines but" in proc.stdout and "valid.tgt has 1" in proc.stdout
    assert not (tmp_path / "out" / "bin").exists()


# transformer_tiny: 184 symbols x 64 + 2 + 2 layers; relative: + 4 self-attention layers x 2 tables x 2 heads x (2k+1 = 9) x 32; + 2 learned tables of
# (1024 + 2) x 64; the CLI builds the same counts (tests/test_configs.py checks the WMT cells that way).
HYDRA_MODELS = {
    "transformer_tiny": ([], 146_176),
    "relative_transformer_tiny": ([], 146_176 + 4 * 2 * 2 * 9 * 32),
    "transformer_every_layer_pos_tiny": (["+model.learned_pos=true"], 146_176 + 2 * 1026 * 64),
    # 3 flows of Linear(65 -> 64) + Linear(65 -> 64)
    "floater_transformer_tiny": (["+model.floater_update_every=2"], 146_176 + 3 * 2 * (65 * 64 + 64)),
}


@pytest.mark.parametrize("arch", sorted(HYDRA_MODELS))
def test_hydra_config_trains(toy_data, tmp_path, arch):
    """configs/toy_transformer.yaml with each model: the plugins' own flags survive Hydra's DictConfig."""
    overrides, n_params = HYDRA_MODELS[arch]
    save = tmp_path / "hydra"
    out = run([str(BIN / "fairseq-hydra-train"), "--config-dir", "configs", "--config-name", "toy_transformer",
               f"task.data={toy_data / 'bin'}", "optimization.max_update=3", f"checkpoint.save_dir={save}",
               f"hydra.run.dir={tmp_path / 'hydra_out'}", f"model._name={arch}", *overrides]).stdout
    assert (save / "checkpoint_last.pt").is_file()
    assert f"num. shared model params: {n_params:,}" in out
