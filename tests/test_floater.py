"""FLOATER's flows and model (fairseq_plugins/modules/floater/flows.py and scheme.py): one solve per
forward for all flows, the warm-start identity with fairseq's Transformer, incremental decoding, any length, caching
and its gradients, validation, flags."""
import argparse
import copy
import re
from pathlib import Path

import pytest
import torch
from fairseq import options, utils
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.modules import floater  # noqa: E402
from fairseq_plugins.modules.floater import (  # noqa: E402
    Floater,
    FloaterFlow,
    FloaterSolverError,
)
from helpers.floater_helpers import (  # noqa: E402, F401  (one_thread: autouse fixture)
    one_thread,
    VOCAB,
    TASK,
    PAD,
    build,
    flows,
    randomize_flows,
    floater_model,
    batch,
    count_solves,
    train_updates,
)


@pytest.mark.parametrize("layers", ["all", "input"])
@pytest.mark.parametrize("src_len,tgt_len", [(7, 6), (4, 9)])
def test_one_solve_per_training_forward_for_the_longest_sequence(monkeypatch, layers, src_len, tgt_len):
    model = floater_model(floater_layers=layers).train()
    calls = count_solves(monkeypatch)
    model(*batch(src_len=src_len, tgt_len=tgt_len))
    assert calls == [max(src_len, tgt_len)]


def test_every_flow_solved_together_equals_each_flow_alone():
    """The model's joint solve gives every flow exactly what solving it alone (FloaterFlow.forward) gives."""
    model = floater_model().eval()
    src, lengths, prev = batch()
    model(src, lengths, prev)
    pairs = [(model.encoder.position_scheme.flow, model.encoder.position_scheme.projections),
             (model.decoder.position_scheme.flow, model.decoder.position_scheme.projections),
             (model.decoder.position_scheme.cross_flow, model.decoder.position_scheme.cross_projections)]
    for (flow, projections), joint in zip(pairs, model.encoder.position_scheme.positions.eval_solves.cache.delta):
        with torch.no_grad():
            alone = flow([p.bias for p in projections], joint.size(0))
        torch.testing.assert_close(joint, alone, rtol=0, atol=1e-12)


def test_encoder_and_decoder_called_apart_in_training_equal_the_model_forward():
    model = floater_model().train()
    src, lengths, prev = batch()
    together = model(src, lengths, prev)[0]
    apart = model.decoder(prev, model.encoder(src, lengths))[0]
    torch.testing.assert_close(apart, together, rtol=0, atol=1e-12)
    apart.pow(2).mean().backward()
    assert model.decoder.position_scheme.cross_flow.dynamics.fc2.weight.grad.abs().sum() > 0


def test_beam_search_solves_once(monkeypatch):
    """Generation: the encoder's request solves all flows (cache of 16 positions), every decoding step reuses it."""
    model = floater_model().eval()
    src, lengths, _ = batch(bsz=2)
    calls = count_solves(monkeypatch)
    gen = SequenceGenerator([model], TASK.target_dictionary, beam_size=4, max_len_b=12)
    gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(calls) == 1


def test_one_solve_per_forward_for_all_flows_with_every_block_in_one_state(monkeypatch):
    model = floater_model()
    calls = count_solves(monkeypatch)
    model.train()
    model(*batch())
    assert len(calls) == 1  # encoder flow, decoder flow and decoder cross flow together
    enc, dec = model.encoder, model.decoder
    assert [type(f) for f in (enc.position_scheme.flow, dec.position_scheme.flow, dec.position_scheme.cross_flow)] == [FloaterFlow] * 3
    # one FloaterSettings, checked once, shared by the model's flows
    assert enc.position_scheme.flow.settings is dec.position_scheme.flow.settings is dec.position_scheme.cross_flow.settings
    # the state stacks every block's initial values: 2 blocks × (q, k, v) | (q, k, v, cross q) | (cross k, v)
    assert len(enc.position_scheme.projections) == 6
    assert len(dec.position_scheme.projections) == 8 and len(dec.position_scheme.cross_projections) == 4


