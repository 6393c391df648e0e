"""scripts/plot_positions.py: tiny untrained models of each family saved as fairseq checkpoints; the tool's
matrices against naive references, its figures, and its one-line errors."""
import argparse
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils
from fairseq.modules import SinusoidalPositionalEmbedding

from conftest import REPO, env
from helpers.floater_helpers import randomize_flows
from helpers.tiny_models import PAD, build_with_args, one_thread  # noqa: F401  (one_thread: autouse fixture)
from fairseq_plugins.modules.position_scheme import ScoreBias

import plot_positions as pp
from tooling import position_arrays as pa, position_figures as pf

PNG = b"\x89PNG\r\n\x1a\n"
N = 40  # positions drawn: past a power of two of FLOATER's cache, past the learned tables' 24 rows

FAMILIES = {
    "floater": ("floater_transformer_tiny", {}),
    "sinusoidal": ("transformer_tiny", {}),
    "learned": ("transformer_tiny", dict(encoder_learned_pos=True, decoder_learned_pos=True,
                                         max_source_positions=24, max_target_positions=24)),
    "every_layer_learned": ("transformer_every_layer_pos_tiny", dict(learned_pos=True, max_source_positions=24,
                                                                      max_target_positions=24)),
    "relative": ("relative_transformer_tiny", {}),
    "relative_shared": ("relative_transformer_tiny", dict(relative_per_head=False, max_relative_positions=3)),
    "t5": ("t5_transformer_tiny", dict(t5_num_buckets=8, t5_max_distance=16)),
    "alibi": ("alibi_transformer_tiny", {}),
    "rope": ("rope_transformer_tiny", {}),
    "kerple": ("kerple_transformer_tiny", {}),
    "fire": ("fire_transformer_tiny", {}),
    "randomized": ("randomized_transformer_tiny", {}),
}


def make(family, seed=0):
    arch, kw = FAMILIES[family]
    model, args = build_with_args(arch, seed=seed, **kw)
    if family == "floater":
        randomize_flows(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # the tables drawn at random, not left as initialised (padding rows too: only rows read)
        for name, p in model.named_parameters():
            # T5: β redrawn; FLOATER's flows (randomize_flows) are not tables
            if "embed_positions" in name or "relative_" in name or ("position_scheme" in name and family != "floater"):
                p.normal_(generator=g)
    return model.eval(), args


def save(model, args, path):
    """A fairseq checkpoint as fairseq-train writes one (cfg.model is the arch's Namespace), without training."""
    config = args if isinstance(args, dict) else argparse.Namespace(**vars(args))
    state = {"args": None, "cfg": {"model": config}, "model": model.state_dict(),
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                    "lr_scheduler_state": {}, "num_updates": 0}],
             "extra_state": {"train_iterator": {"epoch": 1}}}
    checkpoint_utils.torch_persistent_save(state, str(path))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("positions")
    built = {family: make(family) for family in FAMILIES}
    models = {family: model for family, (model, _) in built.items()}
    return models, {family: save(model, args, root / f"{family}.pt") for family, (model, args) in built.items()}


def naive_cosine(x):
    x = x.double()
    return torch.tensor([[float(F.cosine_similarity(a, b, dim=0)) for b in x] for a in x], dtype=torch.float64)


