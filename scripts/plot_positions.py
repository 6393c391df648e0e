#!/usr/bin/env python3
"""Pictures of what each position scheme of a checkpoint learned.

    python scripts/plot_positions.py CHECKPOINT [CHECKPOINT ...] --out DIR [--label NAME ...]
        [--positions 128] [--train-max-len SRC[,TGT]] [--compare]

Takes any fairseq checkpoint of this project's models (fairseq's ``transformer`` with sinusoidal or learned
positions, ``relative_transformer``, ``floater_transformer``, and ``position_transformer``'s schemes:
``transformer_every_layer_pos``, T5, ALiBi, RoPE, SHAPE, NoPE, ...; any of their architectures) and writes PNG
figures to DIR, named after the checkpoint's label (``--label``, one per checkpoint; default: the checkpoint's folder
and file name). The model is built from the checkpoint alone: the vocabulary
sizes come from its embedding tables, so no data directory is needed (the positions do not depend on the words).

What is drawn (positions are fairseq's: position i is the (i+1)-th token of a sentence, padding does not count):

- FLOATER (``LABEL_floater.png``, ``LABEL_floater_projections.png``, ``LABEL_floater_norms.png``): the biases the
  attention projections actually add at position i, b(t_i) = b(0) + Δb(t_i), computed by the model's own
  ``FloaterPositions`` (one solve of its three flows, as in evaluation), and their position–position cosine
  similarity cos(b(t_i), b(t_j)) for i, j < --positions. Per projection (``_projections``: one heatmap per block and
  projection: encoder q/k/v (source positions), decoder self-attention q/k/v and cross-attention q (target
  positions), cross-attention k/v (source positions)), and pooled per block (``_floater``: the mean of that block's
  per-projection similarities, one row per flow). Pooled by the mean of cosines, not the cosine of the concatenated
  biases: the projections' Δb grow at very different rates (in a trained model one projection's can be thousands of
  times larger than the others' at position 100), and a concatenation would show only that one. Beside them, the
  same similarity for fairseq's sinusoidal embedding of the same dimension (the model's own, which FLOATER keeps at
  the input), so one sees how each continues past the training lengths. Cosines see directions only: ``_norms``
  draws ||b(t_i)|| by position, one line per projection (log scale).
- Learned absolute positions (``LABEL_learned.png``): the cosine similarity of the rows of the learned table(s)
  (positions past the table's length do not exist and are left out), beside the sinusoid of the same dimension.
- Shaw et al.'s relative positions (``LABEL_relative.png``): the L2 norm of each vector of the a^K and a^V
  tables by clipped distance j − i = −k..k, one panel per layer and table, one line per head when the tables are
  per head; and (``LABEL_relative_similarity.png``) the cosine similarity between the vectors of two distances,
  averaged over heads. With --relative-add-absolute-positions the absolute embedding gets its figure too.
- Schemes inside self-attention (``LABEL_t5.png``, ``LABEL_alibi.png``, ``LABEL_kerple.png``, ``LABEL_fire.png``,
  ``LABEL_rope.png``): the term each adds to the logit of query i and key j, by distance j − i, one line per head,
  one panel per stack (the decoder's: the past only): T5's learned bias β_h[bucket(j − i)], ALiBi's
  −m_h·|j − i|, KERPLE's −r1_h·log(1 + r2_h·|j − i|) and FIRE's f_θ (the modules' own ``score_bias``; FIRE's
  depends on the query's position too, drawn at i = --positions − 1);
  for RoPE, which adds no term but rotates q and k, the first layer's logit between a word's query and the same
  word's key at distance j − i, averaged over the vocabulary (its input is the word's scaled embedding alone),
  and beside it the rotation alone, the mean over frequencies of cos((j − i)·θ_p). SHAPE (a shifted sinusoid,
  drawn as the sinusoid it is at evaluation) and NoPE's encoder (sinusoidal) get the sinusoid's figure; randomized
  positions get the sinusoid at the positions their evaluation gives a sentence of --positions tokens (the spread
  rule: about L/N apart; a decoder's as after a source as long).
- Sinusoidal positions (``LABEL_sinusoidal.png``): the sinusoid's position–position cosine similarity (a
  function of i − j only).

--train-max-len SRC[,TGT] marks the longest training sequence (in tokens, end of sentence included; source and
target; one number for both) with dashed lines: source-indexed panels get SRC, target-indexed ones TGT. The
checkpoint does not record it (--max-source-positions is the model's limit, not the data's).

--compare (implied by several checkpoints) also writes ``compare.png``: one column per checkpoint, its scheme's
headline picture on top, encoder side (FLOATER: the similarity of the biases averaged over every encoder block's
q, k, v; the learned table's; the sinusoid's; relative positions: the similarity between the a^K vectors of two
distances, averaged over heads and encoder layers; T5, ALiBi, RoPE: the encoder's curves, one per head) and below
it a profile: for absolute schemes how far each position turns from the last, the angle between p_i and p_{i+1}
in degrees (FLOATER's averaged over the encoder's projections, and FLOATER's and the learned table's beside the
sinusoid's), for relative positions the norms of a^K and a^V by distance averaged over heads and encoder layers,
for the schemes inside attention the mean of their curves over heads. Every panel is titled; panels that show the
same quantity share one y range (the angles from 0), the others keep their own; each heatmap has its colour bar.

Every figure's title names the checkpoint by its label (e.g. rope.ep20.seed1: scheme, budget and seed as the user
names them) and the budget the checkpoint records (its updates; a fine-tune's: of the fine-tuning run). Panels of
one quantity share their y axis: the stacks of a scheme inside attention (RoPE's rotation alone, a cosine, keeps
its own), every layer and table of Shaw's norms.

Bad input (a missing or unreadable checkpoint, another kind of model, a bad flag, FLOATER biases that overflow
within --positions) stops with one line on stderr naming the file or flag, exit status 2, before anything is
written. Figures are written to a temporary name
beside their target and renamed.
"""
import argparse
import os
import re
import sys
import textwrap
from pathlib import Path

