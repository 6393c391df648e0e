"""A campaign call's report (scripts/gpu/campaign.py): its runs packed into archives, and campaign.md."""
import os

from tooling.gpu import campaign_jobs as cp


def pack_runs(call):
    """The archives of the runs this call made (files older than the call were carried in: not packed)."""
    files = []
    for job in call.report["jobs"]:
        condition = job["job"].split(":")[0]
        sub = cp.CONDITIONS[condition][1]
        prefix = f"{sub}/" if sub else ""
        names = {r["run"] for r in call.report["runs"] if r["job"] == job["job"]}
        names.add(f"transformer.seed{job['job'].rsplit('.seed', 1)[1]}")  # a retraining's files, if any
        for name in sorted(names):
            for path, arc in cp.run_files(name, prefix, call.work / "out" / condition,
                                          call.work / "ckpt" / condition):
                if os.path.getmtime(path) >= call.started:  # made by this call, not carried in
                    files.append((path, arc))
    return cp.pack(sorted(set(files), key=lambda f: f[1]), call.out)


def plan_line(plan):
    if not plan:
        return "nothing"
    return (f"{plan['predicted_runs']} runs in {plan['predicted_jobs']} jobs, {plan['level']} side by side "
            f"{plan['table']} at {plan['per_run_updates_per_s']} updates/s each, {plan['jobs_left']} jobs left for "
            f"the next call")


def call_markdown(report):
    title = "# Campaign call" + (" — DRY RUN on CPU (tiny models, a few hundred sentences)" if report["dry_run"]
                                 else "")
    lines = [title, "", f"Code `{report['code']}` on {report['machine']}; wall {report.get('wall_s')} s of a budget of "
             f"{report['budget_s']} s (set-up {report['setup_s']} s, data {report.get('prepare_s')}).", "",
             f"Measured total training updates/s by runs side by side: {report['measured']}; with CUDA MPS: "
             f"{report.get('measured_mps')} (MPS {report.get('mps') or 'not asked for'}); chosen: "
             f"{report['concurrency']} ({report['why']}).", "",
             f"Planned: {plan_line(report.get('plan'))}; finished: "
             f"{sum(r['status'] == 'finished' for r in report['runs'])} runs.", "",
             "Wall s: from its job's start; eval s: its own time less its training (averaging, decoding, probe).", "",
             "| run | condition | status | BLEU tok-lc | sacreBLEU | updates | training s | eval s | wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["runs"]:
        if r["status"] == "finished":
            lines.append(f"| {r['run']} | {r['condition']} | finished | {r['bleu_tok_lc']:.2f} | {r['bleu']:.2f} | "
                         f"{r['updates']} | {r['train_seconds']} | {r['eval_s']} | {r['wall_s']} |")
        else:
            lines.append(f"| {r['run']} | {r['condition']} | {r['status']}: {r['reason'][:200]} | | | | | | |")
    lines += ["", f"Archives: {', '.join(report['archives']) or 'none'}."]
    return "\n".join(lines) + "\n"