def test_floater_biases_are_b0_plus_the_flows_own_solve(checkpoints):
    models, paths = checkpoints
    loaded = pa.load_model(str(paths["floater"]))
    flows = pa.floater_biases(loaded, N)
    original = models["floater"]
    parts = {"encoder": (original.encoder.position_scheme.flow, original.encoder.position_scheme.projections),
             "decoder": (original.decoder.position_scheme.flow, original.decoder.position_scheme.projections),
             "cross": (original.decoder.position_scheme.cross_flow, original.decoder.position_scheme.cross_projections)}
    assert [f["flow"] for f in flows] == ["encoder", "decoder", "cross"]
    for flow in flows:
        module, projections = parts[flow["flow"]]
        b0 = torch.stack([p.bias for p in projections]).detach()
        with torch.no_grad():
            direct = b0 + module(b0, N)  # FloaterFlow alone: Δb (N, k, d)
        assert flow["biases"].shape == direct.shape == (N, len(projections), b0.size(-1))
        torch.testing.assert_close(flow["biases"], direct.double(), rtol=1e-5, atol=1e-6)
        assert float((flow["biases"][-1] - flow["biases"][0]).abs().max()) > 1e-2  # the biases do move
    assert flows[0]["labels"] == [(0, "q"), (0, "k"), (0, "v"), (1, "q"), (1, "k"), (1, "v")]
    assert flows[1]["labels"][:4] == [(0, "q"), (0, "k"), (0, "v"), (0, "cross-q")]
    assert flows[2]["labels"][:2] == [(0, "cross-k"), (0, "cross-v")]

    per_projection, pooled = pa.floater_similarities(flows[1])
    for j in (0, 3):
        torch.testing.assert_close(per_projection[j], naive_cosine(flows[1]["biases"][:, j]))
    torch.testing.assert_close(pooled[1], per_projection[4:8].mean(0))


def test_sinusoid_is_fairseqs_and_its_similarity_symmetric_with_unit_diagonal(checkpoints):
    models, paths = checkpoints
    model = pa.load_model(str(paths["sinusoidal"]))
    dim = model.encoder.embed_positions.embedding_dim
    rows = pa.sinusoid(N, dim, module=model.encoder.embed_positions)
    table = SinusoidalPositionalEmbedding.get_embedding(N + PAD + 1, dim, PAD)
    torch.testing.assert_close(rows, table[PAD + 1:])  # position i is fairseq's row padding_idx + 1 + i
    torch.testing.assert_close(pa.sinusoid(N, dim), rows)  # the reference beside FLOATER: the same rows
    sim = pa.cosine_similarity(rows)
    torch.testing.assert_close(sim, sim.T)
    torch.testing.assert_close(sim.diagonal(), torch.ones(N, dtype=torch.float64))
    torch.testing.assert_close(sim, naive_cosine(rows))
    torch.testing.assert_close(sim[5, 9], sim[20, 24])  # a function of i − j only


def test_randomized_positions_are_drawn_where_evaluation_puts_them(checkpoints, tmp_path):
    """The sinusoid at the spread rule's positions of an N-token sentence, p_r = round((r + 1)(L + 1)/(N + 1)) − 1,
    in both stacks (the decoder's n̂ = round(ρ·S) from a source as long, ρ = 1), not a crash on the decoder."""
    _, paths = checkpoints
    model = pa.load_model(str(paths["randomized"]))
    for part in ("encoder", "decoder"):
        module = getattr(model, part).embed_positions
        top = module.max_position
        positions = [round((r + 1) * (top + 1) / (N + 1)) - 1 for r in range(N)]
        table = SinusoidalPositionalEmbedding.get_embedding(top + PAD + 1, module.embedding_dim, PAD)
        rows = pa.sinusoid(N, module.embedding_dim, module=module)
        torch.testing.assert_close(rows, table[[PAD + 1 + p for p in positions]])
        assert module.source_lengths is None  # left as the decoder expects it
    with torch.no_grad():
        written = pf.figures(model, "randomized", N, (12, 14), str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in written] == ["randomized_sinusoidal.png"]
    headline = pf.headline(model, N)
    assert headline["kind"] == "randomized" and "randomized" in headline["title"]  # not "sinusoidal" in compare.png


@pytest.mark.parametrize("family", ["learned", "every_layer_learned"])
def test_learned_table_similarity_is_the_tables_rows(checkpoints, family):
    models, paths = checkpoints
    model = pa.load_model(str(paths[family]))
    for part in ("encoder", "decoder"):
        module = getattr(model, part).embed_positions
        rows = pa.learned_rows(module, N)
        assert rows.shape[0] == 24  # the table's length, not N
        torch.testing.assert_close(rows, getattr(models[family], part).embed_positions.weight[PAD + 1:].detach())
        torch.testing.assert_close(pa.cosine_similarity(rows), naive_cosine(rows))
    assert pa.scheme(model) == "learned"