def test_theta_shared_across_blocks_and_initial_values_per_block():
    model = floater_model()
    for coder in (model.encoder, model.decoder):
        # θ lives once, in the flow, never in a block
        layer_params = {id(p) for layer in coder.layers for p in layer.parameters()}
        for flow in flows(coder):
            assert not {id(p) for p in flow.parameters()} & layer_params
    enc = model.encoder
    for n, layer in enumerate(enc.layers):
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            assert enc.position_scheme.projections[3 * n + j].bias is getattr(layer.self_attn, name).bias
    b0 = [p.bias for p in enc.position_scheme.projections]
    assert len({id(b) for b in b0}) == len(b0) and all(isinstance(b, torch.nn.Parameter) for b in b0)
    # one backward reaches θ and every block's own b(0)
    model.train()
    out = model(*batch())[0]
    out.pow(2).mean().backward()
    assert enc.position_scheme.flow.dynamics.fc2.weight.grad.abs().sum() > 0
    assert all(b.grad is not None and b.grad.abs().sum() > 0 for b in b0)


def test_parameters_added_per_arch():
    def added(arch):
        fl = sum(p.numel() for p in build("floater_" + arch).parameters())
        return fl - sum(p.numel() for p in build(arch).parameters())

    flow = lambda d: 2 * ((d + 1) * d + d)  # noqa: E731
    assert added("transformer_tiny") == 3 * flow(64)
    assert added("transformer_wmt_en_de") == 3 * flow(512) == 3 * 526_336  # encoder + 2 decoder flows


def test_input_variant_drives_only_the_first_block():
    model = floater_model(floater_layers="input")
    assert len(model.encoder.position_scheme.projections) == 3
    assert len(model.decoder.position_scheme.projections) == 4 and len(model.decoder.position_scheme.cross_projections) == 2
    first = model.encoder.layers[0].self_attn
    assert {id(p) for p in model.encoder.position_scheme.projections} == {id(first.q_proj), id(first.k_proj),
                                                                  id(first.v_proj)}


# -- warm start identity -------------------------------------------------------------------------------

