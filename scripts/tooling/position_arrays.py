"""What a checkpoint's position schemes learned, as tensors (scripts/plot_positions.py draws them:
tooling.position_figures). The model is built from the checkpoint alone (``load_model``: the vocabulary sizes come
from its embedding tables, no data directory); positions are fairseq's, position i the (i+1)-th token of a
sentence, padding not counted.

Which scheme a stack has is read from the table (``fairseq_plugins/schemes.py``): every row of kind ``score bias``
or ``rotary`` whose class is the stack's module (``attention_schemes``), so a new scheme inside self-attention is
extracted through its own ``score_bias`` (a rotary one through ``rotated`` and ``theta``, as RoPE's) with no edit
here; FLOATER's biases, Shaw's tables and the absolute embeddings are read from their modules.
"""
import argparse
import os
import re
from pathlib import Path

ATTENTION_KINDS = ("score bias", "rotary")  # the table's kinds drawn by distance j − i


class BadInput(Exception):
    """One line for the user: the file or flag and what was expected."""


# -- loading a checkpoint without its data ---------------------------------------------------------------------


def register_plugins():
    from fairseq import utils

    plugins = Path(__file__).resolve().parents[2] / "fairseq_plugins"
    utils.import_user_module(argparse.Namespace(user_dir=str(plugins)))


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

    register_plugins()
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
    from fairseq_plugins.models.position_transformer import as_namespace  # the model args as a Namespace

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


# -- what the schemes learned, as tensors ------------------------------------------------------------------------


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
    from fairseq_plugins.models._stacks import source_lengths

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


def attention_schemes(model):
    """The stacks' schemes inside self-attention: each stack whose module is the class of a row of the table of
    kind ``score bias`` or ``rotary`` (read when called: a row added to the table is found). Dicts with ``part``
    (encoder/decoder), ``kind`` (the row's name: t5, alibi, ..., rope), ``row``, ``module``, ``causal``."""
    from fairseq_plugins.schemes import SCHEMES

    rows = {s.cls: s for s in SCHEMES.values() if s.kind in ATTENTION_KINDS and s.cls is not None}
    out = []
    for part in ("encoder", "decoder"):
        module = getattr(getattr(model, part), "position_scheme", None)
        row = rows.get(type(module))
        if row is not None:
            out.append(dict(part=part, kind=row.name, row=row, module=module, causal=part == "decoder"))
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
    """(distances, values): the logit of an isotropic q = k at position i against itself at j, as a fraction of
    |q|², the trace of the module's own ``rotated`` over d_z: what the rotation alone does with distance (RoPE's
    mean over frequencies of cos((j − i)·θ_p); xPos' times its scale ζ_p^(−(j − i)/γ), its module's ``alone``)."""
    import torch

    _, keys = _distances(entry["causal"], num_positions)
    shift = keys - (num_positions - 1)
    module = entry["module"]
    basis = torch.eye(module.head_dim, dtype=torch.float64)  # one key per dimension, at every distance
    rotated = module.rotated(basis[None, :, None].expand(1, -1, shift.numel(), -1), shift)  # (1, d, len, d)
    return shift.tolist(), torch.diagonal(rotated[0], dim1=0, dim2=2).mean(-1)


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


def neighbour_similarity(vectors):
    """(N, d) -> (N−1,): cos(p_i, p_{i+1})."""
    import torch

    return torch.nn.functional.cosine_similarity(vectors[:-1].double(), vectors[1:].double(), dim=-1)


def neighbour_angle(vectors):
    """(N, d) -> (N−1,): the angle between p_i and p_{i+1}, degrees (0: the same direction)."""
    import torch

    return torch.rad2deg(torch.arccos(neighbour_similarity(vectors).clamp(-1, 1)))


def is_sinusoid(module):
    from fairseq.modules import SinusoidalPositionalEmbedding

    return isinstance(module, SinusoidalPositionalEmbedding)


def is_randomized(module):
    from fairseq_plugins.modules.randomized_positions import RandomizedPositionalEmbedding

    return isinstance(module, RandomizedPositionalEmbedding)


def attention_lines(model, entry, num_positions):
    """(distances, (H, len) values, y-axis label) of one stack's attention scheme."""
    if entry["row"].kind == "rotary":
        x, values = rope_logits_by_distance(model, entry, num_positions)
        return x, values, f"logit {entry['row'].cls.equation} / √d_z"
    x, values = score_bias_by_distance(entry, num_positions)
    return x, values, "logit bias"