@pytest.mark.parametrize("family, heads", [("relative", 2), ("relative_shared", 1)])
def test_relative_norms_are_the_norms_of_the_tables_rows(checkpoints, family, heads):
    models, paths = checkpoints
    model = pa.load_model(str(paths[family]))
    tables = pa.relative_tables(model)
    layers = len(model.encoder.layers) + len(model.decoder.layers)
    assert len(tables) == 2 * layers and {t["table"] for t in tables} == {"a^K", "a^V"}
    original = dict(models[family].named_parameters())
    k = model.args.max_relative_positions
    for t in tables:
        side, _, layer = t["name"].split()
        name = f"{side}.layers.{int(layer) - 1}.self_attn.relative_{'keys' if t['table'] == 'a^K' else 'values'}"
        table = original[name].detach().double().reshape(heads, 2 * k + 1, -1)
        norms = pa.relative_norms(t)
        assert norms.shape == (heads, 2 * k + 1)
        for h in range(heads):
            for m in range(2 * k + 1):
                assert float(norms[h, m]) == pytest.approx(float(torch.linalg.norm(table[h, m])), rel=1e-12)
        sim = pa.relative_similarity(t)
        torch.testing.assert_close(sim, torch.stack([naive_cosine(table[h]) for h in range(heads)]).mean(0))
        torch.testing.assert_close(sim.diagonal(), torch.ones(2 * k + 1, dtype=torch.float64))


def test_t5_and_alibi_curves_are_their_biases_by_distance(checkpoints):
    """T5: β_h[bucket(j − i)] read from the original model's table; ALiBi: −m_h·|j − i| from the paper's slopes,
    2^(−8h/H); the encoder sees both directions, the decoder the past only."""
    from fairseq_plugins.modules.t5_bias import relative_bucket

    models, paths = checkpoints
    for family in ("t5", "alibi"):
        model = pa.load_model(str(paths[family]))
        entries = pa.attention_schemes(model)
        assert [(e["part"], e["kind"], e["causal"]) for e in entries] == [("encoder", family, False),
                                                                          ("decoder", family, True)]
        assert pa.scheme(model) == family
        for entry in entries:
            x, values = pa.score_bias_by_distance(entry, N)
            assert x == (list(range(-(N - 1), 1)) if entry["causal"] else list(range(-(N - 1), N)))
            original = getattr(models[family], entry["part"]).position_scheme
            heads = values.size(0)
            for h in range(heads):
                for d in (-(N - 1), -7, -1, 0, 1, 5, N - 1):
                    if d not in x:
                        continue
                    if family == "t5":
                        bucket = int(relative_bucket(torch.tensor(d), not entry["causal"], 8, 16))
                        want = float(original.bias.weight[bucket, h].detach())
                    else:
                        want = -(2 ** (-8 * (h + 1) / heads)) * abs(d)
                    assert float(values[h, x.index(d)]) == pytest.approx(want, rel=1e-6, abs=1e-7), (family, h, d)
            if family == "t5":  # the learned table, not zeros: the curve moves
                assert float(values.std()) > 0.1