@pytest.mark.parametrize("layers", ["all", "input"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_zero_flow_equals_fairseq_transformer(mode, layers):
    fl = build("floater_transformer_tiny", floater_layers=layers)
    tr = build("transformer_tiny", seed=1)
    with torch.no_grad():  # non-trivial biases b(0) (and layer norms)
        for p in fl.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.2)
    randomize_flows(fl)
    for flow in flows(fl):
        flow.dynamics.zero_output_()
    missing, unexpected = tr.load_state_dict(fl.state_dict(), strict=False)
    assert not missing and all(".position_scheme." in k or k == "position_record" for k in unexpected)  # its own record
    fl, tr = fl.double(), tr.double()
    getattr(fl, mode)()
    getattr(tr, mode)()
    src, lengths, prev = batch()
    torch.testing.assert_close(fl(src, lengths, prev)[0], tr(src, lengths, prev)[0], rtol=0, atol=1e-5)


# -- positions ------------------------------------------------------------------------------------------

def test_incremental_decoding_equals_full_forward():
    model = floater_model().eval()
    src, lengths, prev = batch()
    prev[1, -2:] = 5  # no padding inside the prefixes fed step by step
    enc = model.encoder(src, lengths)
    full = model.decoder(prev, enc)[0]
    state = {}
    steps = [model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0] for t in range(prev.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("no_cross_attention", [False, True])
def test_each_decoder_forward_binds_all_its_biases_at_once(monkeypatch, no_cross_attention):
    """A full forward and every incremental step gather all the decoder's biases first (target flow and source
    flow) and bind them in one call, each driven projection once."""
    model = floater_model(no_cross_attention=no_cross_attention).eval()
    dec = model.decoder
    src, lengths, prev = batch()
    gather = Floater._decoder_bindings
    calls = []

    def counting(self, *args):
        bindings = gather(self, *args)
        calls.append(list(bindings))
        return bindings

    monkeypatch.setattr(Floater, "_decoder_bindings", counting)
    enc = model.encoder(src, lengths)
    calls.clear()
    with torch.no_grad():
        dec(prev, enc)
        state = {}
        for t in range(3):
            dec(prev[:, : t + 1], enc, incremental_state=state)
    driven = [id(p) for p in dec.position_scheme.projections + dec.position_scheme.cross_projections]
    assert bool(dec.position_scheme.cross_projections) is not no_cross_attention
    assert [[id(p) for p in call] for call in calls] == [driven] * 4


def test_long_incremental_decoding_equals_full_forward(monkeypatch):
    """40 steps: the step bias table kept in the incremental state is outgrown twice (16, 32, 64 rows); every
    step still equals the full forward, and a generation after a parameter change sees the new parameters."""
    model = floater_model().eval()
    src, lengths, _ = batch(src_len=5)
    prev = torch.randint(4, VOCAB, (src.size(0), 40), generator=torch.Generator().manual_seed(5))
    calls = count_solves(monkeypatch)

    def steps():
        enc, state = model.encoder(src, lengths), {}
        out = torch.cat([model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0]
                         for t in range(prev.size(1))], dim=1)
        return out, model.decoder(prev, enc)[0]

    incremental, full = steps()
    torch.testing.assert_close(incremental, full, rtol=0, atol=1e-6)
    assert len(calls) <= 3  # the first solve, then at most the eval cache's extensions (doublings)
    with torch.no_grad():
        model.decoder.layers[0].self_attn.q_proj.bias.add_(0.5)
    incremental_after, full_after = steps()
    torch.testing.assert_close(incremental_after, full_after, rtol=0, atol=1e-6)
    assert (full_after - full).abs().max() > 1e-3


def test_beam_search_scores_equal_teacher_forced_scores():
    """Beam 4 with left-padded sources: each hypothesis' step scores (incremental decoding, cross-attention
    keys projected once per sentence) equal a full forward over the finished hypothesis."""
    model = floater_model().eval()
    src, lengths, _ = batch(bsz=2)
    gen = SequenceGenerator([model], TASK.target_dictionary, beam_size=4, max_len_b=12, normalize_scores=False)
    hypos = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    eos = TASK.target_dictionary.eos()
    for i, sentence in enumerate(hypos):
        for hypo in sentence:
            tokens = hypo["tokens"]
            prev = torch.cat([tokens.new_tensor([eos]), tokens[:-1]]).unsqueeze(0)
            logits = model(src[i: i + 1, src[i].ne(PAD)], lengths[i: i + 1], prev)[0]
            lprobs = model.get_normalized_probs((logits, None), log_probs=True)[0]
            expected = lprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(hypo["positional_scores"], expected, rtol=0, atol=1e-4)


def test_long_inputs_extend_the_cache_and_match_a_fresh_solve(monkeypatch):
    model = floater_model().eval()
    src, lengths, prev = batch(src_len=8)
    model(src, lengths, prev)  # cache holds 64 rows
    cached = model.encoder.position_scheme.positions.eval_solves.cache.delta[0].size(0)
    long_src, long_prev = torch.randint(4, VOCAB, (2, 4 * cached)), torch.randint(4, VOCAB, (2, 4 * cached))
    calls = count_solves(monkeypatch)
    out = model(long_src, long_src.ne(PAD).sum(1), long_prev)[0]
    assert len(calls) == 1  # one extension, all flows
    fresh = copy.deepcopy(model)
    for flow in flows(fresh):
        flow.invalidate_cache()
    torch.testing.assert_close(out, fresh(long_src, long_src.ne(PAD).sum(1), long_prev)[0], rtol=0, atol=1e-8)
    assert all(delta.size(0) >= 4 * cached for delta in model.encoder.position_scheme.positions.eval_solves.cache.delta)


# -- caching and gradients -----------------------------------------------------------------------------

def test_eval_cache_no_solve_until_parameters_change(monkeypatch):
    model = floater_model().eval()
    src, lengths, prev = batch()
    calls = count_solves(monkeypatch)
    first = model(src, lengths, prev)[0]
    assert len(calls) == 1
    torch.testing.assert_close(model(src, lengths, prev)[0], first, rtol=0, atol=0)
    assert len(calls) == 1  # second forward: no ODE work
    # a parameter update (in place, as optimizers do) invalidates the cache
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    model(src, lengths, prev)[0].pow(2).mean().backward()
    opt.step()
    model.eval()
    calls.clear()
    model(src, lengths, prev)
    assert len(calls) == 1
    # so do fairseq's set_num_updates (its Adam edits weights through .data, which keeps _version) ...
    def edit_through_data_then_set_num_updates():
        model.encoder.position_scheme.flow.dynamics.fc2.bias.data.add_(0.01)
        model.set_num_updates(7)

    # ... and load_state_dict
    for change in (edit_through_data_then_set_num_updates, lambda: model.load_state_dict(model.state_dict())):
        calls.clear()
        model(src, lengths, prev)
        assert len(calls) == 0
        change()
        model(src, lengths, prev)
        assert len(calls) == 1


def test_update_every_1_gives_theta_gradient_every_update():
    for fact in train_updates(floater_model(floater_update_every=1), 4):
        assert fact["solved"] and fact["theta_grad"] > 0 and fact["b0_grad"] > 0


def test_update_every_n_resolves_every_n_updates_and_b0_always_learns(monkeypatch):
    model = floater_model(floater_update_every=3)
    calls = count_solves(monkeypatch)
    facts = list(train_updates(model, 7))
    assert [f["solved"] for f in facts] == [k % 3 == 0 for k in range(7)]
    # updates 0, 3, 6: the solve with gradient (7 positions) and the cache's, from the same b(0) and θ without
    # gradient (16 positions, see positions._TrainingSolves._canonical); the other updates do no solver work at all
    assert calls == [7, 16] * 3
    for f in facts:
        assert (f["theta_grad"] > 0) == (f["update"] % 3 == 0)
        assert f["b0_grad"] > 0  # b(0) + cached Δb: b(0) keeps its gradient
    # the counter and the cache are module state: they survive a state_dict round trip (checkpoint resume)
    assert int(model.encoder.position_scheme.flow.num_updates) == 7
    state = model.state_dict()
    theta = sum(p.numel() for p in model.encoder.position_scheme.flow.parameters())
    assert state["encoder.position_scheme.flow._extra_state"].shape == (6 * 64 + theta,)  # b(0) and θ of update 6
    resumed = floater_model(floater_update_every=3, seed=5)
    resumed.load_state_dict(state)
    assert all(f._num_updates == 7 and int(f.num_updates) == 7 for f in flows(resumed))
    calls.clear()
    facts = list(train_updates(resumed, 1))  # update 7: the cache rebuilt from update 6's b(0) and θ, no gradient
    assert calls == [16] and facts[0]["theta_grad"] == 0
    # a checkpoint without the cache (saved before it travelled with the model) loads strictly, then re-solves
    old = floater_model(floater_update_every=3, seed=5)
    old.load_state_dict({k: v for k, v in state.items() if not k.endswith("_extra_state")})
    assert all(f.train_cache is None for f in flows(old))
    assert next(train_updates(old, 1))["theta_grad"] > 0


def test_cached_training_update_uses_cached_values():
    model = floater_model(floater_update_every=4)
    gen = train_updates(model, 2)
    next(gen)
    cached = [f.train_cache.delta.clone() for f in flows(model)]
    next(gen)  # update 1: reuse
    for now, before in zip([f.train_cache.delta for f in flows(model)], cached):
        torch.testing.assert_close(now[: before.size(0)], before, rtol=0, atol=0)


# -- errors and flags ----------------------------------------------------------------------------------

def test_non_finite_solution_raises_one_clear_error():
    model = floater_model().eval()
    with torch.no_grad():
        model.encoder.position_scheme.flow.dynamics.fc2.bias.fill_(float("nan"))
    with pytest.raises(FloaterSolverError, match=r"non-finite.*--floater-method rk4 --floater-dt 0.1"):
        model(*batch())


def _fast_growing_model():
    """A tiny FLOATER model whose flows grow about 10× per 20 positions (Δ = 0.1): its biases pass float32's
    attention range after about 900 source positions while its solve stays finite up to 1,024."""
    model = build("floater_transformer_tiny", floater_dt=0.1)  # float32
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for flow in flows(model):
            for p in flow.dynamics.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def _generate(model, src_len):
    src = torch.randint(4, VOCAB, (1, src_len), generator=torch.Generator().manual_seed(src_len))
    generator = SequenceGenerator([model], TASK.target_dictionary, beam_size=2, max_len_b=20)
    return generator.generate([model], {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([src_len])}})


