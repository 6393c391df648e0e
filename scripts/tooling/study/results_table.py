"""The Multi30k study in one table, and the length probe in one figure (scripts/study/study.py results-table, probe-plot;
the study's tabulate step remakes both when it tabulates one of their sources).

The table has a row per scheme: its test-set Δ tok-lc BLEU against the Transformer at 8 epochs
(results/multi30k_study/summary.json) and at 20 epochs (epochs20/summary.json), each with its 95% interval over
seeds and sentences, bold where that interval excludes 0 (beyond seed noise); the same from a converged run's
summary where one exists (results/multi30k_gpu/summary.json, the same format; "—" until then); the train-short
length probe's Δ at 1–1.5×, 1.5–2× and past 3× the longest training source (tok32_joined/probe_table.md, its
bootstrap over seeds and probes; bold where its interval excludes 0); and a reading of at most a dozen words
(READINGS). Nothing is recomputed: every number is read from the stored summaries and probe table.

README.md and results/multi30k_study/README.md carry the table between BEGIN and END; `check` says where a copy
differs from what the committed files give (tests/test_results_table.py).

The figure (results/multi30k_study/probe.png): per scheme of the train-short condition, the probe's BLEU and its
hypothesis/reference length ratio by bucket, the mean over seeds with the seeds' min–max band, from the committed
runs/MODEL.seedS.probe.json; the Transformer in black.
"""
import json
import re
import statistics
from pathlib import Path

from tooling.atomic import save_figure, write_text
from tooling.paths import ROOTS

# the checkout whose results these are: the enclosing clone's when the code runs from a study's snapshot in it
ROOT = ROOTS[0]

STUDY = Path("results/multi30k_study")
SOURCES = {"8 epochs": STUDY / "summary.json", "20 epochs": STUDY / "epochs20/summary.json",
           "converged (GPU)": Path("results/multi30k_gpu/summary.json")}
PROBE = STUDY / "tok32_joined"
PROBE_BUCKETS = ("1–1.5×", "1.5–2×", "> 3×")
TABLE_FILE = STUDY / "results_table.md"
FIGURE = STUDY / "probe.png"
COPIES = (Path("README.md"), STUDY / "README.md")  # the files that carry the table between the markers
BEGIN, END = "<!-- results-table:begin -->", "<!-- results-table:end -->"
BASELINE = "transformer"
MAX_READING_WORDS = 12

# the rows, in order: scheme -> (what it is, what the study says of it in at most a dozen words)
READINGS = {
    "transformer": ("sinusoidal, the reference", "outputs stop short past the training length"),
    "learned": ("learned absolute", "level; worse where positions first leave training"),
    "shape": ("SHAPE", "behind at every budget and length, by either protocol"),
    "cape": ("CAPE", "behind at 8 epochs; no gain past the training lengths"),
    "randomized": ("randomized positions", "outputs keep the references' length: far ahead past 1.5×"),
    "nope": ("NoPE decoder", "behind at 8 epochs, level at 20; level in the probe"),
    "relative": ("Shaw relative", "ahead at both budgets and up to 3× in the probe"),
    "t5": ("T5 bias", "ahead on the test set; behind past 3×"),
    "rope": ("RoPE", "best at 8 epochs; level past the training lengths"),
    "alibi": ("ALiBi", "ahead at 8 epochs only; ahead in the probe, within noise"),
    "kerple": ("KERPLE", "ahead at both budgets; like ALiBi in the probe"),
    "fire": ("FIRE", "ahead at both budgets; ahead at 1.5–2× and past 3×"),
    "floater": ("FLOATER, from scratch", "small lead at 8 epochs, none at 20; outputs loop past 1.5×"),
    "floater_warm": ("FLOATER, warm start", "its gain is the extra training: level with its control"),
    "transformer_ft": ("sinusoidal, same fine-tuning", "the warm start's control: fine-tuned alike, without FLOATER"),
    "alibi_sync": ("cross-attention prior", "outputs keep their length on monotone joined probes"),
}


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def cell(cmp, bold_beyond=True):
    """'Δ [lo, hi]' from a summary's comparison, Δ in bold where the interval excludes 0."""
    test = cmp["bootstrap"]["bleu_tok_lc"]
    delta = f"{cmp['delta']['bleu_tok_lc']:+.2f}"
    if test["ci"] is None:
        return f"{delta} (one seed)"
    lo, hi = test["ci"]
    return f"{f'**{delta}**' if bold_beyond and not lo <= 0 <= hi else delta} [{lo:+.2f}, {hi:+.2f}]"


def probe_tables(text):
    """{title: {model: [cells]}} and the bucket headings of probe_table.md's tables."""
    tables, heads, title = {}, None, None
    for line in text.splitlines():
        m = re.match(r"\*\*(.+?)\*\*", line)
        if m:
            title = m.group(1)
        elif line.startswith("| model |") and title:
            heads = [h.strip() for h in line.strip("|").split("|")[2:]]
            tables[title] = {"heads": heads}
        elif line.startswith("| ") and title in tables and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            tables[title][cells[0]] = cells[2:]
    return tables