def rotate(x, position, base=10000.0):
    """RoFormer's R_m x from its equation: each pair (x_2i, x_2i+1) rotated by m·θ_i, θ_i = base^(−2i/d)."""
    out = x.clone()
    d = x.size(-1)
    for i in range(d // 2):
        angle = position * base ** (-2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        out[..., 2 * i] = x[..., 2 * i] * c - x[..., 2 * i + 1] * s
        out[..., 2 * i + 1] = x[..., 2 * i] * s + x[..., 2 * i + 1] * c
    return out


def test_rope_curve_is_the_vocabulary_mean_of_one_words_rotated_logit(checkpoints):
    """mean_w (R_i q(w))·(R_j k(w))/√d_z for the first encoder layer, q and k projected from the word's scaled
    embedding, at i = 3 and j = 3 + d: depends on d only and equals the tool's curve."""
    models, paths = checkpoints
    model = pa.load_model(str(paths["rope"]))
    entry = pa.attention_schemes(model)[0]
    x, values = pa.rope_logits_by_distance(model, entry, N, chunk=7)  # chunks that do not divide the vocabulary
    original = models["rope"].encoder
    attn = original.layers[0].self_attn
    heads, dz = attn.num_heads, attn.head_dim
    with torch.no_grad():
        words = original.embed_tokens.weight.double() * original.embed_scale
        q = torch.nn.functional.linear(words, attn.q_proj.weight.double(), attn.q_proj.bias.double())
        k = torch.nn.functional.linear(words, attn.k_proj.weight.double(), attn.k_proj.bias.double())
        for d in (-5, 0, 2, N - 1):
            for h in range(heads):
                qh, kh = q[:, h * dz:(h + 1) * dz], k[:, h * dz:(h + 1) * dz]
                naive = (rotate(qh, 3) * rotate(kh, 3 + d)).sum(-1).mean() / math.sqrt(dz)
                assert float(values[h, x.index(d)]) == pytest.approx(float(naive), rel=1e-4, abs=1e-5), (h, d)
    shift, alone = pa.rope_rotation_only(entry, N)
    assert float(alone[shift.index(0)]) == pytest.approx(1.0) and float(alone[shift.index(N - 1)]) < 0.9


@pytest.mark.slow  # the script as a process, every figure
def test_one_command_writes_every_figure_as_png(checkpoints, tmp_path):
    _, paths = checkpoints
    families = ["floater", "sinusoidal", "learned", "relative", "t5", "rope"]
    out = tmp_path / "figures"
    proc = subprocess.run([sys.executable, "scripts/plot_positions.py", *(str(paths[f]) for f in families),
                           "--out", str(out), "--positions", str(N), "--train-max-len", "12,14"]
                          + [a for f in families for a in ("--label", f)],
                          cwd=REPO, env={**env(), "OMP_NUM_THREADS": "1"}, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = {"floater_floater.png", "floater_floater_projections.png", "floater_floater_norms.png",
                "sinusoidal_sinusoidal.png", "learned_learned.png", "relative_relative.png",
                "relative_relative_similarity.png", "t5_t5.png", "rope_rope.png", "compare.png"}
    assert {p.name for p in out.iterdir()} == expected  # and no temporary file left behind
    assert sorted(proc.stdout.split()) == sorted(str(out / name) for name in expected)
    from PIL import Image

    for name in expected:
        path = out / name
        assert path.read_bytes()[:8] == PNG and path.stat().st_mode & 0o777 == 0o644
        with Image.open(path) as image:
            image.verify()
            assert image.size[0] > 300 and image.size[1] > 200


def test_compare_titles_each_panel_and_shares_an_axis_only_within_one_quantity(checkpoints, tmp_path, monkeypatch):
    """compare.png: every panel titled with its checkpoint's budget or with what it shows; the panels of one
    quantity on one y range (the angle between neighbouring positions from 0 degrees; T5's and ALiBi's logit
    bias), the others on their own; one colour bar beside each heatmap, none beside a curve."""
    _, paths = checkpoints
    families = ["floater", "sinusoidal", "learned", "relative", "t5", "alibi", "rope"]
    models = [pa.load_model(str(paths[f])) for f in families]
    figures = []
    monkeypatch.setattr(pf, "save_figure", lambda fig, path, dpi=100: figures.append(fig) or path)
    with torch.no_grad():  # as main draws
        pf.compare_figure(models, families, N, (12, 14), str(tmp_path))
    fig, = figures
    panels = [ax for ax in fig.axes if ax.get_title()]
    bars = [ax for ax in fig.axes if ax.get_ylabel() == "cosine similarity"]
    assert len(panels) == 2 * len(families) and len(bars) == 4  # four heatmaps: FLOATER, sinusoid, learned, Shaw
    tops = [ax for ax in panels if ax.get_title().split("\n")[0].endswith(", untrained")]
    assert len(tops) == len(families), [ax.get_title() for ax in panels]
    for bar in bars:  # beside a heatmap: just right of one, at its height
        beside = [ax for ax in tops if ax.images and abs(ax.get_position().x1 - bar.get_position().x0) < 0.05]
        assert len(beside) == 1
    by_quantity = {}
    for ax in panels:
        by_quantity.setdefault(ax.get_ylabel(), []).append(ax.get_ylim())
    angles = by_quantity[pf.NEIGHBOURS]
    assert len(angles) == 3 and len(set(angles)) == 1 and angles[0][0] == 0
    assert len(set(by_quantity["logit bias"])) == 1 and len(by_quantity["logit bias"]) == 4
    norms = by_quantity["L2 norm (mean over heads, layers)"]
    assert len(norms) == 1 and norms[0] != angles[0]


def test_a_constant_angle_is_drawn_inside_its_panel_not_on_its_frame(checkpoints, tmp_path, monkeypatch):
    """A sinusoid alone in compare.png: its neighbour angle is the same at every position, and autoscaling put the
    top of the axis on that line, hidden by the frame."""
    _, paths = checkpoints
    figures = []
    monkeypatch.setattr(pf, "save_figure", lambda fig, path, dpi=100: figures.append(fig) or path)
    with torch.no_grad():
        pf.compare_figure([pa.load_model(str(paths["sinusoidal"]))], ["sinusoidal"], N, None, str(tmp_path))
    angle, = [ax for ax in figures[0].axes if ax.get_ylabel() == pf.NEIGHBOURS]
    line, = angle.get_lines()
    low, high = angle.get_ylim()
    assert low == 0 and max(line.get_ydata()) < 0.95 * high


def test_attention_figures_share_the_stacks_axis_and_name_the_budget(checkpoints, tmp_path, monkeypatch):
    _, paths = checkpoints
    figures = []
    monkeypatch.setattr(pf, "save_figure", lambda fig, path, dpi=100: figures.append(fig) or path)
    with torch.no_grad():
        for family in ("rope", "relative"):
            pf.figures(pa.load_model(str(paths[family])), f"{family}.seed1", N, None, str(tmp_path))
    rope, relative = figures[0], figures[1]
    assert rope._suptitle.get_text().startswith("rope.seed1 (untrained): RoPE")
    encoder, decoder, rotation = rope.axes
    assert encoder.get_ylim() == decoder.get_ylim() != rotation.get_ylim()
    assert relative._suptitle.get_text().startswith("relative.seed1 (untrained): relative position vectors")
    assert len({ax.get_ylim() for ax in relative.axes}) == 1 and len(relative.axes) == 8


def test_neighbour_angle_is_the_angle_between_neighbouring_rows():
    x = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, -1.0]])
    assert pa.neighbour_angle(x).tolist() == pytest.approx([45.0, 45.0, 180.0])