def test_decoding_past_the_attention_range_names_the_position_and_the_flag():
    """Was fairseq's `AssertionError: 20 < 20` from the beam search (NaN scores); now one line naming where the
    biases outgrow the attention and the flag that helps, whose advice then decodes."""
    model = _fast_growing_model()
    with pytest.raises(FloaterSolverError) as error:
        _generate(model, 1000)
    message = str(error.value)
    assert "\n" not in message
    first = int(re.search(r"from source position (\d+) on", message).group(1))
    assert f"--max-source-positions {first} --skip-invalid-size-inputs-valid-test" in message, message
    assert 800 < first < 1000, message
    assert _generate(model, first)[0][0]["tokens"].numel() > 0  # inputs within the advice decode


def test_decoding_overflow_ends_fairseq_interactive_with_one_line(tmp_path):
    """The same model as a checkpoint, through fairseq's own command line: the overflow ends the command with
    its one line (exit status 1), not a traceback through the beam search."""
    import subprocess
    import sys

    from fairseq import checkpoint_utils
    from helpers.tiny_models import build_with_args

    model, args = build_with_args("floater_transformer_tiny", floater_dt=0.1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # as _fast_growing_model
        for flow in flows(model):
            for p in flow.dynamics.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    state = {"args": None, "cfg": {"model": args}, "model": model.state_dict(),
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                    "lr_scheduler_state": {}, "num_updates": 0}], "extra_state": {}}
    checkpoint_utils.torch_persistent_save(state, str(tmp_path / "model.pt"))
    for side in ("src", "tgt"):
        TASK.source_dictionary.save(str(tmp_path / f"dict.{side}.txt"))
    words = [TASK.source_dictionary[i] for i in torch.randint(4, VOCAB, (1000,), generator=g).tolist()]
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "fairseq-interactive"), str(tmp_path), "--user-dir",
         str(Path(__file__).resolve().parents[1] / "fairseq_plugins"), "--path", str(tmp_path / "model.pt"),
         "--source-lang", "src", "--target-lang", "tgt", "--cpu", "--beam", "2", "--max-len-b", "20"],
        input=" ".join(words) + "\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("FloaterSolverError: ") and "--max-source-positions" in last, last


