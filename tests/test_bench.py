"""scripts/bench/bench.py --quick: a well-formed report with every model and length, positive finite figures (never
a bound on a timing: the machine running the tests is shared)."""
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from conftest import run

QUICK_LENGTHS = [16, 32]  # bench.py --quick
MODELS = ["transformer", "relative", "floater", "floater_every100"]


@pytest.mark.slow  # every model trained and decoded at two lengths
def test_quick_benchmark_reports_every_model_and_length(tmp_path):
    out_json, out_md, notes = tmp_path / "bench.json", tmp_path / "bench.md", tmp_path / "notes.md"
    notes.write_text("## Analysis\n\nWhat dominates each unmet goal.\n", encoding="utf-8")
    proc = run([sys.executable, "scripts/bench/bench.py", "--quick", "--silent", "--notes", str(notes),
                "--profile-length", "16", "--profile-decode", "32", "--out-json", str(out_json), "--out-md", str(out_md)])
    res = json.loads(out_json.read_text())
    md = out_md.read_text()
    assert md.strip() in proc.stdout  # the report is also printed

    rows = {(r["model"], r["length"]): r for r in res["rows"]}
    assert set(rows) == {(m, T) for m in MODELS for T in QUICK_LENGTHS}

    def positive(x):
        return isinstance(x, float) and math.isfinite(x) and x > 0

    for (model, T), r in rows.items():
        assert r["batch_sentences"] == 256 // T
        assert positive(r["peak_memory_mib"]) and positive(r["memory_ratio"])
        assert positive(r["train_update_median_s"]) and positive(r["train_ratio"])
        for clock in ("wall", "cpu"):
            assert positive(r[f"train_update_{clock}_median_s"])
        if model == "floater_every100":  # the same model as floater at inference: not decoded twice
            assert "decode_per_sentence_median_s" not in r
            assert positive(r["train_update_cached_median_s"])
        else:
            assert r["decode_sentences"] == 64 // T
            assert positive(r["decode_per_sentence_median_s"]) and positive(r["decode_ratio"])
            assert all(positive(t) for t in r["decode_per_sentence_s"]["wall"])
        assert len(r["train_update_s"]["wall"]) >= 1 and all(positive(t) for t in r["train_update_s"]["wall"])
        if model == "transformer":
            assert r["train_ratio"] == r["decode_ratio"] == r["memory_ratio"] == 1.0
        # one markdown table row per (model, T), ratios beside the absolute medians
        line = next(x for x in md.splitlines() if x.startswith(f"| {model} | {T} | "))
        assert line.count("|") == 13 and "×" in line
    assert math.isfinite(rows["floater", 16]["ode_share"])

    assert res["settings"]["quick"] and res["settings"]["dims"] == "tiny"
    assert res["machine"]["torch"] and res["machine"]["threads"] >= 1
    assert res["command"].startswith("scripts/bench/bench.py --quick")
    assert res["load_average"]["samples"]
    assert {g["model"] for g in res["goals"]} == {"relative", "floater", "floater_every100"}
    for heading in ("Command: `scripts/bench/bench.py --quick", "Machine:", "Goals", "Peak memory:"):
        assert heading in md
    # profiles: one training update of every model at T = 16, one decoding call of each decoded model at T = 32
    profiles = res["profiles"]
    assert profiles["length"] == 16 and profiles["decode_length"] == 32
    for name, decoded in [(m, False) for m in MODELS] + [(m, True) for m in MODELS if m != "floater_every100"]:
        p = profiles["decode"][name] if decoded else profiles[name]
        assert positive(p["total_self_ms"]) and p["top"] and all(o["calls"] >= 1 for o in p["top"])
        if decoded:  # fairseq's decoder range: the Python between a step's operators
            assert p["ranges_self_ms"]["EnsembleModel: forward_decoder"] > 0
        training_section, decoding_section = md.split("one training update")[1].split("one decoding call")
        assert f"- `{name}` (" in (decoding_section if decoded else training_section)
    assert "Profiles: one decoding call at T = 32" in md
    assert md.endswith("\n## Analysis\n\nWhat dominates each unmet goal.\n")  # the notes close the report


