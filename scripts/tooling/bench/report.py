"""The benchmark's reports as markdown (tooling.bench.phases measures; scripts/bench/bench.py writes both)."""
import statistics


def ops_markdown(res):
    st = res["settings"]
    syncs = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"  # noqa: E731
    lines = [f"# Operators and host synchronisations ({st['dims']} dims, {st['device']})", "",
             f"Command: `{res['command']}`  ", f"Machine: {res['machine'].get('cpu', '')}, torch "
             f"{res['machine']['torch']}, {st['threads']} thread(s); commit {res['source']['commit']}", "",
             "Counted through a TorchDispatchMode: every aten operator that is not a view (one kernel launch on a "
             "GPU), and the operators that read a device value on the host (`_local_scalar_dense` = .item()/bool()/"
             "tolist(), `equal`, `is_nonzero`, `nonzero`).", "",
             "## One training update (forward, label-smoothed cross-entropy, backward, Adam)", "",
             "| model | T | sentences | operators | × transformer | host syncs |", "|---|---|---|---|---|---|"]
    base = {r["length"]: r["ops"] for r in res["updates"] if r["model"] == "transformer"}
    for r in res["updates"]:
        lines.append(f"| {r['model']} | {r['length']} | {r['batch_sentences']} | {r['ops']:,} | "
                     f"{r['ops'] / base[r['length']]:.2f}× | {syncs(r['syncs'])} |")
    lines += ["", "## FLOATER's exact solve of its three flows (RK4 at Δ/5, P = T) and its backward", "",
              "| T | rows per flow | RK4 steps | forward operators (per step) | backward operators (per step) | "
              "host syncs forward / backward | seconds forward / backward |", "|---|---|---|---|---|---|---|"]
    for r in res["solves"]:
        lines.append(f"| {r['length']} | {'/'.join(map(str, r['rows']))} | {r['steps']:,} | {r['forward_ops']:,} "
                     f"({r['forward_ops_per_step']:.1f}) | {r['backward_ops']:,} ({r['backward_ops_per_step']:.1f}) | "
                     f"{syncs(r['forward_syncs'])} / {syncs(r['backward_syncs'])} | "
                     f"{r['forward_s']:.2f} / {r['backward_s']:.2f} |")
    lines += ["", "Seconds: the better of two solves, CPU time on CPU (one thread unless --threads), wall time on CUDA.",
              "", "The solve's one host sync, if any, is the finiteness check after it (solve_checked, in the "
              "training update); the solve itself (solve_flows) has none."]
    return "\n".join(lines) + "\n"



def fmt(x, unit_scale=1.0, digits=1):
    return "—" if x is None else f"{x * unit_scale:.{digits}f}"


def ratio(x):
    return "—" if x is None else f"{x:.3f}×"