def test_overflow_message_names_the_side_and_tells_a_non_position_failure():
    rows = torch.arange(40.0).exp().view(40, 1, 1).expand(40, 2, 8)  # |Δb| = e^i at position i
    message = floater.describe_overflow([("target", rows)], {"target": 40}, torch.float16)
    limit = (torch.finfo(torch.float16).max / 8) ** 0.5  # 90.5: e^5 = 148 is the first past it
    assert f"passes {limit:.3g} from target position 5 on" in message and "--max-len-b 5" in message
    message = floater.describe_overflow([("source", rows[:4])], {"source": 4}, torch.float32)
    assert message.startswith("non-finite decoder output") and "not a position overflow" in message


def parse(argv, capsys):
    parser = options.get_training_parser()
    with pytest.raises(SystemExit) as exit_info:
        options.parse_args_and_arch(parser, input_args=["data-bin", "--user-dir", "fairseq_plugins", *argv])
    return exit_info.value.code, capsys.readouterr()


@pytest.mark.parametrize("flag,value,message", [
    ("--floater-dt", "-1", "argument --floater-dt: must be > 0, got -1"),
    ("--floater-dt", "x", "argument --floater-dt: expected a number, got 'x'"),
    ("--floater-method", "leapfrog", "argument --floater-method: invalid choice: 'leapfrog'"),
    ("--floater-update-every", "0", "argument --floater-update-every: must be > 0, got 0"),
    ("--floater-hidden", "0", "argument --floater-hidden: must be > 0, got 0"),
    ("--floater-layers", "some", "argument --floater-layers: invalid choice: 'some'"),
    ("--floater-flow-init", "normal", "argument --floater-flow-init: invalid choice: 'normal'"),
])
def test_bad_flags_give_one_error_line(flag, value, message, capsys):
    code, out = parse(["--arch", "floater_transformer_tiny", flag, value], capsys)
    assert code == 2
    lines = out.err.strip().splitlines()  # the error alone: no usage before it
    assert len(lines) == 1 and "error:" in lines[0] and message in lines[0], lines