@pytest.mark.slow  # three bench.py processes (each imports torch and fairseq)
def test_profile_lengths_must_be_measured(tmp_path):
    """A profile asked for at a length the run does not measure is one error line, before anything runs."""
    for argv, message in [(["--profile-decode", "64"], "--profile-decode 64: not one of --lengths 16,32"),
                          (["--profile-length", "8"], "--profile-length 8: not one of --lengths 16,32"),
                          (["--profile-decode", "16", "--no-decode"], "--profile-decode needs decoding")]:
        proc = run([sys.executable, "scripts/bench/bench.py", "--quick", "--silent", *argv,
                    "--out-json", str(tmp_path / "b.json"), "--out-md", str(tmp_path / "b.md")], check=False)
        assert proc.returncode != 0 and proc.stdout.strip().splitlines()[-1].startswith(message), proc.stdout
        assert not (tmp_path / "b.json").exists()


def test_count_ops_reports_operators_and_syncs(tmp_path):
    """--count-ops --quick: one update per model and FLOATER's exact solve at both lengths; the solve has no host
    sync and stays under its operator bounds per RK4 step (a regression guard, not a timing)."""
    out_json, out_md = tmp_path / "ops.json", tmp_path / "ops.md"
    proc = run([sys.executable, "scripts/bench/bench.py", "--count-ops", "--quick", "--silent",
                "--out-json", str(out_json), "--out-md", str(out_md)])
    res = json.loads(out_json.read_text())
    md = out_md.read_text()
    assert md.strip() in proc.stdout
    assert {(r["model"], r["length"]) for r in res["updates"]} == {
        (m, T) for m in ("transformer", "relative", "floater") for T in QUICK_LENGTHS}
    assert all(r["ops"] > 0 for r in res["updates"])
    assert [r["length"] for r in res["solves"]] == QUICK_LENGTHS
    for r in res["solves"]:
        assert r["rows"] == [6, 8, 4] and r["steps"] == 5 * (r["length"] - 1)
        assert r["forward_syncs"] == {} and r["backward_syncs"] == {}
        assert r["forward_ops_per_step"] <= 16 and r["backward_ops_per_step"] <= 24
        assert r["forward_s"] > 0 and r["backward_s"] > 0
    for heading in ("## One training update", "## FLOATER's exact solve", "| floater | 32 | 8 |"):
        assert heading in md


def test_the_graphed_floater_needs_cuda(tmp_path):
    """floater_graph (FLOATER with --floater-cuda-graph) on CPU would time the loop under the graph's name: one
    error line, before anything runs (gpu_check.sh --dry-run runs it under the emulation of CUDA graphs)."""
    proc = run([sys.executable, "scripts/bench/bench.py", "--quick", "--silent", "--device", "cpu", "--models",
                "floater,floater_graph", "--out-json", str(tmp_path / "b.json"), "--out-md", str(tmp_path / "b.md")],
               check=False)
    assert proc.returncode != 0 and proc.stdout.strip().splitlines()[-1] == (
        "--models floater_graph: FLOATER's CUDA-graph solve needs --device cuda (on CPU it runs only under "
        "gpu_check.sh --dry-run's emulation of CUDA graphs)"), proc.stdout
    assert not (tmp_path / "b.json").exists()


def test_a_model_that_cannot_train_is_reported_and_the_others_measured(tmp_path, monkeypatch):
    """A memory probe whose model fails (an H100's compile error: it holds a module, which the probes' pool cannot
    pickle back, so the whole run ended) returns its reason as text; the run reports that model with it and times
    the others."""
    import pickle
    import types

    from tooling.bench import phases as bench

    def failing_build(*args, **kwargs):
        error = RuntimeError("LoweringException: the cause\nSet TORCHDYNAMO_VERBOSE=1 for more")
        error.module = types  # what made the pool's pickling fail
        raise error

    with monkeypatch.context() as m:
        m.setattr(bench.Bundle, "build", failing_build)
        reason = bench.memory_probe(dict(name="t5", arch="t5_transformer_tiny", flags=[], length=8, bsz=2,
                                         vocab=100, device="cpu", seed=1, threads=1))
    assert reason == "RuntimeError: LoweringException: the cause" and pickle.loads(pickle.dumps(reason)) == reason

    def probes(jobs, workers):  # the pool's answers, the failing model's being the reason above
        return ((job, reason if job["name"] == "t5" else 10.0) for job in jobs)

    monkeypatch.setattr(bench, "measure_memory", probes)
    from tooling.bench import cli  # scripts/bench/bench.py's command line

    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    cli.main(["--quick", "--silent", "--no-decode", "--models", "t5,alibi", "--out-json", str(out_json),
              "--out-md", str(out_md)])
    rows = {(r["model"], r["length"]): r for r in json.loads(out_json.read_text())["rows"]}
    assert set(rows) == {(m, T) for m in ("transformer", "t5", "alibi") for T in QUICK_LENGTHS}
    for T in QUICK_LENGTHS:
        assert rows["t5", T]["error"] == reason and "train_update_median_s" not in rows["t5", T]
        assert rows["alibi", T]["train_update_median_s"] > 0 and "error" not in rows["alibi", T]
    assert f"`t5` at T = 16 failed: {reason}" in out_md.read_text()


