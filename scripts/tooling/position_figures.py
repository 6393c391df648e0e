"""The figures of scripts/plot_positions.py, from the tensors of tooling.position_arrays: one function per figure,
each writing PNGs atomically (tooling.atomic) and returning their paths. A scheme inside self-attention (a row of
kind ``score bias`` or ``rotary``) is titled with its class's ``title`` and ``equation``
(``modules/position_scheme.py``), so a new one is drawn with no edit here.
"""
import os
import textwrap

from tooling import atomic
from tooling.position_arrays import (
    absolute_embeddings,
    attention_lines,
    attention_schemes,
    budget,
    cosine_similarity,
    floater_biases,
    floater_similarities,
    is_randomized,
    is_sinusoid,
    learned_rows,
    neighbour_angle,
    relative_norms,
    relative_similarity,
    relative_tables,
    rope_rotation_only,
    scheme,
    sinusoid,
)


def _named(label, model):
    """What a figure's title says of its checkpoint: the label (scheme, budget and seed as the user names them,
    e.g. rope.ep20.seed1) and the budget the checkpoint records."""
    return f"{label} ({budget(model)})"


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
    reference = cosine_similarity(sinusoid(num_positions, dim, module=embed if is_sinusoid(embed) else None))
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


def _sinusoid_name(module):
    """Randomized positions evaluate the sinusoid at spread positions: name the rule, not just the sinusoid."""
    if not is_randomized(module):
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
    if any(is_randomized(e["module"]) for e in embeddings):  # its positions depend on the sentence's length
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


def attention_title(entry, num_positions):
    """The row's class's title and equation (a rotary scheme: the logit the figure draws); a score bias that reads
    positions themselves (FIRE's normaliser) depends on the query's position too, so its curves name the query (a
    rotation's logit is a function of j − i alone, whatever positions it reads: xPos')."""
    row = entry["row"]
    title = row.cls.title or row.name
    if row.kind == "rotary":
        title += ", first layer's logit for one word at two positions, vocabulary mean"
    else:
        title += f", {row.cls.equation or 'its logit bias'}"
    by_query = row.kind != "rotary" and getattr(row.cls, "per_sentence", False)
    return title + f", query i = {num_positions - 1}" if by_query else title


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
    rotary = entries[0]["row"].kind == "rotary"
    panels = len(entries) + rotary
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
    if rotary:
        ax = axes[0, -1]
        x, values = rope_rotation_only(entries[0], num_positions)
        ax.plot(x, values.numpy(), "k-", lw=1)
        module = entries[0]["module"]  # RoPE's: cosines; a rotation that also scales names its curve (``alone``)
        alone = module.alone
        curve = alone or f"mean_p cos((j − i)·θ_p), {module.extra_repr()}"
        ax.set_title(f"the rotation alone (another quantity): {curve}", fontsize=8)
        ax.set_xlabel("distance j − i", fontsize=7)
        ax.set_ylabel("cosine" if alone is None else "logit / |q|²", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    note = "" if train_max_len is None else "; dashed: the largest distance within a training sentence"
    fig.suptitle(f"{_named(label, model)}: {attention_title(entries[0], num_positions)}{note}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return [save_figure(fig, os.path.join(out, f"{label}_{kind}.png"))]


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
        ref = sinusoid(num_positions, dim, module=embed if is_sinusoid(embed) else None)
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
    attention = attention_schemes(model)
    if attention and kind == attention[0]["kind"]:
        entry = attention[0]  # the encoder's
        x, values, ylabel = attention_lines(model, entry, num_positions)
        lines = [(x, row, f"head {h + 1}", "-") for h, row in enumerate(values)]
        title = textwrap.fill(f"{entry['part']}: {attention_title(entry, num_positions).split(', ', 1)[-1]}", 44)
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
        return dict(kind="randomized" if is_randomized(module) else "sinusoidal",
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
