"""Checkpoints are untrusted input: fairseq's loader (checkpoint_utils.load_checkpoint_to_cpu, patched to use
torch's weights_only unpickler with argparse.Namespace allowed, see third_party/fairseq-0.12.2/01-compat.patch)
refuses a checkpoint whose pickle would run code, before running it, with one line naming the file and the refused
callable; real checkpoints, including the legacy format whose "args" is an argparse.Namespace, still load."""
import argparse
import os
import subprocess
import sys

import pytest
import torch

from conftest import BIN, env
from helpers.small_task import run_split, small_data, tiny_checkpoint


class RunsCode:
    """Unpickling this calls `call(arg)`: what a crafted checkpoint would do (here: create a marker file)."""

    def __init__(self, call, arg):
        self.call, self.arg = call, arg

    def __reduce__(self):
        return self.call, (self.arg,)


PAYLOADS = {  # name -> (callable, argument given the marker path, the global torch reports)
    "os.system": (os.system, lambda marker: f"touch '{marker}'", "posix.system"),
    "exec": (exec, lambda marker: f"open({str(marker)!r}, 'w').close()", "exec"),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


@pytest.fixture(scope="module")
def real_ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory, "transformer_tiny")


def plain_load(path):
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module", params=sorted(PAYLOADS))
def crafted(request, real_ckpt, tmp_path_factory):
    """(a real checkpoint plus one object whose unpickling creates `marker`, marker, the refused global).
    Checked to be live: an unrestricted torch.load of it (in a child process) does create the marker."""
    call, arg, global_name = PAYLOADS[request.param]
    tmp_path = tmp_path_factory.mktemp("crafted")
    marker = tmp_path / "code_ran"
    state = plain_load(real_ckpt)
    state["extra_state"]["payload"] = RunsCode(call, arg(marker))
    path = tmp_path / "crafted.pt"
    torch.save(state, path)
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(path)!r}, weights_only=False)"],
                   env=env(), check=True, capture_output=True)
    assert marker.exists(), "the crafted checkpoint does not run its payload: the test would prove nothing"
    marker.unlink()
    return path, marker, global_name


def test_loader_refuses_code_in_checkpoint(crafted):
    from fairseq import checkpoint_utils

    path, marker, global_name = crafted
    with pytest.raises(RuntimeError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: refused to load: its pickle calls {global_name}, "), message
    assert "\n" not in message
    assert not marker.exists()


def test_generate_refuses_code_in_checkpoint(data, crafted):
    path, marker, global_name = crafted
    proc = run_split([str(BIN / "fairseq-generate"), str(data / "bin"), "--user-dir", "fairseq_plugins",
                      "--path", str(path), "--cpu", "--beam", "2"])
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"RuntimeError: {path}: refused to load: its pickle calls {global_name}, "), last
    assert "H-" not in proc.stdout
    assert not marker.exists()


def test_legacy_checkpoint_with_args_namespace_still_loads(data, real_ckpt, tmp_path):
    """The pre-0.10 format: an argparse.Namespace under "args" and no "cfg". fairseq upgrades it on load; the
    model it builds holds exactly the parameters of the checkpoint it was made from."""
    from fairseq import checkpoint_utils

    state = plain_load(real_ckpt)
    args = state["cfg"]["model"]  # argparse-built models keep the full Namespace here
    assert isinstance(args, argparse.Namespace)
    legacy = {"args": args, "model": state["model"], "optimizer_history": state["optimizer_history"],
              "extra_state": state["extra_state"], "last_optimizer_state": None}
    path = tmp_path / "legacy.pt"
    torch.save(legacy, path)

    loaded = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert loaded["cfg"].model.arch == "transformer_tiny"  # upgraded: args became cfg
    (model,), cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data / "bin")})
    assert type(model).__name__ == "TransformerModel"
    built = model.state_dict()
    for name, tensor in state["model"].items():
        if not name.endswith("._float_tensor"):  # uninitialised marker buffer (see small_task.py)
            assert torch.equal(built[name], tensor), name