def test_a_missing_checkpoint_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "figures"
    proc = subprocess.run([sys.executable, "scripts/plot_positions.py", str(tmp_path / "missing.pt"),
                           "--out", str(out)], cwd=REPO, env={**env(), "OMP_NUM_THREADS": "1"}, text=True,
                          capture_output=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0] == f"plot_positions.py: checkpoint {tmp_path / 'missing.pt'}: no such file " \
                       "(expected a fairseq checkpoint, .pt)"
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["{text}"], "checkpoint {text}: not a readable fairseq checkpoint"),
    (["{ckpt}", "--positions", "1"], "error: argument --positions: expected an integer from 2 to 4096, got '1'"),
    (["{ckpt}", "--train-max-len", "a,b"], "error: argument --train-max-len: expected SRC or SRC,TGT"),
    (["{ckpt}", "--label", "a", "--label", "b"], "--label: given 2 time(s) for 1 checkpoint(s)"),
    (["{ckpt}", "--label", "a/b"], "--label 'a/b': expected letters, digits"),
    (["{ckpt}", "--out", "{text}"], "--out {text}: exists and is not a folder"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(checkpoints, tmp_path, capsys, args, message):
    _, paths = checkpoints
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    fill = dict(text=text, ckpt=paths["sinusoidal"])
    argv = [a.format(**fill) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "figures")]
    with pytest.raises(SystemExit) as stop:
        pp.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"plot_positions.py: {message.format(**fill)}"), err
    assert not (tmp_path / "figures").exists()