from tooling import atomic

PROG = "plot_positions.py"
MAX_POSITIONS = 4096  # heatmaps of more positions than this have more cells than pixels anyway


class BadInput(Exception):
    """One line for the user: the file or flag and what was expected."""


def fail(message):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(2)


# -- loading a checkpoint without its data ---------------------------------------------------------------------


def _register_plugins():
    from fairseq import utils

    utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))


class _BareTask:
    """What fairseq's Transformer builders read from a task: the two dictionaries (placeholder words)."""

    def __init__(self, src_size, tgt_size, shared):
        self.source_dictionary = _dictionary(src_size)
        self.target_dictionary = self.source_dictionary if shared else _dictionary(tgt_size)


def _dictionary(size):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"<word{i}>")
    return d


def load_model(path):
    """The model of a fairseq checkpoint of one of this project's Transformer models, in eval mode, float32,
    built from the checkpoint alone. Raises BadInput with one line naming the file."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    from fairseq.models.transformer import TransformerModel

    _register_plugins()
    if not os.path.isfile(path):
        raise BadInput(f"checkpoint {path}: no such file (expected a fairseq checkpoint, .pt)")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    except Exception as e:  # the patched loader's one-line messages, or torch's/pickle's
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(f"checkpoint {path}: not a readable fairseq checkpoint ({text})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise BadInput(f"checkpoint {path}: not a fairseq checkpoint (expected a dict with 'model' weights)")
    cfg = state.get("cfg")
    args = cfg.get("model") if cfg is not None else None
    if args is None:
        args = state.get("args")
    if args is None:
        raise BadInput(f"checkpoint {path}: no model configuration (expected cfg.model or args)")
    from fairseq_plugins.models._config import as_namespace

    args = argparse.Namespace(**vars(as_namespace(args)))
    arch = getattr(args, "_name", None) or getattr(args, "arch", None)  # as fairseq.models.build_model
    if arch not in ARCH_MODEL_REGISTRY or not issubclass(ARCH_MODEL_REGISTRY[arch], TransformerModel):
        raise BadInput(f"checkpoint {path}: architecture {arch!r} is not one of this project's Transformer models "
                       "(expected transformer*, transformer_every_layer_pos*, relative_transformer*, "
                       "floater_transformer* or a position scheme's *_transformer*)")
    weights = state["model"]
    try:
        src = weights["encoder.embed_tokens.weight"].size(0)
        tgt = weights["decoder.embed_tokens.weight"].size(0)
    except KeyError as e:
        raise BadInput(f"checkpoint {path}: no {e.args[0]} in its weights (expected an encoder-decoder "
                       "Transformer)") from None
    args.arch = arch
    ARCH_CONFIG_REGISTRY[arch](args)
    try:
        task = _BareTask(src, tgt, bool(getattr(args, "share_all_embeddings", False)))
        model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
        model.load_state_dict(weights, strict=True, model_cfg=args)
    except Exception as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(f"checkpoint {path}: its weights do not fit its architecture {arch} ({text[:200]})") from None
    model = model.float().eval()
    model.checkpoint_arch = arch
    history = state.get("optimizer_history") or [{}]
    model.checkpoint_updates = history[-1].get("num_updates") if isinstance(history[-1], dict) else None
    return model


def budget(model):
    """The training budget a checkpoint records, for the figures' titles: its updates (a fine-tune's: of the
    fine-tuning run)."""
    updates = getattr(model, "checkpoint_updates", None)
    if updates is None:
        return "updates not recorded"
    return "untrained" if updates == 0 else f"{updates:,} updates"


def _named(label, model):
    """What a figure's title says of its checkpoint: the label (scheme, budget and seed as the user names them,
    e.g. rope.ep20.seed1) and the budget the checkpoint records."""
    return f"{label} ({budget(model)})"


# -- what the schemes learned, as arrays ------------------------------------------------------------------------


def cosine_similarity(x):
    """(N, d) -> (N, N): cos(x_i, x_j), in float64 (a zero row has similarity 0 with everything)."""
    import torch

    x = x.double()
    unit = x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return unit @ unit.T


def sinusoid(num_positions, dim, padding_idx=1, module=None):
    """fairseq's sinusoidal embedding (the model's own module when given) of positions 0..num_positions−1."""
    import torch
    from fairseq.modules import SinusoidalPositionalEmbedding

    if module is None:
        module = SinusoidalPositionalEmbedding(dim, padding_idx, init_size=num_positions + padding_idx + 1)
    from fairseq_plugins.models.position_transformer import source_lengths

    tokens = torch.full((1, num_positions), module.padding_idx + 1, dtype=torch.long)  # any non-padding token
    # randomized positions' decoder estimates its length from its source's, as the decoder's forward gives it: here
    # a source as long as the target
    source = {"src_lengths": [torch.tensor([num_positions])]}
    with torch.no_grad(), source_lengths(module, source):
        return module(tokens)[0].float()


def learned_rows(module, num_positions):
    """Rows of a LearnedPositionalEmbedding for positions 0..min(num_positions, its length)−1."""
    first = module.padding_idx + 1 if module.padding_idx is not None else 0
    rows = min(num_positions, module.num_embeddings - first)
    return module.weight.detach()[first:first + rows].float()


def _module_names(model):
    return {id(m): name for name, m in model.named_modules()}


def _projection_label(name):
    """'decoder.layers.2.encoder_attn.k_proj' -> (2, 'cross-k'); 'encoder.layers.0.self_attn.q_proj' -> (0, 'q')."""
    m = re.search(r"layers\.(\d+)\.(self_attn|encoder_attn)\.([qkv])_proj$", name)
    if not m:
        return None, name
    return int(m.group(1)), ("cross-" if m.group(2) == "encoder_attn" else "") + m.group(3)


# (flow, stack, the stack's FLOATER module's flow and its projections, title)
FLOWS = (("encoder", "encoder", "flow", "projections", "encoder self-attention (source positions)"),
         ("decoder", "decoder", "flow", "projections",
          "decoder self-attention and cross-attention q (target positions)"),
         ("cross", "decoder", "cross_flow", "cross_projections", "decoder cross-attention k, v (source positions)"))


def is_floater(model):
    from fairseq_plugins.modules.floater import Floater

    return any(isinstance(getattr(getattr(model, part, None), "position_scheme", None), Floater)
               for part in ("encoder", "decoder"))


def floater_biases(model, num_positions):
    """The biases b(t_i) = b(0) + Δb(t_i) of every FLOATER flow of the model for positions 0..num_positions−1,
    with Δb from the model's own FloaterPositions (one solve of all flows, cached as in evaluation).

    Returns a list of dicts: ``flow`` (encoder/decoder/cross), ``side`` (source/target), ``title``, ``biases``
    (num_positions, k, d) float64, ``labels`` [(block index, projection)] for the k rows."""
    import torch

    names = _module_names(model)
    out = []
    with torch.no_grad():
        for flow_name, part, flow_attr, proj_attr, title in FLOWS:
            module = getattr(model, part).position_scheme
            flow = getattr(module, flow_attr, None)
            if flow is None:
                continue
            positions = module.positions  # the model's: the stacks share it
            projections = getattr(module, proj_attr)
            delta = positions.biases(flow, num_positions)
            b0 = torch.stack([p.bias for p in projections]).to(delta.dtype)
            out.append(dict(flow=flow_name, side="target" if flow_name == "decoder" else "source", title=title,
                            biases=(b0 + delta).double(),
                            labels=[_projection_label(names[id(p)]) for p in projections]))
    return out


def floater_similarities(flow):
    """Per projection (k, N, N) and pooled per block {block: (N, N), the mean over its projections}."""
    import torch

    b = flow["biases"]
    per_projection = torch.stack([cosine_similarity(b[:, j]) for j in range(b.size(1))])
    blocks = {}
    for j, (block, _) in enumerate(flow["labels"]):
        blocks.setdefault(block, []).append(j)
    pooled = {block: per_projection[rows].mean(0) for block, rows in blocks.items()}
    return per_projection, pooled


def relative_tables(model):
    """Shaw et al.'s tables of every relative self-attention: dicts with ``name`` (e.g. 'encoder layer 1'),
    ``table`` ('a^K' or 'a^V'), ``values`` (H, 2k+1, d_z) (H = 1 when shared by the heads), ``per_head``, ``k``."""
    from fairseq_plugins.modules.relative_attention import ShawRelative

    out = []
    for name, module in model.named_modules():
        shaw = getattr(module, "scheme", None)  # a PositionalSelfAttention of a Shaw stack
        if not isinstance(shaw, ShawRelative):
            continue
        m = re.search(r"(encoder|decoder)\.layers\.(\d+)\.", name)
        where = f"{m.group(1)} layer {int(m.group(2)) + 1}" if m else name
        for table, param in (("a^K", module.relative_keys), ("a^V", module.relative_values)):
            if param is None:
                continue
            values = param.detach().double()
            out.append(dict(name=where, table=table, values=values if shaw.per_head else values.unsqueeze(0),
                            per_head=shaw.per_head, k=shaw.max_relative_positions))
    return out


def relative_norms(entry):
    """(H, 2k+1): the L2 norm of each table vector; column m is distance m − k."""
    import torch

    return torch.linalg.norm(entry["values"], dim=-1)


def relative_similarity(entry):
    """(2k+1, 2k+1): cosine similarity between the vectors of two distances, averaged over heads."""
    import torch

    return torch.stack([cosine_similarity(head) for head in entry["values"]]).mean(0)


# position_transformer's stack modules
ATTENTION_SCHEMES = {"T5Bias": "t5", "ALiBi": "alibi", "KerpleLog": "kerple", "FIRE": "fire", "RoPE": "rope"}


def attention_schemes(model):
    """The stacks' position schemes that work inside self-attention (position_transformer: T5's bias, ALiBi,
    RoPE): dicts with ``part`` (encoder/decoder), ``kind`` (t5/alibi/rope), ``module``, ``causal``."""
    out = []
    for part in ("encoder", "decoder"):
        module = getattr(getattr(model, part), "position_scheme", None)
        if module is not None and type(module).__name__ in ATTENTION_SCHEMES:
            out.append(dict(part=part, kind=ATTENTION_SCHEMES[type(module).__name__], module=module,
                            causal=part == "decoder"))
    return out


def _distances(causal, num_positions):
    """Query position i = N−1 and key positions j: j − i = −(N−1)..N−1 (the decoder: −(N−1)..0, the past)."""
    import torch

    return num_positions - 1, torch.arange(0, num_positions if causal else 2 * num_positions - 1)


def score_bias_by_distance(entry, num_positions):
    """(distances j − i, (H, len) bias): what the scheme adds to the logit of query i and key j (T5's learned
    β_h[bucket(j − i)], ALiBi's −m_h·|j − i|), from the module's own ``score_bias``."""
    import torch

    query, keys = _distances(entry["causal"], num_positions)
    bias = entry["module"].score_bias(torch.tensor([query]), keys, torch.float64)  # (H, 1, S)
    return (keys - query).tolist(), bias[:, 0, :].detach().double()


def rope_logits_by_distance(model, entry, num_positions, chunk=512):
    """(distances j − i, (H, len)): the first self-attention layer's logit between a word's query at position i and
    the same word's key at position j, averaged over the vocabulary, mean_w (R_i q_h(w))·(R_j k_h(w))·d_z^−½ (a
    function of j − i only), with q, k the layer's projections of the word's scaled embedding, which is that
    layer's input (RoPE adds nothing to the embeddings). Rotated by the model's own RoPE.rotated."""
    import torch

    stack = getattr(model, entry["part"])
    layer, rope = stack.layers[0], entry["module"]
    attn = layer.self_attn
    query, keys = _distances(entry["causal"], num_positions)
    shift = keys - query
    words = stack.embed_tokens.weight.detach().float() * stack.embed_scale
    if getattr(stack, "layernorm_embedding", None) is not None:
        words = stack.layernorm_embedding(words)
    if layer.normalize_before:
        words = layer.self_attn_layer_norm(words)
    heads, head_dim = attn.num_heads, attn.head_dim
    total = torch.zeros(heads, shift.numel(), dtype=torch.float64)
    for x in words.split(chunk):
        q = (attn.q_proj(x) * attn.scaling).view(-1, heads, 1, head_dim)  # (w, H, 1, d_z), at position 0
        k = attn.k_proj(x).view(-1, heads, 1, head_dim).expand(-1, -1, shift.numel(), -1)
        total += (q * rope.rotated(k.contiguous(), shift)).sum(-1).double().sum(0)  # q·R_(j−i) k
    return shift.tolist(), total / words.size(0)


def rope_rotation_only(entry, num_positions):
    """(distances, values): mean over RoPE's frequencies of cos((j − i)·θ_p), the logit of an isotropic q = k
    against itself rotated, as a fraction of |q|²: what the rotation alone does with distance."""
    import torch

    _, keys = _distances(entry["causal"], num_positions)
    shift = keys - (num_positions - 1)
    theta = entry["module"].theta(torch.device("cpu"), torch.float64)
    return shift.tolist(), torch.cos(shift.double()[:, None] * theta[None, :]).mean(1)


def absolute_embeddings(model):
    """The model's absolute position embeddings: dicts with ``part`` (encoder/decoder), ``kind``
    (sinusoidal/learned), ``module``."""
    from fairseq.modules import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding

    out = []
    for part in ("encoder", "decoder"):
        module = getattr(getattr(model, part), "embed_positions", None)
        if isinstance(module, LearnedPositionalEmbedding):
            out.append(dict(part=part, kind="learned", module=module))
        elif isinstance(module, SinusoidalPositionalEmbedding):
            out.append(dict(part=part, kind="sinusoidal", module=module))
    return out


def scheme(model):
    if is_floater(model):
        return "floater"
    if relative_tables(model):
        return "relative"
    attention = attention_schemes(model)
    if attention:
        return attention[0]["kind"]
    kinds = {e["kind"] for e in absolute_embeddings(model)}
    if "learned" in kinds:
        return "learned"
    if "sinusoidal" in kinds:
        return "sinusoidal"
    return "none"


# -- figures ---------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi=100):
    """The figure as a PNG at path, written atomically (tooling.atomic), then closed."""
    atomic.save_figure(fig, path, format="png", dpi=dpi, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _heatmap(ax, sim, title, mark=None, extent_from=0, axis_label="position", ylabel=True):
    n = sim.shape[0]
    lo = extent_from - 0.5
    image = ax.imshow(sim.numpy() if hasattr(sim, "numpy") else sim, cmap="RdBu_r", vmin=-1, vmax=1,
                      origin="upper", interpolation="nearest", extent=(lo, lo + n, lo + n, lo))
    if mark is not None and extent_from < mark < extent_from + n:
        for line in (ax.axvline, ax.axhline):
            line(mark - 0.5, color="k", lw=0.8, ls="--")
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(axis_label, fontsize=7)
    if ylabel:
        ax.set_ylabel(axis_label, fontsize=7)
    else:  # a panel beside one with the same axes
        ax.tick_params(labelleft=False)
    ax.tick_params(labelsize=6)
    return image


def _colorbar(fig, image, axes):
    bar = fig.colorbar(image, ax=axes, shrink=0.8, pad=0.02)
    bar.set_label("cosine similarity", fontsize=8)
    bar.ax.tick_params(labelsize=7)


def _mark_for(side, train_max_len):
    if train_max_len is None:
        return None
    return train_max_len[0] if side == "source" else train_max_len[1]


def _distance_marks(mark, causal=False):
    """Where a sentence of mark tokens ends on a distance axis: ±(mark − 1), the past only for a causal stack;
    larger distances were never seen in training."""
    return (-(mark - 1),) if causal else (-(mark - 1), mark - 1)


def _marker_note(train_max_len):
    if train_max_len is None:
        return ""
    src, tgt = train_max_len
    return (f"; dashed: longest training sequence ({src} tokens)" if src == tgt else
            f"; dashed: longest training sequence (source {src}, target {tgt} tokens)")


def floater_figures(model, label, num_positions, train_max_len, out):
    plt = _pyplot()
    flows = floater_biases(model, num_positions)
    sims = [floater_similarities(flow) for flow in flows]
    embed = getattr(model.encoder, "embed_positions", None)
    dim = flows[0]["biases"].size(-1)
    reference = cosine_similarity(sinusoid(num_positions, dim, module=embed if _is_sinusoid(embed) else None))
    note = _marker_note(train_max_len)
    paths = []

    # pooled per block: one row per flow, one column per block, the sinusoid last
    columns = max(len(pooled) for _, pooled in sims) + 1
    fig, axes = plt.subplots(len(flows), columns, figsize=(2.6 * columns, 2.8 * len(flows)), squeeze=False)
    for row, (flow, (_, pooled)) in enumerate(zip(flows, sims)):
        mark = _mark_for(flow["side"], train_max_len)
        for col in range(columns):
            ax = axes[row, col]
            if col < len(pooled):
                block = sorted(pooled)[col]
                projections = ", ".join(p for b, p in flow["labels"] if b == block)
                image = _heatmap(ax, pooled[block], f"{flow['flow']} block {block + 1}\n{projections}", mark,
                                 ylabel=col == 0)
            elif col == columns - 1:
                image = _heatmap(ax, reference, f"sinusoid, d = {dim}\n(reference)", mark, ylabel=False)
            else:
                ax.axis("off")
    _colorbar(fig, image, axes)
    fig.suptitle(f"{_named(label, model)}: FLOATER biases b(t_i) = b(0) + Δb(t_i), cos(b(t_i), b(t_j)) "
                 f"averaged over each block's projections{note}", fontsize=9)
    paths.append(save_figure(fig, os.path.join(out, f"{label}_floater.png")))

    # per projection: one row per block, one column per (flow, projection)
    columns = [(f, j) for f, flow in enumerate(flows) for j in range(len(flow["labels"]))
               if flow["labels"][j][0] == flows[f]["labels"][0][0]]
    blocks = sorted({b for flow in flows for b, _ in flow["labels"]})
    fig, axes = plt.subplots(len(blocks), len(columns), figsize=(2.0 * len(columns), 2.2 * len(blocks)),
                             squeeze=False)
    short = {"encoder": "enc.", "decoder": "dec.", "cross": "dec."}
    for c, (f, j0) in enumerate(columns):
        flow, (per_projection, _) = flows[f], sims[f]
        kind = flow["labels"][j0][1]
        for r, block in enumerate(blocks):
            ax = axes[r, c]
            rows = [j for j, (b, p) in enumerate(flow["labels"]) if b == block and p == kind]
            if not rows:
                ax.axis("off")
                continue
            image = _heatmap(ax, per_projection[rows[0]], f"{short[flow['flow']]} block {block + 1} {kind}",
                             _mark_for(flow["side"], train_max_len), ylabel=c == 0)
    _colorbar(fig, image, axes)
    fig.suptitle(f"{_named(label, model)}: FLOATER biases per projection, cos(b(t_i), b(t_j)){note}", fontsize=9)
    paths.append(save_figure(fig, os.path.join(out, f"{label}_floater_projections.png"), dpi=90))

    # norms: one panel per flow, one line per projection (colour: block, style: projection)
    styles = {"q": "-", "k": "--", "v": ":", "cross-q": "-.", "cross-k": "--", "cross-v": ":"}
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(flows), figsize=(4.2 * len(flows), 3.4), squeeze=False)
    for ax, flow in zip(axes[0], flows):
        norms = flow["biases"].norm(dim=-1)  # (N, k)
        for j, (block, kind) in enumerate(flow["labels"]):
            ax.semilogy(range(num_positions), norms[:, j].numpy(), styles.get(kind, "-"),
                        color=colours[(block or 0) % len(colours)], lw=1, label=f"block {block + 1} {kind}")
        mark = _mark_for(flow["side"], train_max_len)
        if mark is not None:
            ax.axvline(mark - 0.5, color="k", lw=0.8, ls=":")
        ax.set_title(flow["title"], fontsize=8)
        ax.set_xlabel("position i", fontsize=7)
        ax.set_ylabel("||b(t_i)||", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=5, ncol=2)
    fig.suptitle(f"{_named(label, model)}: norm of the FLOATER biases b(t_i) = b(0) + Δb(t_i) by position"
                 f"{_marker_note(train_max_len).replace('dashed', 'dotted')}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    paths.append(save_figure(fig, os.path.join(out, f"{label}_floater_norms.png")))
    return paths


def _is_sinusoid(module):
    from fairseq.modules import SinusoidalPositionalEmbedding

    return isinstance(module, SinusoidalPositionalEmbedding)


def _is_randomized(module):
    from fairseq_plugins.modules.randomized_positions import RandomizedPositionalEmbedding

    return isinstance(module, RandomizedPositionalEmbedding)


def _sinusoid_name(module):
    """Randomized positions evaluate the sinusoid at spread positions: name the rule, not just the sinusoid."""
    if not _is_randomized(module):
        return "sinusoid"
    return f"randomized\n({module.eval_rule}, L = {module.max_position})"


def absolute_figure(model, label, num_positions, train_max_len, out):
    """Learned tables (beside the sinusoid of their dimension) or the sinusoid alone."""
    plt = _pyplot()
    embeddings = absolute_embeddings(model)
    learned = [e for e in embeddings if e["kind"] == "learned"]
    panels = []  # (matrix, title, side)
    for e in embeddings:
        side = "source" if e["part"] == "encoder" else "target"
        module = e["module"]
        if e["kind"] == "learned":
            rows = learned_rows(module, num_positions)
            extra = f", {module.max_positions} rows" if rows.size(0) < num_positions else ""
            panels.append((cosine_similarity(rows), f"{e['part']} learned table{extra}", side))
        elif not learned:
            panels.append((cosine_similarity(sinusoid(num_positions, module.embedding_dim, module=module)),
                           f"{e['part']} {_sinusoid_name(module)}, d = {module.embedding_dim}", side))
    if learned:
        dims = sorted({e["module"].embedding_dim for e in learned})
        panels += [(cosine_similarity(sinusoid(num_positions, d)), f"sinusoid, d = {d}", "source") for d in dims]
    elif len(panels) == 2 and panels[0][0].shape == panels[1][0].shape and bool(
            (panels[0][0] == panels[1][0]).all()) and train_max_len is None:
        panels = [(panels[0][0], panels[0][1].replace("encoder ", "encoder and decoder "), "source")]
    kind = "learned" if learned else "sinusoidal"
    what = f"{kind} absolute positions"
    if any(_is_randomized(e["module"]) for e in embeddings):  # its positions depend on the sentence's length
        what = f"sinusoid at the evaluation positions of a {num_positions}-token sentence"
    fig, axes = plt.subplots(1, len(panels), figsize=(3.0 * len(panels) + 0.8, 3.0), squeeze=False)
    for ax, (sim, title, side) in zip(axes[0], panels):
        image = _heatmap(ax, sim, title, _mark_for(side, train_max_len))  # the panels' lengths may differ
    _colorbar(fig, image, axes)
    fig.suptitle(f"{_named(label, model)}: {what}, cos(p_i, p_j){_marker_note(train_max_len)}",
                 fontsize=9)
    return [save_figure(fig, os.path.join(out, f"{label}_{kind}.png"))]


def relative_figures(model, label, out):
    plt = _pyplot()
    tables = relative_tables(model)
    layers = list(dict.fromkeys(t["name"] for t in tables))
    kinds = list(dict.fromkeys(t["table"] for t in tables))
    k = tables[0]["k"]
    distance = list(range(-k, k + 1))
    paths = []

    # one quantity (a vector's norm) in every panel: one y axis for all of them
    fig, axes = plt.subplots(len(layers), len(kinds), figsize=(4.2 * len(kinds), 1.9 * len(layers)),
                             squeeze=False, sharex=True, sharey=True)
    for t in tables:
        ax = axes[layers.index(t["name"]), kinds.index(t["table"])]
        norms = relative_norms(t)
        for h, row in enumerate(norms):
            ax.plot(distance, row.numpy(), marker=".", ms=3, lw=1,
                    label=f"head {h + 1}" if t["per_head"] else "all heads")
        ax.set_title(f"{t['name']}: {t['table']}", fontsize=8)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("L2 norm", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel(f"clipped distance j − i (k = {k})", fontsize=7)
    axes[0, -1].legend(fontsize=6, loc="upper right", ncol=2)
    heads = "one line per head" if tables[0]["per_head"] else "one table shared by the heads"
    fig.suptitle(f"{_named(label, model)}: relative position vectors (Shaw et al.), norm by distance; {heads}",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    paths.append(save_figure(fig, os.path.join(out, f"{label}_relative.png"), dpi=80))

    fig, axes = plt.subplots(len(kinds), len(layers), figsize=(2.3 * len(layers) + 0.8, 2.4 * len(kinds)),
                             squeeze=False)
    for t in tables:
        ax = axes[kinds.index(t["table"]), layers.index(t["name"])]
        image = _heatmap(ax, relative_similarity(t), f"{t['name']}: {t['table']}", extent_from=-k,
                         axis_label="distance", ylabel=layers.index(t["name"]) == 0)
    _colorbar(fig, image, axes)
    fig.suptitle(f"{_named(label, model)}: cosine similarity between the vectors of two distances"
                 + (", averaged over heads" if tables[0]["per_head"] else ""), fontsize=9)
    paths.append(save_figure(fig, os.path.join(out, f"{label}_relative_similarity.png")))
    return paths


ATTENTION_TITLES = {"t5": "T5 relative bias (Raffel et al.), β_h[bucket(j − i)]",
                    "alibi": "ALiBi (Press et al.), −m_h·|j − i|",
                    "kerple": "KERPLE log (Chi et al.), −r1_h·log(1 + r2_h·|j − i|)",
                    "fire": "FIRE (Li et al.), f_θ(ψ(|j − i|) / ψ(max(L, i)))",
                    "rope": "RoPE (Su et al.), first layer's logit for one word at two positions, vocabulary mean"}


def attention_title(kind, num_positions):
    """FIRE's bias depends on the query's position too (its normaliser), so its curves name the query drawn."""
    title = ATTENTION_TITLES[kind]
    return title + f", query i = {num_positions - 1}" if kind == "fire" else title


def attention_lines(model, entry, num_positions):
    """(distances, (H, len) values, y-axis label) of one stack's attention scheme."""
    if entry["kind"] == "rope":
        x, values = rope_logits_by_distance(model, entry, num_positions)
        return x, values, "logit q·R_(j−i) k / √d_z"
    x, values = score_bias_by_distance(entry, num_positions)
    return x, values, "logit bias"