def markdown(res):
    s, m = res["settings"], res["machine"]
    cached = f"floater_every{s['floater_every']}"
    other = "wall" if s["clock"] == "cpu" else "cpu"
    lines = [
        "# Cost of each position scheme, as ratios to fairseq's Transformer",
        "",
        *([f"**PARTIAL**: {res['partial']} (the run was written before it ended).", ""] if res.get("partial") else []),
        f"Command: `{res['command']}`",
        "",
        f"Code: commit `{(res['source']['commit'] or '?')[:12]}`"
        + (f" with uncommitted changes to {', '.join(f'`{f}`' for f in res['source']['uncommitted_plugin_files'])}"
           if res["source"]["uncommitted_plugin_files"] else "") + ".",
        "",
        f"Machine: {m.get('gpu', m.get('cpu', '?'))}; {m['cores']} CPU cores, {m['threads']} torch threads, "
        f"torch {m['torch']}, Python {m['python']}, device `{s['device']}`. Load average (1 min) during the run: "
        + _load_summary(res["load_average"]) + f"; wall time {res['wall_s'] / 60:.1f} min.",
        "",
        f"Models ({s['dims']} dims, vocabulary {s['vocab']}, shared embeddings, fairseq's Adam, label-smoothed CE): "
        + "; ".join(f"`{r['model']}` = `--arch {r['arch']}{' ' + ' '.join(r['flags']) if r['flags'] else ''}`"
                    for r in res["rows"] if r["length"] == res["rows"][0]["length"]) + ".",
        "",
        f"Training: {s['tokens']} tokens per batch (B = {s['tokens']} // T sentences of T source and T target "
        f"tokens), {s['warmup']} warm-up updates, then {s['reps']} timed updates of each model (per length), "
        "round-robin; medians. "
        f"`{cached}` is the amortised update ((N − 1)·cached + exact) / N with N = {s['floater_every']}. "
        f"Decoding: beam 4, min_len = max_len = T, {s['decode_tokens']} // T sentences per call, "
        f"{s['decode_reps']} timed calls of each model after one warm-up, round-robin; milliseconds per sentence. "
        f"Peak memory: {res['memory_method']}.",
        "",
        f"Times are medians of {'process CPU time' if s['clock'] == 'cpu' else 'wall time'} (the ratios use them); "
        f"the {'wall' if s['clock'] == 'cpu' else 'CPU'}-time medians are listed beside them.",
        "",
        f"| model | T | B | train update | train ms | train ms ({other}) | decode | decode ms/sent | "
        f"decode ms/sent ({other}) | peak memory | peak MiB | ODE share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['model']} | {r['length']} | {r['batch_sentences']} | {ratio(r.get('train_ratio'))} | "
            f"{fmt(r.get('train_update_median_s'), 1e3)} | {fmt(r.get(f'train_update_{other}_median_s'), 1e3)} | "
            f"{ratio(r.get('decode_ratio'))} | {fmt(r.get('decode_per_sentence_median_s'), 1e3)} | "
            f"{fmt(r.get(f'decode_per_sentence_{other}_median_s'), 1e3)} | {ratio(r.get('memory_ratio'))} | "
            f"{fmt(r.get('peak_memory_mib'), 1.0, 0)} | "
            f"{'—' if r.get('ode_share') is None else format(100 * r['ode_share'], '.0f') + '%'} |")
    failed = [f"- `{r['model']}` at T = {r['length']} failed: {r['error']}" for r in res["rows"] if "error" in r]
    if failed:  # after a blank line: a line right below a table would be read as one more of its rows
        lines += ["", *failed]
    compiled = [r for r in res["rows"] if r.get("compiled_graphs_warmup") or r.get("compiled_graphs_timed")]
    if compiled:
        lines += ["", "Graphs compiled by torch.compile (dynamo's unique graphs) in the warm-up / the timed updates "
                      "(any in the timed updates are recompiles, timed with them): "
                  + "; ".join(f"`{r['model']}` T = {r['length']}: {r.get('compiled_graphs_warmup', 0)} / "
                              f"{r.get('compiled_graphs_timed', 0)}" for r in compiled) + "."]
    graphed = [r for r in res["rows"] if "graph_buckets" in r]
    if graphed:
        lines += ["", f"`{graphed[0]['model']}`: FLOATER's training solves replayed from CUDA graphs "
                      "(`--floater-cuda-graph`), captured anew at each length (buckets captured: "
                  + ", ".join(f"T = {r['length']}: {r['graph_buckets']}" for r in graphed)
                  + "); not decoded, being the same model as `floater` at inference."]
    lines += ["", "Goals (ratio to the Transformer at the same length):", "",
              "| model | measure | T | bound | measured | met |", "|---|---|---:|---:|---:|---|"]
    for g in res["goals"]:
        lines.append(f"| {g['model']} | {g['measure']} | {g['length']} | ≤ {g['bound']:.2f}× | "
                     f"{g['value']:.3f}× | {'yes' if g['met'] else 'no'} |")
    profiles = res["profiles"]
    if "length" in profiles:
        lines += ["", f"Profiles: torch.profiler, one training update at T = {profiles['length']}, "
                      "top operators by self time:", ""]
        lines += _profile_lines({n: p for n, p in profiles.items() if n in {r["model"] for r in res["rows"]}})
    if "decode" in profiles:
        lines += ["", f"Profiles: one decoding call at T = {profiles['decode_length']} "
                      f"({profiles['decode_sentences']} sentences, beam 4), top operators by self time; "
                      "the self time of a labelled range is the Python between its operators:", ""]
        lines += _profile_lines(profiles["decode"])
    if res.get("notes"):
        lines += ["", res["notes"].strip()]
    return "\n".join(lines) + "\n"


def _profile_lines(profiles):
    lines = []
    for name, p in profiles.items():
        ops = ", ".join(f"{o['op']} {100 * o['share']:.0f}% ({o['self_ms']:.0f} ms, {o['calls']} calls)"
                        for o in p["top"][:8])
        extra = "".join(f"; range `{k}` {v:.0f} ms" for k, v in p["ranges_self_ms"].items())
        lines.append(f"- `{name}` ({p['total_self_ms']:.0f} ms{extra}): {ops}")
    return lines