def probe_cells(root):
    """{model: [cell per PROBE_BUCKETS]} from the train-short probe table: Δ (bold where its interval over seeds and
    probes excludes 0), the transformer's BLEU in its own row; {} when there is no such table."""
    path = root / PROBE / "probe_table.md"
    if not path.is_file():
        return {}
    tables = probe_tables(path.read_text(encoding="utf-8"))
    delta = next((t for title, t in tables.items() if title.startswith(f"Δ BLEU tok-lc against {BASELINE}")), None)
    bleu = tables.get("BLEU tok-lc")
    out = {}
    for table, kind in ((delta, "delta"), (bleu, "bleu")):
        if not table:
            continue
        idx = [next(i for i, h in enumerate(table["heads"]) if h.split(" (")[0] == b) for b in PROBE_BUCKETS]
        for model, cells in table.items():
            if model == "heads" or (kind == "bleu") != (model == BASELINE):
                continue
            row = []
            for i in idx:
                m = re.fullmatch(r"([+-]?\d+\.\d+)(?: ± \d+\.\d+)?(?: \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\])?", cells[i])
                if not m:
                    row.append(cells[i] or "—")
                elif kind == "bleu":
                    row.append(f"{m.group(1)} BLEU")
                else:
                    beyond = m.group(2) is not None and not float(m.group(2)) <= 0 <= float(m.group(3))
                    row.append(f"**{m.group(1)}**" if beyond else m.group(1))
            out[model] = row
    return out


def build(root=ROOT):
    """The table (markdown, ending in a newline) from the committed files under root."""
    root = Path(root)
    summaries = {name: load_json(root / path) for name, path in SOURCES.items()}
    probe = probe_cells(root)
    models = list(READINGS) + [m for s in summaries.values() if s for m in s["models"] if m not in READINGS]
    models = [m for m in models if any(s and m in s["models"] for s in summaries.values())]
    lines = ["| scheme | " + " | ".join(f"Δ {name}" for name in SOURCES) + " | "
             + " | ".join(f"probe {b}" for b in PROBE_BUCKETS) + " | reading |",
             "|---" * (len(SOURCES) + len(PROBE_BUCKETS) + 2) + "|"]
    seeds = {}
    for m in models:
        cells = []
        for name, summary in summaries.items():
            entry = (summary or {}).get("models", {}).get(m)
            if not entry or not entry.get("bleu_tok_lc"):  # not in that table, or no run of it yet
                cells.append("—")
            elif m == BASELINE:
                cells.append(f"{statistics.mean(entry['bleu_tok_lc']):.2f} BLEU")
            elif f"vs_{BASELINE}" in entry:
                cmp = entry[f"vs_{BASELINE}"]
                cells.append(cell(cmp))
                seeds.setdefault(len(cmp["seeds"]), {}).setdefault(name, []).append(m)
            else:
                cells.append("—")
        cells += probe.get(m, ["—"] * len(PROBE_BUCKETS))
        label, reading = READINGS.get(m, (m, ""))
        lines.append(f"| {label} (`{m}`) | " + " | ".join(cells) + f" | {reading} |")
    common = max(seeds, key=lambda k: sum(map(len, seeds[k].values()))) if seeds else 3
    others = "; ".join(f"{k} seeds at {name}: {', '.join(v)}" for k, by in sorted(seeds.items()) if k != common
                       for name, v in by.items())
    legend = ["Multi30k En-De test set (1,000 sentences): Δ tok-lc BLEU against the sinusoidal Transformer of the "
              f"same seeds (its own row: its BLEU), {common} seeds{f' ({others})' if others else ''}; in brackets the "
              "95% interval over seeds and test sentences; **bold**: the interval excludes 0 (beyond seed noise). "
              "Probe: the train-short condition's Δ by source length relative to the longest training source, bold "
              "beyond seed and probe noise. "
              "Made by `scripts/study/study.py results-table` from `results/multi30k_study/{summary.json, "
              "epochs20/summary.json, tok32_joined/probe_table.md}` and `results/multi30k_gpu/summary.json`."]
    share = []  # FLOATER's own share: its warm start against the same fine-tuning without it
    for name, summary in summaries.items():
        for c in (summary or {}).get("claims", []):
            if c["model"] == "floater_warm" and c["reference"] == "transformer_ft":
                share.append(f"{cell(c)} at {name} ({len(c['seeds'])} seeds)")
    if share:
        legend.append("FLOATER's own share (the warm start against the same fine-tuning without FLOATER): "
                      + "; ".join(share) + ".")
    lines += ["", " ".join(legend)]
    return "\n".join(lines) + "\n"


def block(table):
    return f"{BEGIN}\n{table}{END}"


def copy_in(text):
    """The table between the markers of a file's text (None without them)."""
    m = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, flags=re.S)
    return m.group(1) if m else None


def check(root=ROOT):
    """[(file, what is wrong)] for each copy of the table that is not what the committed files give."""
    table, wrong = build(root), []
    for path in COPIES:
        text = (Path(root) / path).read_text(encoding="utf-8")
        have = copy_in(text)
        if have is None:
            wrong.append((str(path), f"no {BEGIN} … {END} block"))
        elif have != table:
            wrong.append((str(path), "its table differs from `scripts/study/study.py results-table`"))
    return wrong


