"""scripts/transformer_to_floater.py: a trained transformer_tiny checkpoint becomes a floater_transformer one with
identical logits and identical beam search; the result loads the way fairseq loads checkpoints; clear errors."""
import argparse
import os
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils, models, utils
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks.translation import TranslationConfig, TranslationTask

REPO = Path(__file__).resolve().parents[1]
utils.import_user_module(argparse.Namespace(user_dir=str(REPO / "fairseq_plugins")))
from fairseq_plugins.modules.floater import FloaterFlow  # noqa: E402

import transformer_to_floater as converter  # noqa: E402  (scripts/, on sys.path: tests/conftest.py)

VOCAB = 30


from helpers.tiny_models import one_thread  # noqa: E402, F401  (autouse fixture)


def make_task():
    d = Dictionary()
    for i in range(VOCAB - len(d)):
        d.add_symbol(f"w{i}")
    return TranslationTask(TranslationConfig(), d, d)


def random_batch(task, bsz=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (bsz, 9), generator=g)
    src[0, :3] = d.pad()  # left padding
    tgt = torch.randint(d.nspecial, len(d), (bsz, 7), generator=g)
    tgt[:, -1] = d.eos()
    prev = torch.cat([torch.full((bsz, 1), d.eos()), tgt[:, :-1]], dim=1)
    return src, src.ne(d.pad()).sum(1), prev, tgt


@pytest.fixture(scope="module")
def trained_transformer(tmp_path_factory):
    """A transformer_tiny built through fairseq's task/model path, a few Adam steps on random data, saved in
    fairseq's checkpoint format (optimizer state included)."""
    task = make_task()
    args = argparse.Namespace(arch="transformer_tiny", _name="transformer_tiny", dropout=0.0, share_all_embeddings=True)
    torch.manual_seed(0)
    model = task.build_model(args)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(4):
        src, lengths, prev, tgt = random_batch(task, seed=step)
        logits = model(src, lengths, prev)[0]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("warm") / "transformer.pt"
    torch.save({
        "args": None,
        "cfg": {"model": args, "task": {"_name": "translation", "data": "unused"}, "criterion": {"_name": "cross_entropy"}},
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"lr": 3e-3}, "num_updates": 4}],
        "task_state": {},
        "extra_state": {"train_iterator": {"version": 2, "epoch": 2, "iterations_in_epoch": 3, "shuffle": True}},
        "last_optimizer_state": opt.state_dict(),
    }, path)
    return task, path


def load_like_fairseq(path, task):
    """What fairseq-generate / fairseq-train do with a checkpoint: build from cfg.model, load strictly."""
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    model = models.build_model(state["cfg"]["model"], task)
    model.load_state_dict(state["model"], strict=True, model_cfg=state["cfg"]["model"])
    return state, model.eval()


@pytest.fixture(scope="module")
def converted(trained_transformer):
    task, path = trained_transformer
    out = path.parent / "floater.pt"
    converter.main([str(path), str(out)])
    return task, path, out


def test_identical_logits(converted):
    task, src_path, out = converted
    _, transformer = load_like_fairseq(src_path, task)
    _, floater = load_like_fairseq(out, task)
    src, lengths, prev, _ = random_batch(task, seed=11)
    for mode in ("train", "eval"):
        getattr(transformer.double(), mode)()
        getattr(floater.double(), mode)()
        torch.testing.assert_close(floater(src, lengths, prev)[0], transformer(src, lengths, prev)[0],
                                   rtol=0, atol=1e-5)


def test_identical_beam_search(converted):
    task, src_path, out = converted
    _, transformer = load_like_fairseq(src_path, task)
    _, floater = load_like_fairseq(out, task)
    src, lengths, _, _ = random_batch(task, bsz=5, seed=12)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    results = [SequenceGenerator([m], task.target_dictionary, beam_size=4, max_len_b=15).forward(sample)
               for m in (transformer, floater)]
    for hypos_t, hypos_f in zip(*results):
        assert len(hypos_t) == len(hypos_f) == 4
        for h_t, h_f in zip(hypos_t, hypos_f):
            assert torch.equal(h_t["tokens"], h_f["tokens"])
            torch.testing.assert_close(h_f["score"], h_t["score"], rtol=0, atol=1e-4)