def test_floater_biases_that_overflow_are_one_line_before_any_figure(tmp_path, capsys):
    model, args = make("floater")
    with torch.no_grad():
        model.encoder.position_scheme.flow.dynamics.fc2.bias.fill_(1e38)  # Δb leaves float32 within a few positions
    path = save(model, args, tmp_path / "overflow.pt")
    with pytest.raises(SystemExit) as stop:
        pp.main([str(path), "--out", str(tmp_path / "figures"), "--positions", "64"])
    assert torch.is_grad_enabled()  # main leaves the process's autograd mode as it found it
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"plot_positions.py: --positions 64: the FLOATER biases of {path} overflow"), err
    assert not (tmp_path / "figures").exists()


def test_a_hydra_checkpoint_loads_too(checkpoints, tmp_path):
    """fairseq-hydra-train saves cfg.model as a config (a dict here) named by ``_name``."""
    models, _ = checkpoints
    model, args = make("relative_shared")
    fields = {k: v for k, v in vars(args).items() if k != "arch"}
    path = save(model, {"_name": args.arch, **fields}, tmp_path / "hydra.pt")
    loaded = pa.load_model(str(path))
    assert pa.scheme(loaded) == "relative" and loaded.checkpoint_arch == "relative_transformer_tiny"
    for a, b in zip(pa.relative_tables(loaded), pa.relative_tables(model)):
        torch.testing.assert_close(a["values"], b["values"])