def write(root=ROOT, readmes=True):
    """results_table.md, and each copy's block where the file has the markers. Returns the table."""
    root = Path(root)
    table = build(root)
    write_text(root / TABLE_FILE, table)
    for path in COPIES if readmes else ():
        file = root / path
        text = file.read_text(encoding="utf-8") if file.is_file() else ""
        if copy_in(text) is not None and copy_in(text) != table:
            start, end = text.index(BEGIN), text.index(END) + len(END)
            write_text(file, text[:start] + block(table) + text[end:])
    return table


def sources(root=ROOT):
    """The folders whose tabulation changes the table or the figure."""
    return {(Path(root) / p).parent.resolve() for p in SOURCES.values()} | {(Path(root) / PROBE).resolve()}


def refresh(out, root=ROOT):
    """After a tabulation into `out`: the table, its copies and the figure remade when out is one of their sources."""
    if Path(out).resolve() not in sources(root):
        return False
    write(root)
    if (Path(root) / PROBE / "runs").is_dir():
        plot_probe(Path(root) / PROBE, Path(root) / FIGURE)
    return True


def probe_runs(folder):
    """{model: {seed: probe result}} of a condition's trained schemes (its summary's models: a scheme decoded
    another way, e.g. rope_ntk_x4, is not one), in the summary's order."""
    folder = Path(folder)
    summary = load_json(folder / "summary.json") or {}
    order = list(READINGS) + sorted(summary.get("models", {}))
    runs = {}
    for path in sorted((folder / "runs").glob("*.seed*.probe.json")):
        m = re.fullmatch(r"(\w+)\.seed(\d+)\.probe\.json", path.name)
        if m and (not summary or m.group(1) in summary["models"]):
            runs.setdefault(m.group(1), {})[int(m.group(2))] = json.loads(path.read_text(encoding="utf-8"))
    return {m: runs[m] for m in dict.fromkeys(order) if m in runs} | runs


def plot_probe(folder, out):
    """Two panels, BLEU and the hypothesis/reference length ratio by bucket: per scheme the mean over seeds and
    the seeds' min–max band, the Transformer in black on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = probe_runs(folder)
    if not runs:
        raise SystemExit(f"no MODEL.seedS.probe.json of a tabulated model in {Path(folder) / 'runs'}")
    first = next(iter(next(iter(runs.values())).values()))
    heads = [f"{b['bucket']}\n({b['source_tokens'][0]}–{b['source_tokens'][1]})" if b.get("source_tokens")
             else b["bucket"] for b in first["buckets"]]
    xs = list(range(len(heads)))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    colors = iter(plt.get_cmap("tab20").colors)
    for model, seeds in sorted(runs.items(), key=lambda kv: kv[0] == BASELINE):  # the transformer drawn last
        base = model == BASELINE
        color = "black" if base else next(colors)
        label = f"{READINGS.get(model, (model,))[0]} ({len(seeds)} seeds)"
        for ax, key in zip(axes, ("bleu_tok_lc", "hyp_ref_ratio")):
            values = [[r["buckets"][i].get(key) for r in seeds.values()] for i in xs]
            mean = [statistics.mean(v) if None not in v else float("nan") for v in values]
            ax.fill_between(xs, [min(v) if None not in v else float("nan") for v in values],
                            [max(v) if None not in v else float("nan") for v in values],
                            color=color, alpha=0.25 if base else 0.10, linewidth=0)
            ax.plot(xs, mean, color=color, linewidth=3.0 if base else 1.3, marker="o", markersize=5 if base else 3,
                    zorder=5 if base else 2, label=label)
    axes[0].set_ylabel("BLEU tok-lc")
    axes[1].set_ylabel("hypothesis / reference length")
    axes[1].axhline(1.0, color="0.5", linestyle=":", linewidth=1)
    axes[1].text(xs[-1], 1.02, "outputs as long as the references", ha="right", va="bottom", fontsize=8,
                 color="0.4")
    for ax, title in zip(axes, ("BLEU by source length", "where outputs stop short (< 1) or run on (> 1)")):
        ax.set_xticks(xs, heads, fontsize=8)
        ax.set_xlabel(f"source length relative to the longest training source ({first['train_longest_source']} "
                      "tokens)", fontsize=9)
        ax.axvspan(-0.4, 0.5, color="0.9", zorder=0)  # within the training lengths
        ax.set_xlim(-0.4, xs[-1] + 0.4)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    order = [labels.index(x) for x in sorted(labels, key=lambda x: not x.startswith(READINGS[BASELINE][0]))]
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="center right", fontsize=8,
               frameon=False)
    fig.suptitle("Length probe, train-short condition: test sentences joined k at a time (mean over seeds, "
                 "band: min–max); shaded: within the training lengths", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.80, 1))
    save_figure(fig, out, dpi=110)
    plt.close(fig)
    return out