def test_a_run_cut_short_leaves_the_lengths_it_measured(tmp_path, monkeypatch):
    """The GPU check kills the benchmark at its section's cap (the H200 run's section bench: nothing written after 90 s).
    The report is written after every length but the last, marked partial, so a run killed at the next length
    leaves the ones it finished; here the second length's training raises in its place."""
    from tooling.bench import phases as bench

    train_phase = bench.train_phase

    def cut_at_the_second_length(p, bundles, T, sample):
        if T == QUICK_LENGTHS[1]:
            raise KeyboardInterrupt("killed at its cap")
        return train_phase(p, bundles, T, sample)

    monkeypatch.setattr(bench, "train_phase", cut_at_the_second_length)
    from tooling.bench import cli  # scripts/bench/bench.py's command line

    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--quick", "--silent", "--no-decode", "--no-memory", "--models", "relative", "--out-json",
                  str(out_json), "--out-md", str(out_md)])
    report = json.loads(out_json.read_text())
    assert report["partial"] == f"T = {QUICK_LENGTHS[1]} still to run"
    rows = {(r["model"], r["length"]): r for r in report["rows"]}
    assert rows["relative", QUICK_LENGTHS[0]]["train_ratio"] > 0
    assert "train_update_median_s" not in rows["relative", QUICK_LENGTHS[1]]
    assert out_md.read_text().splitlines()[2] == f"**PARTIAL**: T = {QUICK_LENGTHS[1]} still to run (the run was " \
                                                 "written before it ended)."


def test_graphs_compiled_during_updates_are_counted():
    """The bench counts torch.compile's graphs around each update: the warm-up's compiles, and any recompile in the
    timed updates (which would make those times a compile's)."""
    import torch

    from tooling.bench import phases as bench

    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    row = {}
    with bench.counting_graphs(row, "warmup"):
        f(torch.ones(3))
    with bench.counting_graphs(row, "timed"):
        f(torch.ones(3))  # the same sizes: no new graph
    assert row == {"warmup": 1, "timed": 0}
    with bench.counting_graphs(row, "timed"):
        f(torch.ones(5))  # another static size: a recompile
    assert row == {"warmup": 1, "timed": 1}
    torch._dynamo.reset()


# -- the users' regime (scripts/bench/bench.py --regime) ------------------------------------------------------------

def test_the_length_mix_batches_like_fairseq():
    """The committed newstest2014 histogram, drawn and batched as fairseq-train batches it: every batch within
    --max-tokens, padding included (sentences × the longest side), each sentence its drawn lengths + EOS, the
    sentences of a batch a multiple of 8 unless fewer fit, and no sentence in two batches."""
    from tooling.bench import length_mix
    from tooling.bench.models import synthetic_dictionary

    pairs = length_mix.load_pairs()
    assert len(pairs) == 3003 and 30 < sum(s for s, _ in pairs) / 3003 < 40
    dictionary = synthetic_dictionary(64)
    for max_tokens in (256, 2048, 16384):
        drawn = length_mix.draw(pairs, 600, seed=3)
        dataset, left_out = length_mix.language_pairs(drawn, dictionary, 3, max_tokens)
        assert left_out == sum(max(s, t) + 1 > max_tokens for s, t in drawn)
        batches = length_mix.fairseq_batches(dataset, max_tokens, seed=3)
        seen = []
        for b in batches:
            src, tgt = b["net_input"]["src_tokens"], b["target"]
            assert src.shape[0] * max(src.shape[1], tgt.shape[1]) <= max_tokens
            assert b["nsentences"] % 8 == 0 or (b["nsentences"] + 8) * max(src.shape[1], tgt.shape[1]) > max_tokens
            kept = [(s, t) for s, t in drawn if max(s, t) + 1 <= max_tokens]
            lengths = [(int(s) - 1, int(t) - 1) for s, t in zip(b["net_input"]["src_lengths"],
                                                                  tgt.ne(dictionary.pad()).sum(1))]
            assert lengths == [kept[i] for i in b["id"].tolist()]
            assert src[:, -1].eq(dictionary.eos()).all()  # left-padded sources end in EOS
            seen += b["id"].tolist()
        assert sorted(seen) == list(range(len(dataset)))  # every kept sentence once
    batches, drawn, _ = length_mix.corpus(pairs, dictionary, 1024, 5, seed=1)
    assert len(batches) == 5 and drawn >= 16


