"""A checkpoint records its architecture and position schemes (the model's ``position_record`` buffer); a strict
load into a model of other schemes refuses in one line naming both, through every way fairseq loads one
(fairseq-train --restore-file / --finetune-from-model, fairseq-generate --path, the hub), unless
--allow-scheme-change. Schemes without parameters of their own (RoPE, ALiBi, NoPE) have identical state dicts:
only the record tells them apart. Checkpoints written before records load as before
(tests/test_old_checkpoints.py); the warm-start converter (tests/test_floater_warm_start.py) too."""
import pytest
import torch

from conftest import BIN
from helpers.small_task import load, run_split, small_data, tiny_checkpoint, train_cmd


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


@pytest.fixture(scope="module")
def rope_ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory, "rope_transformer_tiny")


def refusal(theirs, mine):
    t, m = theirs.split("_transformer")[0], mine.split("_transformer")[0]
    return (f"the checkpoint holds a {theirs} model (position schemes: encoder {t}, decoder {t}) and this model is "
            f"{mine} (encoder {m}, decoder {m}): a model does not carry over between position schemes")


def test_a_checkpoint_records_its_arch_and_schemes(rope_ckpt):
    from fairseq_plugins.models._base import decode_record

    assert decode_record(load(rope_ckpt)["model"]["position_record"]) == "rope_transformer_tiny rope rope"


@pytest.mark.parametrize("arch,how", [("alibi_transformer_tiny", "--restore-file"),
                                      ("nope_transformer_tiny", "--restore-file"),
                                      ("alibi_transformer_tiny", "--finetune-from-model")])
def test_train_refuses_a_checkpoint_of_another_scheme(data, rope_ckpt, tmp_path, arch, how):
    save = tmp_path / "save"
    proc = run_split(train_cmd(data, save, arch, how, str(rope_ckpt), max_update=3))
    assert proc.returncode != 0
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"Exception: Cannot load model parameters from checkpoint {rope_ckpt}: it holds a "
                           f"rope_transformer_tiny model, this run builds {arch}: "), line
    # where the state dicts have the same tensors, the record says why (NoPE's sinusoidal encoder has a buffer
    # RoPE's lacks: fairseq names that difference first)
    if arch == "alibi_transformer_tiny":
        assert refusal("rope_transformer_tiny", arch) in line
    assert "Loaded checkpoint" not in proc.stdout + proc.stderr
    assert not save.exists() or not list(save.glob("*.pt"))


@pytest.mark.slow  # a fairseq-train process
def test_train_loads_another_scheme_when_told_to(data, rope_ckpt, tmp_path):
    from fairseq_plugins.models._base import decode_record

    save = tmp_path / "save"
    proc = run_split(train_cmd(data, save, "alibi_transformer_tiny", "--finetune-from-model", str(rope_ckpt),
                               "--allow-scheme-change", max_update=1))
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the new checkpoint is an ALiBi model, and says so
    assert decode_record(load(save / "checkpoint_last.pt")["model"]["position_record"]) == \
        "alibi_transformer_tiny alibi alibi"


def test_the_flag_is_documented():
    proc = run_split([str(BIN / "fairseq-train"), "--user-dir", "fairseq_plugins", "--arch", "rope_transformer_tiny",
                      "--help"])
    assert "--allow-scheme-change" in proc.stdout


def test_generate_refuses_a_checkpoint_built_as_another_scheme(data, rope_ckpt):
    proc = run_split([str(BIN / "fairseq-generate"), str(data / "bin"), "--user-dir", "fairseq_plugins",
                      "--path", str(rope_ckpt), "--cpu", "--beam", "2", "--max-sentences", "4",
                      "--model-overrides", "{'_name': 'alibi_transformer_tiny', 'arch': 'alibi_transformer_tiny', 'position_scheme': 'alibi'}"])
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "SchemeMismatch: " + refusal("rope_transformer_tiny", "alibi_transformer_tiny")
        + "; use the same --arch, or pass --allow-scheme-change to load it anyway")
    assert "Traceback" not in proc.stderr and "H-" not in proc.stdout