def _same_y(axes):
    """One y range for panels that show the same quantity (the union of their own)."""
    axes = [ax for ax in axes if ax is not None]
    if len(axes) > 1:
        lows, highs = zip(*(ax.get_ylim() for ax in axes))
        for ax in axes:
            ax.set_ylim(min(lows), max(highs))


def attention_figure(model, label, num_positions, train_max_len, out):
    """One panel per stack: the scheme's effect on the logit by distance j − i, one thin line per head and their
    mean in black, every stack on one y axis (the same quantity); RoPE: beside them, on its own axis, the rotation
    alone (another quantity: a cosine)."""
    plt = _pyplot()
    entries = attention_schemes(model)
    kind = entries[0]["kind"]
    panels = len(entries) + (kind == "rope")
    fig, axes = plt.subplots(1, panels, figsize=(4.4 * panels, 3.4), squeeze=False)
    for ax, entry in zip(axes[0], entries):
        x, values, ylabel = attention_lines(model, entry, num_positions)
        for h, row in enumerate(values):
            ax.plot(x, row.numpy(), lw=0.8, alpha=0.75, label=f"head {h + 1}")
        if len(values) > 1:
            ax.plot(x, values.mean(0).numpy(), "k-", lw=1.6, label="mean over heads")
        mark = _mark_for("source" if entry["part"] == "encoder" else "target", train_max_len)
        if mark is not None:  # the longest training sentence: distances beyond ±(len − 1) were never seen
            for d in _distance_marks(mark, entry["causal"]):
                ax.axvline(d, color="k", lw=0.8, ls="--")
        ax.set_title(f"{entry['part']} self-attention" + (" (past only)" if entry["causal"] else ""), fontsize=8)
        ax.set_xlabel("distance j − i (key − query)", fontsize=7)
        ax.set_ylabel(ylabel, fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    _same_y(axes[0, :len(entries)])
    axes[0, 0].legend(fontsize=6, ncol=2)
    if kind == "rope":
        ax = axes[0, -1]
        x, values = rope_rotation_only(entries[0], num_positions)
        ax.plot(x, values.numpy(), "k-", lw=1)
        ax.set_title(f"the rotation alone (another quantity): mean_p cos((j − i)·θ_p), base "
                     f"{entries[0]['module'].base:g}", fontsize=8)
        ax.set_xlabel("distance j − i", fontsize=7)
        ax.set_ylabel("cosine", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    note = "" if train_max_len is None else "; dashed: the largest distance within a training sentence"
    fig.suptitle(f"{_named(label, model)}: {attention_title(kind, num_positions)}{note}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return [save_figure(fig, os.path.join(out, f"{label}_{kind}.png"))]


def neighbour_similarity(vectors):
    """(N, d) -> (N−1,): cos(p_i, p_{i+1})."""
    import torch

    return torch.nn.functional.cosine_similarity(vectors[:-1].double(), vectors[1:].double(), dim=-1)


def neighbour_angle(vectors):
    """(N, d) -> (N−1,): the angle between p_i and p_{i+1}, degrees (0: the same direction)."""
    import torch

    return torch.rad2deg(torch.arccos(neighbour_similarity(vectors).clamp(-1, 1)))


NEIGHBOURS = "angle between p_i and p_{i+1} (degrees)"


def headline(model, num_positions):
    """What the compare figure shows for one model (encoder side), a dict: ``kind``, ``sim`` (heatmap), ``title``,
    ``origin`` and ``axis`` (the heatmap's first index and axis name), ``side`` (for the training-length mark;
    None: no positions on the axes), ``distances`` (the axes are distances j − i: the mark at ± length − 1),
    ``profile`` [(x, y, label, style)], ``px``, ``py`` (its axis labels)."""
    import torch

    kind = scheme(model)
    if kind == "floater":
        flow = floater_biases(model, num_positions)[0]  # the encoder's
        _, pooled = floater_similarities(flow)
        dim = flow["biases"].size(-1)
        embed = model.encoder.embed_positions
        ref = sinusoid(num_positions, dim, module=embed if _is_sinusoid(embed) else None)
        neighbours = torch.stack([neighbour_angle(flow["biases"][:, j]) for j in range(flow["biases"].size(1))])
        x = list(range(num_positions - 1))
        blocks = f"{len(pooled)} blocks" if len(pooled) > 1 else "block 1"
        return dict(kind="FLOATER", sim=torch.stack(list(pooled.values())).mean(0),
                    title=f"biases b(t_i), mean over q, k, v and {blocks}", origin=0, axis="position",
                    side="source",
                    profile=[(x, neighbours.mean(0), f"FLOATER (mean of {neighbours.size(0)} projections)", "-"),
                             (x, neighbour_angle(ref), f"sinusoid, d = {dim}", "--")],
                    ptitle="how far each position turns from the last", px="position i", py=NEIGHBOURS)
    if kind == "relative":
        tables = [t for t in relative_tables(model) if t["name"].startswith("encoder")] or relative_tables(model)
        k = tables[0]["k"]
        x = list(range(-k, k + 1))
        first = tables[0]["table"]
        layers = [t for t in tables if t["table"] == first]
        side = layers[0]["name"].split()[0]
        profile = []
        for table in dict.fromkeys(t["table"] for t in tables):
            norms = torch.stack([relative_norms(t).mean(0) for t in tables if t["table"] == table]).mean(0)
            profile.append((x, norms, table, "-"))
        return dict(kind="Shaw relative", sim=torch.stack([relative_similarity(t) for t in layers]).mean(0),
                    title=f"{side} {first}: similarity between distances,\nmean over heads and {len(layers)} layers",
                    origin=-k, axis="distance", side=None, profile=profile,
                    ptitle=f"norm of each distance's vector, {side}", px="clipped distance j − i",
                    py="L2 norm (mean over heads, layers)")
    if kind in ATTENTION_TITLES:
        entry = attention_schemes(model)[0]  # the encoder's
        x, values, ylabel = attention_lines(model, entry, num_positions)
        lines = [(x, row, f"head {h + 1}", "-") for h, row in enumerate(values)]
        title = textwrap.fill(f"{entry['part']}: {attention_title(kind, num_positions).split(', ', 1)[-1]}", 44)
        return dict(kind=kind, lines=lines, title=title,
                    axis="distance j − i", ylabel=ylabel, side="source", distances=True,
                    profile=[(x, values.mean(0), "mean over heads", "-")], ptitle="the same, mean over heads",
                    px="distance j − i", py=ylabel)
    if kind in ("learned", "sinusoidal"):
        e = absolute_embeddings(model)[0]
        module = e["module"]
        dim = module.embedding_dim
        everywhere = list(range(num_positions - 1))
        if kind == "learned":
            rows = learned_rows(module, num_positions)
            ref = sinusoid(num_positions, dim)
            return dict(kind="learned absolute", sim=cosine_similarity(rows), title=f"{e['part']} learned table",
                        origin=0, axis="position", side="source",
                        profile=[(list(range(rows.size(0) - 1)), neighbour_angle(rows), "learned table", "-"),
                                 (everywhere, neighbour_angle(ref), f"sinusoid, d = {dim}", "--")],
                        ptitle="how far each position turns from the last", px="position i", py=NEIGHBOURS)
        rows = sinusoid(num_positions, dim, module=module)
        return dict(kind="randomized" if _is_randomized(module) else "sinusoidal",
                    sim=cosine_similarity(rows), title=f"{e['part']} {_sinusoid_name(module)}, d = {dim}",
                    origin=0, axis="position", side="source",
                    profile=[(everywhere, neighbour_angle(rows), f"sinusoid, d = {dim}", "--")],
                    ptitle="how far each position turns from the last", px="position i", py=NEIGHBOURS)
    return None


def compare_figure(models, labels, num_positions, train_max_len, out):
    """One column per checkpoint: its scheme's headline picture (top) and a profile (bottom), each panel titled
    with what it shows; panels that show the same quantity share their y range (the angle between neighbouring
    positions from 0 degrees; the logit terms of schemes inside attention), the others keep their own; each heatmap
    its own colour bar."""
    plt = _pyplot()
    shown = [(label, model, headline(model, num_positions)) for label, model in zip(labels, models)]
    fig, axes = plt.subplots(2, len(shown), figsize=(4.2 * len(shown), 7.4), squeeze=False,
                             gridspec_kw=dict(height_ratios=(3, 2), wspace=0.5, hspace=0.55))
    same = {}  # quantity -> the axes that show it
    for c, (label, model, h) in enumerate(shown):
        top, bottom = axes[0, c], axes[1, c]
        name = f"{label} ({h['kind'] if h else 'no position encoding'}), {budget(model)}"
        if h is None:
            top.set_title(name, fontsize=8)
            top.axis("off")
            bottom.axis("off")
            continue
        mark = _mark_for(h["side"], train_max_len) if h["side"] else None
        at = [] if mark is None else _distance_marks(mark) if h.get("distances") else [mark - 0.5]
        if "lines" in h:  # a scheme inside attention: its logit term by distance, one line per head
            for x, y, line, style in h["lines"]:
                top.plot(x, y.numpy(), style, lw=0.9, alpha=0.8, label=line)
            top.set_title(f"{name}\n{h['title']}", fontsize=8)
            top.set_xlabel(h["axis"], fontsize=7)
            top.set_ylabel(h["ylabel"], fontsize=7)
            top.tick_params(labelsize=6)
            top.grid(alpha=0.3)
            top.legend(fontsize=6, ncol=2)
            for d in at:
                top.axvline(d, color="k", lw=0.8, ls="--")
            same.setdefault(h["ylabel"], []).append(top)
        else:
            image = _heatmap(top, h["sim"], f"{name}\n{h['title']}", mark, extent_from=h["origin"],
                             axis_label=h["axis"])
            bar = fig.colorbar(image, ax=top, fraction=0.046, pad=0.03)  # beside its own heatmap
            bar.set_label("cosine similarity", fontsize=7)
            bar.ax.tick_params(labelsize=6)
        for x, y, line, style in h["profile"]:
            bottom.plot(x, y.numpy() if hasattr(y, "numpy") else y, style, lw=1.2, label=line)
        for d in at:
            bottom.axvline(d, color="k", lw=0.8, ls=":")
        bottom.ticklabel_format(axis="y", useOffset=False)
        if h["py"] == NEIGHBOURS:  # from 0, with room above: a constant angle (the sinusoid's) sat on the frame
            top_angle = max(float(max(y)) for _, y, _, _ in h["profile"])
            bottom.set_ylim(0, 1.08 * top_angle if top_angle > 0 else 1.0)
        bottom.set_title(h["ptitle"], fontsize=8)
        bottom.set_xlabel(h["px"], fontsize=7)
        bottom.set_ylabel(h["py"], fontsize=7)
        bottom.tick_params(labelsize=6)
        bottom.grid(alpha=0.3)
        bottom.legend(fontsize=6)
        same.setdefault(h["py"], []).append(bottom)
    for group in same.values():
        _same_y(group)
    note = _marker_note(train_max_len).replace("dashed", "dashed (dotted below)")
    if note and any(h and h.get("distances") for _, _, h in shown):
        note += "; on distance axes: ± its length − 1"
    fig.suptitle(f"What each position scheme learned (encoder side){note}", fontsize=9)
    return [save_figure(fig, os.path.join(out, "compare.png"))]


def figures(model, label, num_positions, train_max_len, out):
    kind = scheme(model)
    paths = []
    if kind == "floater":
        paths += floater_figures(model, label, num_positions, train_max_len, out)
    if kind == "relative":
        paths += relative_figures(model, label, out)
    if attention_schemes(model):
        paths += attention_figure(model, label, num_positions, train_max_len, out)
    if kind != "floater" and absolute_embeddings(model):
        paths += absolute_figure(model, label, num_positions, train_max_len, out)
    return paths


# -- command line ----------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage and then the message
        fail(f"error: {message}")


def _train_max_len(text):
    parts = text.split(",")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(parts) not in (1, 2) or len(values) != len(parts) or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected SRC or SRC,TGT (integers >= 1), got {text!r}")
    return (values[0], values[-1])


def _positions(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 2 <= value <= MAX_POSITIONS:
        raise argparse.ArgumentTypeError(f"expected an integer from 2 to {MAX_POSITIONS}, got {text!r}")
    return value


def _default_label(path):
    p = Path(path)
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{p.parent.name}_{p.stem}" if p.parent.name else p.stem)


def parse_args(argv=None):
    ap = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="fairseq checkpoint(s) (.pt)")
    ap.add_argument("--out", required=True, help="folder for the PNG figures (created if missing)")
    ap.add_argument("--label", action="append", metavar="NAME",
                    help="figure name prefix, once per checkpoint in order (default: folder_file of the checkpoint)")
    ap.add_argument("--positions", type=_positions, default=128, metavar="N",
                    help="positions 0..N−1 to draw (default 128)")
    ap.add_argument("--train-max-len", type=_train_max_len, metavar="SRC[,TGT]",
                    help="mark the longest training sequence, in tokens (end of sentence included), source and "
                         "target; default: no mark")
    ap.add_argument("--compare", action="store_true",
                    help="also write compare.png, one column per checkpoint (the default with several)")
    args = ap.parse_args(argv)
    if args.label is None:
        args.label = [_default_label(c) for c in args.checkpoints]
    if len(args.label) != len(args.checkpoints):
        fail(f"--label: given {len(args.label)} time(s) for {len(args.checkpoints)} checkpoint(s) "
             "(expected one per checkpoint, or none)")
    for label in args.label:
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", label):
            fail(f"--label {label!r}: expected letters, digits and _ . + - only (it names files)")
    if len(set(args.label)) != len(args.label):
        fail(f"--label: the labels must differ (they name the files), got {', '.join(args.label)}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        fail(f"--out {args.out}: exists and is not a folder")
    args.compare = args.compare or len(args.checkpoints) > 1
    return args


def main(argv=None):
    args = parse_args(argv)
    _register_plugins()  # this checkout's plugins, before anything imports fairseq_plugins
    import torch

    with torch.no_grad():  # not set_grad_enabled(False): main may run inside another program (the tests)
        _draw(args)


def _draw(args):
    from fairseq_plugins.modules.floater import FloaterSolverError

    try:
        models = [load_model(path) for path in args.checkpoints]  # everything checked before anything is written
    except BadInput as e:
        fail(str(e))
    for model, path in zip(models, args.checkpoints):  # FLOATER's solve first (then cached): before any figure
        if is_floater(model):
            try:
                floater_biases(model, args.positions)
            except FloaterSolverError:
                fail(f"--positions {args.positions}: the FLOATER biases of {path} overflow (non-finite) within that "
                     "many positions; draw fewer positions")
    written = []
    for model, label in zip(models, args.label):
        written += figures(model, label, args.positions, args.train_max_len, args.out)
    if args.compare:
        written += compare_figure(models, args.label, args.positions, args.train_max_len, args.out)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