NEWSTEST = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wmt14"


@pytest.mark.skipif(not (NEWSTEST / "newstest2014.ende.en").exists(),
                    reason="../shared/data/wmt14 (newstest) is not present")
def test_the_committed_length_mix_is_derived_from_newstest(tmp_path):
    """tooling.bench.length_mix.derive on ../shared/data's newstest files gives the committed histogram."""
    import json as json_

    from tooling.bench import length_mix

    d = NEWSTEST
    table = length_mix.derive(d / "newstest2014.ende.en", d / "newstest2014.ende.de",
                              [d / "newstest2013.ende.en", d / "newstest2013.ende.de"])
    assert table["pairs"] == json_.loads(length_mix.LENGTHS_FILE.read_text())["pairs"]


def test_transformer_flops_count_every_product_of_the_model():
    """The analytic count equals 6 × (each weight matrix's entries × the tokens it multiplies) + 12·L·d·(the
    attention's score and sum products), read off the model's own Linear shapes."""
    from fairseq_plugins.schemes import MODELS
    from tooling.bench.models import synthetic_dictionary
    from tooling.bench.regime import build_trainer, transformer_flops

    dictionary = synthetic_dictionary(100)
    trainer = build_trainer(MODELS["transformer"].arch("tiny"), [], "fp32", dictionary, "cpu", 1)
    B, S, T = 3, 7, 5
    per_token = {"encoder": 0, "decoder": 0, "cross_kv": 0}
    for name, m in trainer.model.named_modules():
        if isinstance(m, torch.nn.Linear) and ".layers." in name:
            key = ("cross_kv" if "encoder_attn.k_proj" in name or "encoder_attn.v_proj" in name
                   else name.split(".")[0])
            per_token[key] += m.weight.numel()
    cfg, L, d = trainer.cfg.model, 2, 64
    want = 6 * (per_token["encoder"] * B * S + per_token["decoder"] * B * T + per_token["cross_kv"] * B * S
                + d * len(dictionary) * B * T) + 12 * L * d * B * (S * S + T * T + T * S)
    assert transformer_flops(cfg, len(dictionary), (B, S), (B, T)) == want


@pytest.mark.parametrize("dims", ["tiny", "base"])
def test_the_plugin_attention_baseline_is_the_transformer(dims):
    """transformer_plugin_attention: fairseq's Transformer of the same size (the same config dims, parameter names and
    shapes) whose self-attention is the plugins' PositionalSelfAttention; given the Transformer's weights it computes
    the Transformer's log-probabilities (padding in the batch; float32 rounding: the two attentions scale and sum
    in other orders)."""
    from fairseq.modules import MultiheadAttention
    from fairseq_plugins.models._base import RECORD
    from fairseq_plugins.modules.positional_attention import PositionalSelfAttention
    from tooling.bench.models import BASELINE, DIMS, PLUGIN_BASELINE, model_specs, synthetic_dictionary
    from tooling.bench.regime import build_trainer, regime_archs

    dictionary = synthetic_dictionary(120)
    specs = model_specs(dims, 100, archs=regime_archs(dims))
    (want, want_cfg), (got, got_cfg) = ((t.model, t.cfg.model) for t in (
        build_trainer(*specs[name][:2], "fp32", dictionary, "cpu", 1, kind=specs[name][2])
        for name in (BASELINE, PLUGIN_BASELINE)))
    assert {k: getattr(got_cfg, k) for k in DIMS} == {k: getattr(want_cfg, k) for k in DIMS}
    assert want_cfg.arch == specs[BASELINE][0] and got_cfg.position_scheme == "sinusoidal"
    mine = {RECORD: got.state_dict()[RECORD]}  # the plugins' record of the model's schemes, a buffer of their own
    assert {k: v.shape for k, v in got.state_dict().items() if k not in mine} == \
        {k: v.shape for k, v in want.state_dict().items()}
    layers = [*got.encoder.layers, *got.decoder.layers]
    assert all(type(layer.self_attn) is PositionalSelfAttention for layer in layers)
    assert all(type(layer.self_attn) is MultiheadAttention for layer in [*want.encoder.layers, *want.decoder.layers])
    if dims == "base":
        return  # the forward at base dims: the tiny case checks the same code
    got.load_state_dict({**want.state_dict(), **mine})
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, len(dictionary), (3, 9), generator=g)
    src[1, :3] = dictionary.pad()  # fairseq pads sources on the left
    prev = torch.randint(4, len(dictionary), (3, 7), generator=g)
    prev[2, 5:] = dictionary.pad()
    lengths = src.ne(dictionary.pad()).sum(1)
    want.eval(), got.eval()
    with torch.no_grad():
        a, b = (m(src, lengths, prev)[0] for m in (want, got))
    assert torch.allclose(a, b, rtol=0, atol=1e-5), float((a - b).abs().max())


