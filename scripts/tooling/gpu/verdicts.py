"""The GPU check's report (scripts/gpu/gpu_check.py): results/gpu_check/gpu_check.md and .json, and the verdict table that
decides its exit status.

    verdicts(report)                one row per check of the sections run so far: bound, worst value, passed
    markdown(report)                the report: each section's status and tables, then the verdicts
    write_report(report, out_dir)   gpu_check.json and .md, atomically (after each section)
    status_line(section)            a section's one line: completed, timed out or failed, and why
"""
import json
import time

from tooling.atomic import write_text
from tooling.gpu.common import (FIRST_CALL, GRAPH_MEMORY_MARGIN, INVARIANCE_BOUND, INVARIANCE_DTYPES, LOSS_BOUND,
                                SECTIONS, SOLVE_BOUND, TRAINER_BOUND)


def fmt(x, spec=".3g"):
    return "—" if x is None else format(x, spec)


def rows_of(report, section, kind):
    return [r for r in report["sections"].get(section, {}).get("rows", []) if r["kind"] == kind]


def status_line(s):
    if s["status"] == "completed":
        return f"Completed in {s['seconds']:.0f} s (cap {s['cap_s']:g} s; {s.get('cpu_s', 0):.0f} CPU-seconds)."
    if s["status"] == "timed out":
        return (f"**Timed out after {s['cap_s']:g} s** (its cap): its process and all it started were killed; "
                "what follows is what it had written by then.")
    return f"**Failed** after {s['seconds']:.0f} s (cap {s['cap_s']:g} s): {s['reason']}"


def machine_lines(report):
    return [", ".join(f"{k} {v}" for k, v in r.items() if k != "kind") for r in rows_of(report, "machine", "machine")]


def floater_graph_lines(report):
    lines = []
    solve = rows_of(report, "floater_graph", "solve")
    if solve:
        lines += ["Solve of three flows (values and the gradients of θ and b(0); relative error, worst tensor):", "",
                  "| positions | values | gradients |", "|---:|---:|---:|"]
        lines += [f"| {r['positions']} | {fmt(r['values'])} | {fmt(r['gradients'])} |" for r in solve]
    trainer = rows_of(report, "floater_graph", "trainer")
    if trainer:
        lines += ["", "fairseq's Trainer, `floater_transformer_tiny`: the gradient the optimizer steps with, graph vs "
                  "loop (relative error, worst update):", "",
                  "| mode | update-freq | updates | buckets captured | gradient error |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['mode']} | {r['update_freq']} | {r['updates']} | {r['captured_buckets']} | "
                  f"{fmt(r['gradient_error'])} |" for r in trainer]
    steps = rows_of(report, "floater_graph", "order_step")
    memory = rows_of(report, "floater_graph", "order_memory")
    if steps:
        lines += ["", "Training steps (forward and backward, parameters held) at every length in both orders, "
                  "graph vs loop (relative error of the gradient of every parameter, of the loss; worst of the "
                  "capturing and the replaying step):", "",
                  "| order | T | bucket | gradient error | loss error |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['order']} | {r['length']} | {r['bucket']} | {fmt(r['gradient_error'])} | "
                  f"{fmt(r['loss_error'])} |" for r in steps]
    if memory:
        m0 = memory[0]
        lines += ["", f"Memory after those steps ({m0['dims']} dims, {m0['tokens']} tokens per batch): graph memory = "
                  f"{m0['graph_memory_measure']}; bound = {GRAPH_MEMORY_MARGIN:g} × the stage tape of the longest "
                  "bucket + every bucket's own output and input gradients (MiB):", "",
                  "| order | buckets captured | reserved, loop | reserved, graphs | peak, loop | peak, graphs | "
                  "held by graphs | graph memory | tape | bucket buffers | bound |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['order']} | {r['captured_buckets']} | {fmt(r['reserved_loop_mib'], '.0f')} | "
                  f"{fmt(r['reserved_graph_mib'], '.0f')} | {fmt(r['peak_loop_mib'], '.0f')} | "
                  f"{fmt(r['peak_graph_mib'], '.0f')} | {fmt(r['held_by_graphs_mib'], '.1f')} | "
                  f"{fmt(r['graph_memory_mib'], '.1f')} | {fmt(r['tape_mib'], '.1f')} | "
                  f"{fmt(r['bucket_buffers_mib'], '.1f')} | {fmt(r['bound_mib'], '.1f')} |" for r in memory]
    pooled = [r for r in memory if r.get("pools_graph")]  # CUDA only
    if pooled:
        lines += ["", "What each memory pool holds then (`torch.cuda.memory_snapshot()`, MiB; reserved − allocated "
                  "is what `empty_cache()` could not return):", "",
                  "| order | run | pool | segments | reserved | allocated | segment with the most free: size / "
                  "allocated |", "|---|---|---|---:|---:|---:|---:|"]
        lines += [f"| {r['order']} | {run} | {p['pool']} | {p['segments']} | {fmt(p['reserved_mib'], '.1f')} | "
                  f"{fmt(p['allocated_mib'], '.1f')} | {fmt(p['most_free_segment_mib'][0], '.1f')} / "
                  f"{fmt(p['most_free_segment_mib'][1], '.1f')} |"
                  for r in pooled for run, key in (("loop", "pools_loop"), ("graphs", "pools_graph"))
                  for p in r[key] or []]
    return lines