def test_hub_refuses_a_checkpoint_built_as_another_scheme(data, rope_ckpt):
    import fairseq_plugins  # noqa: F401  (registers the archs)
    from fairseq.models.transformer import TransformerModel
    from fairseq_plugins.models._base import SchemeMismatch

    def hub(**overrides):
        return TransformerModel.from_pretrained(str(rope_ckpt.parent), checkpoint_file=rope_ckpt.name,
                                                data_name_or_path=str(data / "bin"), **overrides)

    # the overrides that build another scheme from a RoPE checkpoint (its decoder with ALiBi)
    with pytest.raises(SchemeMismatch) as err:
        hub(decoder_position_scheme="alibi")
    assert str(err.value).startswith(
        "the checkpoint holds a rope_transformer_tiny model (position schemes: encoder rope, decoder rope) and this "
        "model is rope_transformer_tiny (encoder rope, decoder alibi): a model does not carry over between position "
        "schemes"), str(err.value)
    model = hub(decoder_position_scheme="alibi", allow_scheme_change=True)
    assert model.models[0].position_schemes() == ("rope", "alibi")
    assert hub().models[0].position_schemes() == ("rope", "rope")


def test_a_checkpoint_without_record_loads_as_before(rope_ckpt):
    """What older code wrote: no record; a strict load still succeeds, and the model keeps its own record."""
    import fairseq_plugins  # noqa: F401
    from fairseq import checkpoint_utils

    state = load(rope_ckpt)
    del state["model"]["position_record"]
    (model,), _ = checkpoint_utils.load_model_ensemble([str(rope_ckpt)], state=state)
    assert torch.equal(model.position_record, load(rope_ckpt)["model"]["position_record"])



def test_the_record_survives_fairseqs_own_checkpoint_averaging(rope_ckpt):
    """fairseq's scripts/average_checkpoints.py (in fairseq's repository, not its package) sums each tensor over
    the checkpoints in the tensor's own dtype, then divides floating-point ones and floor-divides the others. A
    byte record overflowed there, and the averaged model then refused to load as its own scheme."""
    import fairseq_plugins  # noqa: F401
    from fairseq import checkpoint_utils
    from fairseq_plugins.models._base import decode_record

    state = load(rope_ckpt)
    n = 5
    averaged = {}
    for k, v in state["model"].items():
        total = v.clone()
        for _ in range(n - 1):
            total += v  # in v's dtype, as fairseq accumulates
        averaged[k] = total.div_(n) if total.is_floating_point() else total // n
    state["model"] = averaged
    assert decode_record(averaged["position_record"]) == "rope_transformer_tiny rope rope"
    (model,), _ = checkpoint_utils.load_model_ensemble([str(rope_ckpt)], state=state)
    assert model.position_schemes() == ("rope", "rope")


def test_a_fairseq_transformer_without_a_record_is_described_truly(caplog):
    """Converting a fairseq Transformer (a partial, non-strict load) logs nothing about records; a strict load of a
    state without one says what is true (it said "written before records were kept" of a checkpoint written a
    minute earlier by fairseq's own Transformer)."""
    import logging

    from helpers.tiny_models import build

    fairseq_state = build("transformer_tiny").state_dict()
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.models._base"):
        build("floater_transformer_tiny").load_state_dict(dict(fairseq_state), strict=False)
    assert "position-scheme record" not in caplog.text, caplog.text
    plain = build("nope_transformer_tiny")
    state = {k: v for k, v in plain.state_dict().items() if k != "position_record"}
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.models._base"):
        plain.load_state_dict(state, strict=True)
    assert "no position-scheme record (fairseq's own models write none" in caplog.text, caplog.text
    assert "written before records were kept)" not in caplog.text