def test_the_regime_reports_tokens_per_second_ratios_and_flops(tmp_path):
    """--regime --quick in every precision (fairseq's Trainer: FP16Optimizer for --fp16/--bf16, AMPOptimizer for
    --amp): a row per model with tokens/s, the ratio to the Transformer, FLOPs and their rate, decoding too."""
    from fairseq.optim import AMPOptimizer, FP16Optimizer
    from tooling.bench import regime as bench_regime

    built = []
    build = bench_regime.build_trainer

    def recording(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    from tooling.bench import cli  # scripts/bench/bench.py's command line

    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bench_regime, "build_trainer", recording)
        cli.main(["--regime", "--quick", "--silent", "--device", "cpu", "--precision", "fp32,amp,bf16,fp16",
                  "--max-tokens", "384", "--models", "rope", "--updates", "1", "--warmup", "0",
                  "--out-json", str(out_json), "--out-md", str(out_md)])
    res = json.loads(out_json.read_text())
    assert "partial" not in res and res["matmul_bf16"]["flops_per_s"] > 0
    rows = {(r["precision"], r["model"]): r for r in res["rows"]}
    assert set(rows) == {(p, n) for p in ("fp32", "amp", "bf16", "fp16") for n in ("transformer", "rope")}
    for (precision, model), r in rows.items():
        assert r["tokens_per_s"] > 0 and r["train_ratio"] > 0 and r["decode_tokens_per_s"] > 0
        assert r["flops"] > 0 and r["flops_per_s"] > 0 and r["matmul_fraction"] > 0
        assert r["max_tokens"] == 384 and r["dims"] == "tiny" and r["updates"] == 1
        if model == "transformer":
            assert r["train_ratio"] == r["decode_ratio"] == 1.0
    optimizers = [type(t.optimizer) for t in built]
    assert optimizers.count(AMPOptimizer) == 2 and optimizers.count(FP16Optimizer) == 4  # amp; bf16 and fp16
    for b in res["batches"]:
        assert all(s * max(x[1], y[1]) <= 384 for s, (x, y) in zip(b["sentences"], b["padded_tokens"]))
    md = out_md.read_text()
    assert "| tiny | bf16 | 384 | rope |" in md and "GFLOP per update" in md