def test_flags_in_help_and_defaults(capsys):
    code, out = parse(["--arch", "floater_transformer", "--help"], capsys)
    text = " ".join(out.out.split())
    assert code == 0
    for flag in ("--floater-dt D grid spacing", "--floater-method SOLVER torchdiffeq solver",
                 "--floater-rtol R relative", "--floater-atol A absolute", "--floater-adjoint back-propagate",
                 "--floater-hidden H hidden width", "--floater-update-every N re-solve",
                 "--floater-cuda-graph on CUDA, replay", "--floater-layers {all,input} blocks",
                 "--floater-cache-whole-bias with --floater-update-every N > 1",
                 "--floater-flow-init {zero,xavier} initial output layer"):
        assert flag in text
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        "data-bin", "--user-dir", "fairseq_plugins", "--arch", "floater_transformer_tiny"])
    assert (args.floater_dt, args.floater_method, args.floater_update_every, args.floater_layers,
            args.floater_adjoint, args.floater_hidden, args.floater_cache_whole_bias,
            args.floater_flow_init) == (0.1, "rk4", 1, "all", False, None, False, "zero")
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_layers,
            args.encoder_attention_heads) == (64, 64, 2, 2)  # fairseq's transformer_tiny


@pytest.mark.parametrize("setting,message", [
    (dict(floater_dt=0.0), "--floater-dt must be"),
    (dict(floater_method="leapfrog"), "--floater-method invalid choice: 'leapfrog'"),
    (dict(floater_update_every=2.0), "--floater-update-every expected an integer, got '2.0'"),
    (dict(floater_update_every=0), "--floater-update-every must be"),
    (dict(floater_hidden=0), "--floater-hidden must be"),
    (dict(floater_layers="most"), "--floater-layers invalid choice: 'most'"),
    (dict(floater_cache_whole_bias=True), "--floater-cache-whole-bias needs --floater-update-every N > 1"),
    (dict(floater_flow_init="normal"), r"--floater-flow-init invalid choice: 'normal' \(choose from zero, xavier\)"),
    (dict(cross_self_attention=True), "does not support --cross-self-attention"),
])
def test_bad_settings_rejected_at_build(setting, message):
    with pytest.raises(ValueError, match=message):
        build("floater_transformer_tiny", **setting)


def test_adaptive_solver_and_adjoint_train():
    model = floater_model(floater_method="dopri5", floater_adjoint=True)
    fact = next(train_updates(model, 1))
    assert fact["solved"] and fact["theta_grad"] > 0


def test_archs_are_fairseqs_with_floater_defaults():
    floater_defaults = dict(floater_dt=0.1, floater_method="rk4", floater_rtol=1e-4, floater_atol=1e-6,
                            floater_adjoint=False, floater_hidden=None, floater_update_every=1, floater_layers="all",
                            floater_cuda_graph=False, floater_cache_whole_bias=False, floater_flow_init="zero",
                            floater_shared_solve=False)
    for suffix in ("", "_wmt_en_de", "_vaswani_wmt_en_de_big", "_vaswani_wmt_en_fr_big", "_tiny"):
        ours, theirs = argparse.Namespace(), argparse.Namespace()
        ARCH_CONFIG_REGISTRY["floater_transformer" + suffix](ours)
        ARCH_CONFIG_REGISTRY["transformer" + suffix](theirs)
        expected = {**vars(theirs), **floater_defaults, "position_scheme": "floater"}
        assert {name: vars(ours).get(name) for name in expected} == expected
        # the rest: the other schemes' flags at their defaults (a checkpoint's arguments hold them all)
        assert not {n for n in vars(ours) if n not in expected and n.startswith("floater_")}


# -- validation and optimizers ------------------------------------------------------------------------

def test_validation_solves_once_per_parameter_version(monkeypatch):
    """fairseq's valid_step calls model.eval() before every batch: one solve for all of them; the next
    training update (in place through .data, then set_num_updates, as fairseq's trainer) invalidates it."""
    model = floater_model()
    calls = count_solves(monkeypatch)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for update in range(2):
        model.train()
        model(*batch())[0].pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.05)  # through .data: no _version bump
        opt.zero_grad()
        model.set_num_updates(update + 1)
        calls.clear()
        for k in range(4):
            model.eval()
            with torch.no_grad():
                model(*batch(seed=k))
        assert len(calls) == 1


def test_theta_may_skip_update_only_with_cached_updates():
    """--floater-update-every N > 1: θ sits out the cached updates; its parameters say so to optimizers."""
    for every in (1, 3):
        model = build("floater_transformer_tiny", floater_update_every=every).half()
        theta = {id(p) for flow in flows(model) for p in flow.dynamics.parameters()}
        for p in model.parameters():
            assert getattr(p, "may_skip_update", False) == (every > 1 and id(p) in theta)