def precision_lines(report):
    plan = rows_of(report, "precision", "plan")
    rows = rows_of(report, "precision", "precision")
    if not plan:
        return []
    lines = [f"{plan[0]['updates']} updates, then beam 4 on the toy test set; {plan[0]['jobs']} jobs at a time.", "",
             "| arch | mode | ok | train loss | fp32 loss | BLEU | identical to fp32 | sentences | s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        same = r.get("identical_to_fp32")
        lines.append(f"| `{r['arch']}` | {r['mode']} | {'yes' if r['ok'] else 'no: ' + r['error']} | "
                     f"{fmt(r['train_loss'], '.3f')} | {fmt(r['fp32_loss'], '.3f')} | {fmt(r['bleu'], '.2f')} | "
                     f"{'—' if same is None else f'{same:.1%}'} | {r['sentences']} | "
                     f"{fmt(r.get('seconds'), '.0f')} |")
    return lines


def invariance_lines(report):
    rows = rows_of(report, "invariance", "invariance")
    lines = []
    if rows:
        lines += ["Largest |alone − batched| decoder logit: short sources left-padded beside a long batch-mate "
                  "(tooling/invariance.py), teacher-forced and over the incremental steps shown with a beam reorder; "
                  "sentences (of 3) whose beam-4 hypotheses differ alone.", "",
                  "| scheme | dtype | teacher-forced | incremental (steps) | beam differs |",
                  "|---|---|---:|---:|---:|"]
        lines += [f"| {r['scheme']} | {r['dtype']} | {fmt(r['teacher_forced'])} | {fmt(r['incremental'])} "
                  f"({r['steps']}) | {r['beam_differ']} |" for r in rows]
    replay = rows_of(report, "invariance", "replay")
    if replay:
        lines += ["", "One seed trained twice (dropout 0.1, the toy task):", "",
                  "| arch | deterministic algorithms | identical parameters | ms per update |", "|---|---|---|---:|"]
        lines += [f"| `{r['arch']}` | {'on' if r['deterministic'] else 'off'} | "
                  f"{r.get('error') or ('yes' if r['identical'] else 'no')} | {fmt(r['ms_per_update'], '.1f')} |"
                  for r in replay]
    return lines


def invariance_worst(rows):
    """{dtype: (bound, [(scheme, worst error)])}: each dtype's bound, the CPU's or twice the Transformer's."""
    out = {}
    for name in INVARIANCE_DTYPES:
        mine = [(r["scheme"], max(r["teacher_forced"], r["incremental"])) for r in rows if r["dtype"] == name]
        reference = [e for scheme, e in mine if scheme == "sinusoidal"]
        bound = max([INVARIANCE_BOUND[name]] + [2 * e for e in reference])
        out[name] = (bound, mine)
    return out


def bench_lines(report):
    bench = rows_of(report, "bench", "bench")
    lines = [f"`{b['command']}`: the full report is `{b['report']}`." for b in bench]
    ratios = rows_of(report, "bench", "ratio")
    if ratios:
        lines += ["", "| model | T | train | decode | peak memory | train ms | peak MiB | buckets captured |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['length']} | {fmt(r['train_ratio'], '.3f')} | "
                  f"{fmt(r['decode_ratio'], '.3f')} | "
                  f"{fmt(r['memory_ratio'], '.3f')} | {fmt(r['train_ms'], '.1f')} | {fmt(r['peak_mib'], '.0f')} | "
                  f"{fmt(r['graph_buckets'], 'd')} |" for r in ratios]
    regime = rows_of(report, "bench", "regime")
    if regime:  # bench.py --regime: the users' regime
        lines += ["", "The users' regime (newstest length mix, fairseq's Trainer; ratios: the Transformer's tokens/s "
                      "over the model's):", "",
                  "| model | dims | precision | max tokens | update-freq | train tokens/s | train | decode tokens/s | "
                  "decode | GFLOP per update | of bf16 matmul |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['dims']} | {r['precision']} | {r['max_tokens']} | {r.get('update_freq', 1)} | "
                  f"{fmt(r['tokens_per_s'], ',.0f')} | {fmt(r['train_ratio'], '.3f')} | "
                  f"{fmt(r['decode_tokens_per_s'], ',.0f')} | {fmt(r['decode_ratio'], '.3f')} | "
                  f"{fmt(r['gflop_per_update'], ',.1f')} | {fmt(r['matmul_fraction'], '.1%')} |" for r in regime]
    return lines


def users_path_lines(report):
    lines = []
    for c in rows_of(report, "users_path", "corpus"):
        lines += [f"Stand-in for `prepare_wmt14.sh en-de` (newstest2014's lengths, made-up words): {c['train']:,} "
                  f"training pairs, {c['valid']} valid, {c['test']} test, {c['dictionary']:,} dictionary entries, "
                  f"made in {c['seconds']:.0f} s. Its BLEU means nothing (a few updates on made-up words): the "
                  "section shows that the path runs, and how fast the cells train.", ""]
    steps = rows_of(report, "users_path", "step")
    if steps:
        lines += ["| scheme | step | exit | s | precision | max tokens × update freq | updates | tokens/s "
                  "(last epoch) | checkpoints | BLEU |", "|---|---|---:|---:|---|---|---:|---:|---|---:|"]
        for r in steps:
            batch = f"{r['max_tokens']} × {r['update_freq']}" if r.get("max_tokens") else "—"
            lines.append(f"| {r['scheme']} | `{r['step']}` | {r['rc']}{': ' + r['error'] if r.get('error') else ''} "
                         f"| {r['seconds']:.0f} | {r.get('precision') or '—'} | {batch} | "
                         f"{fmt(r.get('updates'), 'd')} | {fmt(r.get('tokens_per_s'), ',.0f')} | "
                         f"{r.get('checkpoints') or '—'} | {fmt(r.get('bleu'), '.2f')} |")
    for t in rows_of(report, "users_path", "tables"):
        lines += ["", f"`scripts/make_tables.py`: exit {t['rc']}{': ' + t['error'] if t.get('error') else ''}"
                  + ("; its rows with a result (all of it: `gpu_check_users_tables.md`):" if t["tables"] else ".")]
        for table in t["tables"]:
            lines += ["", f"{table['title']}:", "", table["header"],
                      "|" + "---|" * (table["header"].count("|") - 1), *table["rows"]]
    return lines


SECTION_LINES = {"machine": machine_lines, "floater_graph": floater_graph_lines, "precision": precision_lines,
                 "bench": bench_lines, "invariance": invariance_lines, "users_path": users_path_lines}


def markdown(report) -> str:
    if report["dry_run"]:
        lines = ["# GPU check — DRY RUN on CPU (no GPU: CUDA graphs emulated, no memory figures)", ""]
    else:
        lines = ["# GPU check", ""]
    caps = ", ".join(f"{SECTIONS[n][0]} {report['caps'][n]:g} s" for n in report["selected"])
    done = [n for n in report["selected"] if n in report["sections"]]
    lines += [f"Command: `{report['command']}`", "",
              f"Sections in order, each in its own process killed at its cap: {caps}. "
              f"{len(done)} of {len(report['selected'])} done; wall time so far {report['seconds'] / 60:.1f} min"
              + (f" (toy data: {report['data']})" if report.get("data") else "") + "."]
    if tuple(report["selected"]) == FIRST_CALL:
        lines += ["", "The speed section bench is a second call: `scripts/gpu/gpu_check.sh --sections bench "
                      "--out-dir DIR` (another folder, or it replaces this report)."]
    for name in report["selected"]:
        lines += ["", f"## {SECTIONS[name][0]}", ""]
        s = report["sections"].get(name)
        if s is None:
            lines.append("Not run yet.")
            continue
        lines.append(status_line(s))
        body = SECTION_LINES[name](report)
        if body:
            lines += [""] + body
    lines += ["", "## Verdict", "", "| check | bound | worst | passed |", "|---|---|---:|---|"]
    lines += [f"| {v['check']} | {v['bound']} | {fmt(v['worst'])} | {'yes' if v['passed'] else '**no**'} |"
              for v in report["verdicts"]]
    return "\n".join(lines) + "\n"


def verdicts(report):
    """One row per check of the sections run so far: its bound, the worst value measured, and whether it passed
    (the exit status). A section that failed or timed out is one failed row with its reason; its checks cover the
    rows it wrote before that (a completed section that lacks the rows a check needs fails that check)."""
    out = []

    def add(check, bound, values, passed):
        values = [v for v in values if v is not None]
        out.append({"check": check, "bound": bound, "worst": max(values) if values else None,
                    "passed": bool(passed)})

    sections = report["sections"]
    for name, s in sections.items():
        if s["status"] != "completed":
            add(f"{s['title']}: {s['reason']}", f"completes within {s['cap_s']:g} s", [], False)

    def completed(name):
        return sections.get(name, {}).get("status") == "completed"

    if "floater_graph" in sections:
        solve = [max(r["values"], r["gradients"]) for r in rows_of(report, "floater_graph", "solve")]
        if solve or completed("floater_graph"):
            add("solve: graph vs loop (values, gradients)", f"≤ {SOLVE_BOUND:g}", solve,
                solve and all(v <= SOLVE_BOUND for v in solve))
        for r in rows_of(report, "floater_graph", "trainer"):
            bound = TRAINER_BOUND[r["mode"]]
            add(f"Trainer {r['mode']}, --update-freq {r['update_freq']}: gradient, graph vs loop", f"≤ {bound:g}",
                [r["gradient_error"]], r["gradient_error"] is not None and r["gradient_error"] <= bound
                and r["captured_buckets"] > 0)
        for order in ("longest-first", "shortest-first"):
            steps = [r for r in rows_of(report, "floater_graph", "order_step") if r["order"] == order]
            memory = [r for r in rows_of(report, "floater_graph", "order_memory") if r["order"] == order]
            if steps or completed("floater_graph"):
                worst = [max(r["gradient_error"], r["loss_error"]) for r in steps]
                add(f"training steps {order}: gradient and loss, graph vs loop", f"≤ {SOLVE_BOUND:g}", worst,
                    steps and all(w <= SOLVE_BOUND for w in worst))
            if memory or completed("floater_graph"):
                ratios = [r["graph_memory_mib"] / r["bound_mib"] for r in memory]
                add(f"graph memory {order} / its bound (buckets captured > 0)", "≤ 1", ratios,
                    memory and all(x <= 1 for x in ratios) and all(r["captured_buckets"] > 0 for r in memory))
    if "precision" in sections:
        rows = [r for r in rows_of(report, "precision", "precision")
                if completed("precision") or r.get("error") != "did not finish"]
        drift = [abs(r["train_loss"] - r["fp32_loss"]) / r["fp32_loss"] for r in rows
                 if r["ok"] and r["train_loss"] is not None and r["fp32_loss"]]
        if rows or completed("precision"):
            add("every arch × precision trains and decodes; loss vs fp32 (relative)", f"≤ {LOSS_BOUND:g}", drift,
                rows and all(r["ok"] for r in rows) and all(d <= LOSS_BOUND for d in drift))
    if "invariance" in sections:
        rows = rows_of(report, "invariance", "invariance")
        for name, (bound, worst) in invariance_worst(rows).items():
            if worst or completed("invariance"):
                add(f"batch invariance {name}: every scheme alone vs batched", f"≤ {bound:.3g}",
                    [e for _, e in worst], worst and all(e <= bound for _, e in worst))
        replay = rows_of(report, "invariance", "replay")
        if replay or completed("invariance"):
            plain = [r for r in replay if not r["deterministic"]]
            add("one seed twice, the same parameters (default algorithms)", "identical", [],
                plain and all(r["identical"] for r in plain))
    if "users_path" in sections:
        steps = rows_of(report, "users_path", "step")
        tables = rows_of(report, "users_path", "tables")
        if steps or completed("users_path"):
            trained = [r for r in steps if r["step"] == "train.sh"]
            add("the users' path: train.sh (updates, tokens/s), evaluate.sh, make_tables.py exit 0 for every scheme",
                "exit 0", [], steps and all(r["rc"] == 0 for r in steps) and len(steps) == 2 * len(trained)
                and all(r.get("updates") and r.get("tokens_per_s") for r in trained)
                and tables and tables[0]["rc"] == 0 and tables[0]["tables"])
    if completed("bench"):
        graphed = [r for r in rows_of(report, "bench", "ratio") if r["model"] == "floater_graph"]
        add("benchmark ran; floater_graph captured at every length", "", [],
            rows_of(report, "bench", "bench") and graphed and all(r["graph_buckets"] for r in graphed))
    return out


def write_report(report, out_dir, stem="gpu_check"):
    """out_dir/stem.json and .md, each written atomically, with the wall time so far."""
    report["seconds"] = time.time() - report["started"]
    write_text(out_dir / f"{stem}.json", json.dumps({k: v for k, v in report.items() if k != "started"}, indent=1)
               + "\n")
    write_text(out_dir / f"{stem}.md", markdown(report))