@pytest.mark.slow  # FLOATER's exact solve in 3 micro-batches and a profiled update: ~35 CPU s
def test_the_regime_takes_update_freq_micro_batches_per_update_and_profiles_one(tmp_path, monkeypatch):
    """--update-freq 3: every Trainer.train_step gets 3 batches; --profile-update: one more update of each model
    under torch.profiler, whose top operators show FLOATER's solve."""
    from fairseq.trainer import Trainer

    steps, train_step = [], Trainer.train_step

    def recording(self, samples, *args, **kwargs):
        steps.append(len(samples))
        return train_step(self, samples, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", recording)
    from tooling.bench import cli  # scripts/bench/bench.py's command line

    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    cli.main(["--regime", "--quick", "--silent", "--device", "cpu", "--max-tokens", "256", "--models",
              "floater_shared", "--update-freq", "3", "--updates", "1", "--warmup", "0", "--no-decode",
              "--profile-update", "--out-json", str(out_json), "--out-md", str(out_md)])
    res = json.loads(out_json.read_text())
    assert steps == [3] * 4  # the timed update of each of the 2 models, then one profiled update each
    assert {r["model"]: r["updates"] for r in res["rows"]} == {"transformer": 1, "floater_shared": 1}
    assert res["settings"]["update_freq"] == 3 and len(res["batches"][0]["sentences"]) == 3
    assert set(res["profiles"]["models"]) == {"transformer", "floater_shared"}
    assert "_LatentRK4" in {o["op"] for o in res["profiles"]["models"]["floater_shared"]["top"]}
    md = out_md.read_text()
    assert "3 batch(es) per update" in md and "Profiles: one more update of each model" in md


def test_a_regime_run_cut_short_leaves_the_groups_it_measured(tmp_path, monkeypatch):
    """The report is rewritten after every (dims, precision, max tokens) group but the last, marked partial: a run
    killed at its cap (gpu_check's section bench) keeps what it finished; here the second group raises in its place."""
    from tooling.bench import regime as bench_regime

    measure = bench_regime.measure

    def cut_at_the_second_group(args, trainers, names, dictionary, pairs, dims, precision, max_tokens, *rest):
        if max_tokens == 512:
            raise KeyboardInterrupt("killed at its cap")
        return measure(args, trainers, names, dictionary, pairs, dims, precision, max_tokens, *rest)

    monkeypatch.setattr(bench_regime, "measure", cut_at_the_second_group)
    from tooling.bench import cli  # scripts/bench/bench.py's command line

    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--regime", "--quick", "--silent", "--device", "cpu", "--max-tokens", "384,512", "--models", "rope",
                  "--updates", "1", "--warmup", "0", "--no-decode", "--out-json", str(out_json), "--out-md",
                  str(out_md)])
    report = json.loads(out_json.read_text())
    assert report["partial"] == "tiny fp32 512 still to run"
    assert {(r["model"], r["max_tokens"]) for r in report["rows"]} == {("transformer", 384), ("rope", 384)}
    assert "**PARTIAL**: tiny fp32 512 still to run" in out_md.read_text()


def test_count_ops_of_the_users_update_names_every_sync(tmp_path):
    """--count-ops --regime: fairseq's Trainer.train_step counted per precision; --train-flags reaches every
    model's trainer (--fused-update: the trainer's per-update reads of its metrics are gone)."""
    rows = {}
    for flags in ("", "--fused-update --adam-impl torch"):
        out_json, out_md = tmp_path / "u.json", tmp_path / "u.md"
        run([sys.executable, "scripts/bench/bench.py", "--count-ops", "--regime", "--quick", "--silent",
             "--precision", "bf16", "--max-tokens", "1024", "--models", "relative", f"--train-flags={flags}",
             "--out-json", str(out_json), "--out-md", str(out_md)])
        res = json.loads(out_json.read_text())
        assert res["settings"]["update_flags"] == flags.split()
        assert "| tiny | bf16 | 1,024 | relative |" in out_md.read_text()
        rows[flags] = {(r["precision"], r["model"]): r for r in res["rows"]}
    default, fused = rows.values()
    assert default.keys() == fused.keys() == {("bf16", m) for m in ("transformer", "relative")}
    for key, r in default.items():
        assert any("fairseq/logging/meters.py" in site for site in r["sync_sites"]), r["sync_sites"]
        assert not any("fairseq/logging/meters.py" in site for site in fused[key]["sync_sites"])
        assert fused[key]["ops"] < r["ops"] and fused[key]["syncs"] < r["syncs"]


def test_update_memory_reports_a_peak_per_precision_and_update(tmp_path):
    """--count-ops --regime --memory: every precision, default and fused, a positive peak beside the counts."""
    out_json, out_md = tmp_path / "m.json", tmp_path / "m.md"
    run([sys.executable, "scripts/bench/bench.py", "--count-ops", "--regime", "--memory", "--quick", "--silent",
         "--precision", "fp32,amp,bf16,fp16", "--max-tokens", "128", "--models", "transformer", "--memory-reps", "1",
         "--out-json", str(out_json), "--out-md", str(out_md)])
    res = json.loads(out_json.read_text())
    assert res["kind"] == "update_memory"
    rows = {(r["precision"], r["update"]): r for r in res["rows"]}
    assert rows.keys() == {(p, u) for p in ("fp32", "amp", "bf16", "fp16") for u in ("default", "fused")}
    for r in rows.values():
        assert r["peak_mib"] > 0 and len(r["peak_mib_samples"]) == 1 and r["ops"] > 0
    for p in ("fp32", "amp", "bf16", "fp16"):  # the fused rows are --fused-update --adam-impl torch's
        assert rows[p, "fused"]["ops"] < rows[p, "default"]["ops"]
    assert f"| tiny | bf16 | 128 | transformer | fused | {rows['bf16', 'fused']['ops']:,} |" in out_md.read_text()