def test_a_checkpoint_of_another_model_is_refused(tmp_path, capsys):
    lstm, args = build_with_args("lstm", encoder_embed_dim=8, decoder_embed_dim=8, encoder_hidden_size=8,
                                 decoder_hidden_size=8, decoder_out_embed_dim=8, encoder_layers=1, decoder_layers=1,
                                 criterion="cross_entropy")
    path = save(lstm, args, tmp_path / "lstm.pt")
    with pytest.raises(SystemExit) as stop:
        pp.main([str(path), "--out", str(tmp_path / "figures")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "architecture 'lstm' is not one of this project's Transformer models" in err


def test_compare_marks_the_training_length_on_every_panel_with_positions_or_distances(checkpoints, tmp_path,
                                                                                      monkeypatch):
    """--train-max-len in compare.png: a position axis marked between the last trained position and the next, a
    distance axis (T5, ALiBi, RoPE) at ± the longest training sentence's length − 1, in both rows; Shaw's clipped
    distances carry no mark."""
    _, paths = checkpoints
    families = ["sinusoidal", "relative", "t5", "rope"]
    models = [pa.load_model(str(paths[f])) for f in families]
    figures = []
    monkeypatch.setattr(pf, "save_figure", lambda fig, path, dpi=100: figures.append(fig) or path)
    with torch.no_grad():
        pf.compare_figure(models, families, N, (12, 14), str(tmp_path))
    fig, = figures
    columns = sorted((ax for ax in fig.axes if ax.get_title()), key=lambda ax: ax.get_position().x0)

    def marks(ax):  # the vertical lines: two x values, one and the same
        return sorted(line.get_xdata()[0] for line in ax.lines if len(set(line.get_xdata())) == 1
                      and len(line.get_xdata()) == 2)

    for c, family in enumerate(families):
        top, bottom = sorted(columns[2 * c:2 * c + 2], key=lambda ax: -ax.get_position().y0)
        expected = {"sinusoidal": [11.5], "relative": [], "t5": [-11, 11], "rope": [-11, 11]}[family]
        assert marks(bottom) == expected, family
        if family in ("t5", "rope"):
            assert marks(top) == expected, family
    assert "on distance axes: ± its length − 1" in fig._suptitle.get_text()


def test_kerple_and_fire_curves_are_their_equations_at_the_named_query(checkpoints, tmp_path, monkeypatch):
    """KERPLE log: −r1_h·log(1 + r2_h·|j − i|); FIRE: f_θ(ψ(|i − j|) / ψ(max(L, far))), ψ(x) = log(|c|·x + 1),
    far = i in the decoder and max(i, j) in the encoder, at the query the tool draws, i = N − 1, which FIRE's title
    names (its bias is not a function of j − i alone)."""
    models, paths = checkpoints
    for family in ("kerple", "fire"):
        model = pa.load_model(str(paths[family]))
        entries = pa.attention_schemes(model)
        assert [(e["part"], e["kind"]) for e in entries] == [("encoder", family), ("decoder", family)]
        for entry in entries:
            x, values = pa.score_bias_by_distance(entry, N)
            m = getattr(models[family], entry["part"]).position_scheme
            i = N - 1
            for d in (-(N - 1), -7, -1, 0, 3, N - 1):
                if d not in x:
                    continue
                j = i + d
                if family == "kerple":
                    want = [-float(m.r1()[h]) * math.log(1 + float(m.r2()[h]) * abs(d)) for h in range(values.size(0))]
                else:
                    c, L = abs(float(m.c)), abs(float(m.threshold_scale)) * m.initial_threshold
                    far = i if entry["causal"] else max(i, j)
                    z = math.log(c * abs(d) + 1) / (math.log(c * max(L, far) + 1) + 1e-6)
                    w1, b1 = m.mlp[0].weight.double()[:, 0], m.mlp[0].bias.double()
                    hidden = torch.relu(w1 * z + b1)
                    want = (m.mlp[2].weight.double() @ hidden + m.mlp[2].bias.double()).tolist()
                got = values[:, x.index(d)].tolist()
                assert got == pytest.approx(want, rel=1e-5, abs=1e-6), (family, entry["part"], d)
    figures = []
    monkeypatch.setattr(pf, "save_figure", lambda fig, path, dpi=100: figures.append(fig) or path)
    with torch.no_grad():
        pf.figures(pa.load_model(str(paths["fire"])), "fire.seed1", N, None, str(tmp_path))
    assert figures[0]._suptitle.get_text().endswith(f"query i = {N - 1}")


class _ThrowawayBias(ScoreBias):
    """A score bias no figure code knows of: −w_h·(j − i)² (one weight per head)."""
    title, equation = "Throwaway (Nobody et al.)", "−w_h·(j − i)²"

    def __init__(self, heads):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(1.0, heads + 1))

    def score_bias(self, q_pos, k_pos, dtype=torch.float32):
        distance = (k_pos[None, :] - q_pos[:, None]).to(dtype)
        return -self.weight.to(dtype)[:, None, None] * distance.pow(2)


def test_a_score_bias_row_added_to_the_table_is_plotted_with_its_title(checkpoints, tmp_path, monkeypatch):
    """A row of kind ``score bias`` added to the table (here for this test alone) is extracted through its own
    ``score_bias``, drawn and titled with its class's ``title`` and ``equation``, with no edit of the tool."""
    from fairseq_plugins import schemes

    monkeypatch.setitem(schemes.SCHEMES, "throwaway", schemes.Scheme(
        "throwaway", "throwaway", "score bias", "Nobody et al. (a test's row)", schemes.POSITION_TRANSFORMER,
        "throwaway_transformer", cls=_ThrowawayBias))
    models, _ = checkpoints
    model, _ = make("alibi")
    heads = model.encoder.layers[0].self_attn.num_heads
    for part in (model.encoder, model.decoder):
        part.position_scheme = _ThrowawayBias(heads)
    entries = pa.attention_schemes(model)
    assert [(e["part"], e["kind"]) for e in entries] == [("encoder", "throwaway"), ("decoder", "throwaway")]
    assert pa.scheme(model) == "throwaway"
    x, values = pa.score_bias_by_distance(entries[0], N)
    assert values[1, x.index(-3)].item() == -2 * 9.0 and values[0, x.index(N - 1)].item() == -((N - 1) ** 2)
    figures = []
    monkeypatch.setattr(pf, "save_figure", lambda fig, path, dpi=100: figures.append(fig) or path)
    model.checkpoint_updates = 0
    with torch.no_grad():
        paths = pf.figures(model, "throwaway.seed1", N, None, str(tmp_path))
        paths += pf.compare_figure([model, models["alibi"]], ["throwaway.seed1", "alibi"], N, None, str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["throwaway.seed1_throwaway.png", "compare.png"]
    title = "throwaway.seed1 (untrained): Throwaway (Nobody et al.), −w_h·(j − i)²"
    assert figures[0]._suptitle.get_text() == title
    top = [ax.get_title() for ax in figures[1].axes if ax.get_title().startswith("throwaway.seed1")]
    assert top and "(throwaway)" in top[0] and "−w_h·(j − i)²" in top[0], top