def test_converted_checkpoint_is_a_new_floater_phase(converted):
    task, src_path, out = converted
    state, model = load_like_fairseq(out, task)
    margs = state["cfg"]["model"]
    assert margs.arch == margs._name == "floater_transformer_tiny"
    assert (margs.floater_dt, margs.floater_method, margs.floater_update_every, margs.floater_layers) == \
        (0.1, "rk4", 1, "all")
    assert (margs.encoder_embed_dim, margs.encoder_layers, margs.share_all_embeddings) == (64, 2, True)
    assert "last_optimizer_state" not in state and state["optimizer_history"][-1]["num_updates"] == 0
    assert state["extra_state"]["train_iterator"]["epoch"] == 1
    assert state["cfg"]["task"]["_name"] == "translation"  # the rest of the config is kept
    source = checkpoint_utils.load_checkpoint_to_cpu(str(src_path))["model"]
    for key, value in source.items():  # every weight copied (_float_tensor: fairseq's uninitialised dtype marker)
        assert key.endswith("_float_tensor") or torch.equal(state["model"][key], value), key
    flows = [m for m in model.modules() if isinstance(m, FloaterFlow)]
    assert len(flows) == 3
    for flow in flows:
        assert flow.dynamics.fc2.weight.abs().sum() == 0 and flow.dynamics.fc2.bias.abs().sum() == 0
        assert flow.dynamics.fc1.weight.abs().sum() > 0 and int(flow.num_updates) == 0
    # each block's q/k/v bias is its flow's initial value b(0)
    enc = model.encoder
    assert torch.equal(enc.position_scheme.projections[1].bias, source["encoder.layers.0.self_attn.k_proj.bias"])


def test_floater_options_and_arch(trained_transformer, tmp_path):
    task, path = trained_transformer
    out = tmp_path / "f.pt"
    converter.main([str(path), str(out), "--arch", "floater_transformer", "--floater-dt", "0.01",
                    "--floater-update-every", "100", "--floater-layers", "input", "--floater-adjoint"])
    state, model = load_like_fairseq(out, task)
    margs = state["cfg"]["model"]
    assert margs.arch == "floater_transformer" and margs.encoder_embed_dim == 64
    assert (margs.floater_dt, margs.floater_update_every, margs.floater_layers, margs.floater_adjoint) == \
        (0.01, 100, "input", True)
    assert model.encoder.position_scheme.flow.settings.update_every == 100 and len(model.encoder.position_scheme.projections) == 3


def run_main(argv, capsys):
    with pytest.raises(SystemExit) as info:
        converter.main([str(a) for a in argv])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert info.value.code != 0 and len(errors) == 1, errors  # (argparse also prints its usage)
    return errors[0]


def test_errors_are_one_clear_line(trained_transformer, tmp_path, capsys):
    task, path = trained_transformer
    out = tmp_path / "out.pt"
    assert "no such file" in run_main([tmp_path / "missing.pt", out], capsys)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    assert "not a readable fairseq checkpoint" in run_main([tmp_path / "garbage.pt", out], capsys)
    floater_ckpt = tmp_path / "already.pt"
    converter.main([str(path), str(floater_ckpt)])
    capsys.readouterr()
    assert "is not a fairseq `transformer` architecture" in run_main([floater_ckpt, out], capsys)
    assert "does not have the input's dimensions" in run_main(
        [path, out, "--arch", "floater_transformer_wmt_en_de"], capsys)
    assert "argument --floater-dt: must be > 0" in run_main([path, out, "--floater-dt", "0"], capsys)
    assert "does not exist" in run_main([path, tmp_path / "no" / "dir" / "out.pt"], capsys)
    assert not out.exists()


def test_write_is_atomic(trained_transformer, tmp_path, monkeypatch):
    task, path = trained_transformer
    out = tmp_path / "out.pt"
    out.write_bytes(b"previous")

    def failing_save(obj, f):  # f: the temporary file's name (tooling.atomic.save_torch)
        with open(f, "wb") as partial:
            partial.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError):
        converter.main([str(path), str(out)])
    assert out.read_bytes() == b"previous" and os.listdir(tmp_path) == ["out.pt"]
    monkeypatch.undo()
    converter.main([str(path), str(out)])
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # readable as any new file (not mkstemp's 0o600)
    assert os.listdir(tmp_path) == ["out.pt"]