def _probe_with_an_allocation_in_adams_step(job):
    """The update memory probe, with torch Adam's step holding 64 MiB more while it runs (a forked child's patch)."""
    from fairseq.optim.adam import TorchAdam
    from tooling.bench.update_memory import update_memory_probe

    step = TorchAdam.step

    def holding(self, *args, **kwargs):
        extra = torch.ones(16 * 2**20)  # 64 MiB, written: resident
        out = step(self, *args, **kwargs)
        del extra
        return out

    TorchAdam.step = holding
    return update_memory_probe(job)


def test_update_memory_sees_what_the_update_allocates():
    """The probe's figure is the measured update's: 64 MiB held through the optimizer's step (when the forward's
    activations are gone) raise it by about that much."""
    import multiprocessing

    from tooling.bench.models import FUSED_UPDATE, model_specs
    from tooling.bench.regime import regime_archs
    from tooling.bench.update_memory import update_memory_probe

    arch, flags, kind = model_specs("tiny", 100, archs=regime_archs("tiny"))["transformer"]
    job = dict(arch=arch, flags=flags + list(FUSED_UPDATE), kind=kind, precision="fp32", max_tokens=128, vocab=64,
               seed=1, device="cpu", threads=1)
    with multiprocessing.get_context("fork").Pool(1, maxtasksperchild=1) as pool:  # the patch and mallopt stay there
        plain = pool.apply(update_memory_probe, (job,))
        held = pool.apply(_probe_with_an_allocation_in_adams_step, (job,))
    assert 0 < plain < 48, plain
    assert 56 < held - plain <= 64 + 8, (plain, held)


