"""fairseq_plugins/fairseq_check.py: which settings a fairseq without this project's patch would train wrong, read
as fairseq-train (a flat Namespace) and fairseq-hydra-train (a node of the whole config) hand them to the model.
The refusals on a real stock fairseq: tests/test_own_fairseq.py."""
import argparse

import pytest
import torch
from omegaconf import OmegaConf

import fairseq_plugins.fairseq_check as check


class Model(torch.nn.Module):
    def __init__(self, skips, dtype=torch.float32):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(2, dtype=dtype))
        self.theta.may_skip_update = skips


def trained_as(settings):
    """The model's dtype when fairseq's trainer trains with these settings: half under --fp16/--bf16 (without --amp)."""
    if settings.get("amp"):
        return torch.float32
    return torch.bfloat16 if settings.get("bf16") else torch.float16 if settings.get("fp16") else torch.float32


CACHED = {"floater_update_every": 3, "floater_cache_whole_bias": False}
CASES = [  # settings, whether FLOATER's parameters sit out updates, what the refusal says (None: allowed)
    ({"fp16": True}, True, "--fp16 with --floater-update-every 3 (its flat gradients"),
    ({"fp16": True, "fp16_no_flatten_grads": True}, True, "zero gradient on every cached update, which Adam's momentum still acts on)"),
    ({"bf16": True}, True, "--bf16 with --floater-update-every 3 (the flow's parameters would get a zero gradient"),
    ({"fp16": True, "memory_efficient_fp16": True}, True, None),
    ({"bf16": True, "memory_efficient_bf16": True}, True, None),
    ({"amp": True}, True, None),
    ({}, True, None),
    ({"fp16": True}, False, None),  # every parameter has a gradient at every update
    ({"floater_shared_solve": True, "ddp_backend": "legacy_ddp", "distributed_world_size": 2}, False,
     "--floater-shared-solve with --ddp-backend legacy_ddp on 2 processes"),
    ({"floater_shared_solve": True, "ddp_backend": "no_c10d", "distributed_world_size": 2}, False, "no_c10d"),
    ({"floater_shared_solve": True, "ddp_backend": "pytorch_ddp", "distributed_world_size": 2}, False, None),
    ({"floater_shared_solve": True, "ddp_backend": "legacy_ddp", "distributed_world_size": 1}, False, None),
]
SECTION = {"ddp_backend": "distributed_training", "distributed_world_size": "distributed_training",
           "floater_shared_solve": "model"}


@pytest.fixture
def unpatched(monkeypatch):
    monkeypatch.setattr(check, "patch_version", lambda: None)  # a fairseq without fairseq/plugins_patch.py


def as_namespace(settings):
    return argparse.Namespace(**CACHED, **settings)


def as_hydra(settings):
    """The config fairseq-hydra-train builds: common, distributed_training and model; the model's build gets the node."""
    root = {"common": {}, "distributed_training": {}, "model": dict(CACHED)}
    for key, value in settings.items():
        root[SECTION.get(key, "common")][key] = value
    return OmegaConf.create(root).model


@pytest.mark.parametrize("form", [as_namespace, as_hydra], ids=["fairseq-train", "fairseq-hydra-train"])
@pytest.mark.parametrize("settings,skips,says", CASES)
def test_what_an_unpatched_fairseq_would_train_wrong_is_named(unpatched, form, settings, skips, says):
    args = form(settings)
    reader = check.settings_reader(args)
    namespace = argparse.Namespace(**OmegaConf.to_container(args)) if OmegaConf.is_config(args) else args
    refusal = check.unpatched_refusal(reader, namespace, Model(skips, trained_as(settings)))
    if says is None:
        assert refusal is None
    else:
        assert refusal is not None and says in refusal and "`make setup`" in refusal, refusal
        assert "without this project's patch" in refusal and len(refusal.splitlines()) == 1


def test_the_patched_fairseq_refuses_nothing_and_says_so():
    assert check.patch_version() == check.PATCH_VERSION and check.patched()
    assert "(with this project's patch)" in check.describe()
    args = as_namespace({"fp16": True})
    assert check.unpatched_refusal(check.settings_reader(args), args, Model(True, torch.float16)) is None


def test_an_fp16_checkpoint_in_ones_own_fp32_loop_is_not_refused(unpatched):
    """A checkpoint trained with --fp16 --floater-update-every 4 carries those flags; loaded into one's own fp32
    training loop (no FP16Optimizer: the model stays float32) nothing would go wrong."""
    args = as_namespace({"fp16": True})
    reader = check.settings_reader(args)
    assert check.unpatched_refusal(reader, args, Model(True)) is None
    assert "--fp16 with" in check.unpatched_refusal(reader, args, Model(True, torch.float16))


def test_the_bf16_refusal_reads_once(unpatched):
    args = as_namespace({"bf16": True})
    refusal = check.unpatched_refusal(check.settings_reader(args), args, Model(True, torch.bfloat16))
    assert " on on " not in refusal and "acts on)" in refusal, refusal


def test_the_world_is_torch_distributeds_once_it_runs(unpatched, monkeypatch):
    """torchrun and Slurm start one process per GPU: the parsed arguments say 1, torch.distributed says 2."""
    import torch.distributed as dist

    args = as_namespace({"floater_shared_solve": True, "ddp_backend": "legacy_ddp", "distributed_world_size": 1})
    reader = check.settings_reader(args)
    assert check.unpatched_refusal(reader, args, Model(False)) is None
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    assert "legacy_ddp on 2 processes" in check.unpatched_refusal(reader, args, Model(False))


def test_an_older_patch_counts_as_none(monkeypatch):
    monkeypatch.setattr(check, "patch_version", lambda: check.PATCH_VERSION - 1)
    assert not check.patched() and f"older patch (version {check.PATCH_VERSION - 1})" in check.describe()