def _load_summary(load):
    samples = [x[0] for x in load["samples"]]
    if not samples:
        return "unknown"
    return f"median {statistics.median(samples):.2f} (min {min(samples):.2f}, max {max(samples):.2f})"


def regime_markdown(res):
    """scripts/bench/bench.py --regime's report: per (dims, precision, max tokens) tokens/s, ratios and FLOPs."""
    s, m, mix, rate = res["settings"], res["machine"], res["length_mix"], res["matmul_bf16"]
    cuda = s["device"] == "cuda"
    lines = [
        "# The users' regime: tokens per second of each position scheme, and ratios to fairseq's Transformer", "",
        *([f"**PARTIAL**: {res['partial']} (the run was written before it ended).", ""] if res.get("partial") else []),
        f"Command: `{res['command']}`", "",
        f"Code: commit `{(res['source']['commit'] or '?')[:12]}`"
        + (f" with uncommitted changes to {', '.join(f'`{f}`' for f in res['source']['uncommitted_plugin_files'])}"
           if res["source"]["uncommitted_plugin_files"] else "") + ".", "",
        f"Machine: {m.get('gpu', m.get('cpu', '?'))}; {m['cores']} CPU cores, {m['threads']} torch threads, torch "
        f"{m['torch']}, device `{s['device']}`" + (f"; wall time {res['wall_s'] / 60:.1f} min" if "wall_s" in res
                                                 else "") + ".", "",
        f"Batches: sentence pairs drawn (seed {s['seed']}) from `{mix['file']}` ({mix['pairs']} pairs, mean "
        f"{mix['mean_source']:.1f} source and {mix['mean_target']:.1f} target tokens + EOS), batched by fairseq's "
        "`batch_by_size` under --max-tokens (padding included); every model gets the same batches. Training: "
        f"fairseq's Trainer, the WMT14 recipe's optimizer and schedule, {s['warmup']} untimed then {s['updates']} "
        f"timed updates of each model, round-robin, {s.get('update_freq', 1)} batch(es) per update (--update-freq). "
        "tokens/s: target tokens (fairseq's wps) per second of "
        f"{'wall' if s['clock'] == 'wall' else 'process CPU'} time, one device. Decoding: beam 4, "
        f"{s['decode_batches']} batch(es) of ≤ {s['decode_max_tokens']} source tokens, each sentence made to produce "
        "its batch's mean target length. Ratios: the Transformer's tokens/s over the model's (1.10× = 10% slower). "
        "FLOPs: the Transformer's analytic count per update on the padded batches (tooling.bench.regime."
        f"transformer_flops); the device's bf16 matmul rate, measured in this run: {rate['flops_per_s'] / 1e12:.3g} "
        f"TFLOP/s (n = {rate['n']})" + ("" if cuda else "; on CPU its fraction is not shown (a CPU's bf16 product "
                                        "can be slower than its float32 one)") + ".", "",
        "| dims | precision | max tokens | model | train tokens/s | train × Transformer | decode tokens/s | "
        "decode × Transformer | GFLOP per update | TFLOP/s | of bf16 matmul |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['dims']} | {r['precision']} | {r['max_tokens']:,} | {r['model']} | {r['tokens_per_s']:,.0f} | "
            f"{ratio(r.get('train_ratio'))} | "
            f"{'—' if r.get('decode_tokens_per_s') is None else format(r['decode_tokens_per_s'], ',.0f')} | "
            f"{ratio(r.get('decode_ratio'))} | {r['flops'] / r['updates'] / 1e9:,.1f} | "
            f"{r['flops_per_s'] / 1e12:.3g} | {format(100 * r['matmul_fraction'], '.1f') + '%' if cuda else '—'} |")
    if res.get("profiles"):
        lines += ["", f"Profiles: one more update of each model ({res['profiles']['group']}), torch.profiler's top "
                      "operators by self time:", ""]
        lines += _profile_lines(res["profiles"]["models"])
    lines += ["", "Batches timed per group (sentences; padded source × target shapes), and the padding's share:", ""]
    for b in res["batches"]:
        lines.append(f"- {b['dims']} {b['precision']} {b['max_tokens']:,}: sentences {b['sentences']}, padding "
                     f"{100 * b['padding_share']:.0f}%" + (f", {b['left_out']} pair(s) longer than the batch left out"
                                                          if b["left_out"] else ""))
    return "\n".join(lines) + "\n"