@pytest.mark.slow
def test_the_speed_checks_dry_run_writes_its_figures(tmp_path):
    """scripts/gpu/speed_check.sh --dry-run: the device script's every step on CPU at tiny dims: both updates' regime
    runs (JSON, with the first group's profile), the exactness of the fused update against the default (on CPU:
    within the bounds, the default twice bit for bit), the tiny recipe alone and two processes side by side counting
    their updates, CUDA MPS's fallback where it cannot start, the schemes' ratios to both baselines, and the tables."""
    out = tmp_path / "out"
    proc = run(["bash", "scripts/gpu/speed_check.sh", "--dry-run", "--out-dir", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["exactness.json", "regime_schemes.json", "regime_tiny_default.json",
                                                    "regime_tiny_fused.json", "speed_check.md", "tiny_rates.json"]
    md = (out / "speed_check.md").read_text()
    assert md.strip() in proc.stdout and "tiny default: ok" in md and "tiny fused: ok" in md
    assert "exactness: ok" in md and "schemes: ok" in md
    exact = json.loads((out / "exactness.json").read_text())
    assert exact["ok"] and [p["precision"] for p in exact["precisions"]] == ["fp32", "bf16", "amp"]
    for p in exact["precisions"]:  # on CPU two runs of the default are bit for bit; the fused one is not
        assert p["default_twice"] == [0.0] * 3 and 0 < p["fused"][0] <= p["bound"]
        assert f"| {p['precision']} | " in md
    free = exact["free_running"]
    assert free["updates"] == 5 and free["default_twice_loss"] == 0 and free["fused_loss"] <= 1e-4 and free["learned"]
    schemes = {r["model"]: r for r in json.loads((out / "regime_schemes.json").read_text())["rows"]}
    assert set(schemes) == {"transformer", "relative", "floater_every100", "transformer_plugin_attention"}
    assert schemes["transformer_plugin_attention"]["plugin_train_ratio"] == 1 == schemes["transformer"]["train_ratio"]
    for name, r in schemes.items():
        assert r["precision"] == "bf16" and f"| {name} | " in md
        assert r["plugin_train_ratio"] == pytest.approx(
            r["train_ratio"] / schemes["transformer_plugin_attention"]["train_ratio"])
    for variant, flags in (("default", []), ("fused", ["--fused-update", "--adam-impl", "torch"])):
        res = json.loads((out / f"regime_tiny_{variant}.json").read_text())
        assert res["settings"]["train_flags"] == " ".join(flags) and res["profiles"]["models"]
        assert {(r["precision"], r["model"]) for r in res["rows"]} == {
            (p, m) for p in ("bf16", "amp") for m in ("transformer", "relative")}
    for row in ("| tiny | bf16 | 512 | transformer |", "| tiny | amp | 512 | relative |"):
        assert row in md
    rates = json.loads((out / "tiny_rates.json").read_text())
    alone, side_by_side, mps = rates["rows"]
    assert alone["processes"] == 1 and side_by_side["processes"] == 2 and not alone["errors"]
    assert alone["updates"] > 0 and side_by_side["updates"] > 0  # every process counted its updates in the window
    if shutil.which("nvidia-cuda-mps-control") is None:
        assert rates["mps"].startswith("not started: ") and mps["skipped"] == rates["mps"]
        assert f"CUDA MPS: {rates['mps']}" in md


def test_the_speed_check_without_a_gpu_refuses_in_one_line_and_writes_nothing(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the check would run")
    out = tmp_path / "out"
    proc = run(["bash", "scripts/gpu/speed_check.sh", "--out-dir", str(out)], check=False)
    assert proc.returncode == 1 and proc.stdout.strip().splitlines()[-1] == \
        "speed_check.py: no CUDA device (on CPU: --dry-run)", proc.stdout
    assert not out.exists()


def test_the_speed_checks_scheme_step_measures_every_scheme():
    """Its GPU call: every scheme of the table, FLOATER exact, graphed and cached, both baselines, valid for bench.py."""
    import importlib.util

    from fairseq_plugins.schemes import MODELS as SCHEME_TABLE
    from tooling.bench.models import GRAPH, PLUGIN_BASELINE, model_specs

    spec = importlib.util.spec_from_file_location("speed_check", "scripts/gpu/speed_check.py")
    speed_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed_check)
    args = speed_check.schemes_args(Path("r.json"), Path("r.md"), dry_run=False)
    models = args[args.index("--models") + 1].split(",")
    assert set(SCHEME_TABLE) - {"transformer"} <= set(models)
    assert {GRAPH, "floater_every100", PLUGIN_BASELINE} <= set(models) <= set(model_specs("base", 100))
    assert args[args.index("--device") + 1] == "cuda" and f"--train-flags={speed_check.FUSED}" in args


def test_the_speed_check_refuses_an_unknown_step_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = run([sys.executable, "scripts/gpu/speed_check.py", "--dry-run", "--steps", "base,nosuch", "--out-dir",
                str(out)], check=False)
    assert proc.returncode == 2 and not out.exists()
    assert proc.stdout.strip().splitlines()[-1].endswith(  # run() merges stderr into stdout
        "--steps base,nosuch: expected a comma-separated list of base, exactness, rates, schemes, big")


def test_an_exactness_part_that_fails_is_reported_and_the_others_run(monkeypatch):
    """An fp16 loss scale that overflows makes the first update fail: that precision is reported failed, in one line,
    and the next precision and the free run still run (so a call on a device keeps what it can measure)."""
    from tooling.bench import exactness
    from tooling.gpu.campaign_jobs import study_model_args

    monkeypatch.setattr(exactness, "COMPARED", [*exactness.COMPARED, "--fp16-init-scale", str(2 ** 40)])
    seen = []
    result = exactness.run("cpu", "tiny", 256, ["fp16", "fp32"], study_model_args().split(), 256, loss_updates=2,
                           progress=lambda r: seen.append(len(r["precisions"])))
    fp16, fp32 = result["precisions"]
    # on a GPU: "RuntimeError: update 1 was skipped"; on CPU fairseq's overflow path itself asks for CUDA first
    assert {k: v for k, v in fp16.items() if k != "error"} == {"precision": "fp16", "bound": exactness.BOUNDS["fp16"],
                                                               "ok": False}
    assert fp16["error"] in ("RuntimeError: update 1 was skipped",
                             "AssertionError: Torch not compiled with CUDA enabled"), fp16["error"]
    assert fp32["ok"] and result["free_running"]["ok"] and not result["ok"] and seen == [1, 2, 2]
