"""What a machine with one GPU must show before anything GPU-only becomes a default (results/gpu_check/gpu_check.md).

Made for a lease of 15 minutes of device time (machine start included, at most 10 minutes a command). The default
call runs the correctness sections machine, floater_graph and precision (caps 480 s; ≤ 9.7 minutes with the set-up and data/toy's
preparation, capped at 30 s); the speed section is a second call, ``--sections bench`` (≤ 3 minutes), batch
invariance another, ``--sections invariance``, and the users' path another, ``--sections users_path`` (≤ 4 minutes: with it the default
call would pass a command's 10 minutes). Each section runs in its own process (this script
with ``--section NAME``), killed with everything it started at its cap (``--cap NAME=SECONDS``):

``machine`` (20 s): GPU, driver, CUDA, torch, Python.
``floater_graph`` (100 s): FLOATER's CUDA-graph solve against its loop (tooling/gpu/graph.py).
``precision`` (360 s): every arch × --fp16 / --bf16 / --amp on the toy task against fp32.
``bench`` (180 s): scripts/bench/bench.py --device cuda, FLOATER with and without CUDA graphs.
(``fused``, FlexAttention against today's path, was removed with --attention-backend flex.)
``invariance`` (240 s): every scheme alone vs batched in fp32 and bf16; one seed trained twice.
``users_path`` (240 s): scripts/train.sh for WMT14 cells as they are (fp16, 4096 tokens × update-freq 8) on a
   stand-in corpus (newstest2014's lengths, made-up words), then evaluate.sh and make_tables.py: exit statuses,
   updates, tokens/s (tooling/gpu/users_path.py; its BLEU means nothing).

What each measures and its bounds: docs/benchmarks.md ("On a machine with one GPU"); the code: tooling/gpu/common.py
(caps, bounds), tooling/gpu/graph.py (floater_graph), tooling/gpu/sections.py (the others; a process each),
tooling/gpu/users_path.py (users_path), tooling/gpu/verdicts.py (report, verdicts), tooling/supervise.py (process groups). results/gpu_check/gpu_check.md and .json are written before the
first section and rewritten (atomically) the moment each section ends: a section that raises or exceeds its cap
records its reason beside the rows it had written, and the run goes on with the next. The exit status is 1 if any
section failed or any check is out of its bound (the verdict table). ``--sections machine,precision`` runs some of them (``all``:
every one); each call writes gpu_check.md in its ``--out-dir``, so a second call names another folder.

``--dry-run`` runs the same code on CPU at the smallest sizes (CUDA graphs through the CPU emulation in
tests/helpers/cuda_graph_emulation.py, which gpu_check.sh puts on PYTHONPATH), under caps for a small CPU machine
(``DRY_CAPS``), so that everything but the GPU itself is exercised; its report says so. The converged Multi30k
campaign on a GPU lease is scripts/gpu/campaign.sh.
"""

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling library
from tooling.gpu.common import (DATA_CAP, DRY_CAPS, FIRST_CALL, REPO, SECTIONS, CheckError, last_line, log,
                                model_names, relative)
from tooling.gpu.verdicts import status_line, verdicts, write_report
from tooling.gpu.sections import NEED_DATA, prepare_toy_data, run_section, section_main


def parse_caps(values):
    caps = {}
    for value in values:
        name, sep, seconds = value.partition("=")
        if not sep or name not in SECTIONS:
            raise CheckError(f"--cap {value}: expected NAME=SECONDS with NAME one of {', '.join(SECTIONS)}")
        try:
            caps[name] = float(seconds)
        except ValueError:
            caps[name] = -1.0
        if not caps[name] > 0:
            raise CheckError(f"--cap {value}: expected a positive number of seconds")
    return caps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="on CPU at the smallest sizes (CUDA graphs emulated)")
    p.add_argument("--out-dir", default=str(REPO / "results" / "gpu_check"), help="where gpu_check.md/.json go")
    p.add_argument("--data", help="a binarized toy task (default: data/toy, prepared if missing)")
    p.add_argument("--jobs", type=int, default=None,
                   help="precision runs at a time (default: one per CPU core on the GPU, 2 in a dry run)")
    p.add_argument("--sections", default=",".join(FIRST_CALL),
                   help=f"comma-separated, run in the order of {', '.join(SECTIONS)}, or all (default: "
                        f"{','.join(FIRST_CALL)}; the second call: bench)")
    p.add_argument("--cap", action="append", default=[], metavar="NAME=SECONDS",
                   help="a section's time cap (defaults: " + ", ".join(f"{n} {c}" for n, (_, c) in SECTIONS.items())
                        + "; --dry-run: " + ", ".join(f"{n} {c}" for n, c in DRY_CAPS.items()) + ")")
    p.add_argument("--models", default=None,
                   help="section precision's archs, as schemes of the table (space- or comma-separated; default: every one)")
    p.add_argument("--section", choices=tuple(SECTIONS), help=argparse.SUPPRESS)  # the child running one section
    p.add_argument("--rows-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # the report's command: what was asked, less where files are (no machine's paths in results)
    given, command_args = list(sys.argv[1:] if argv is None else argv), []
    while given:
        arg = given.pop(0)
        if arg in ("--out-dir", "--data"):
            given = given[1:]
        elif not arg.startswith(("--out-dir=", "--data=")):
            command_args.append(arg)
    args.command = " ".join(["scripts/gpu/gpu_check.sh", *map(shlex.quote, command_args)])
    if args.section:
        return section_main(args)
    try:
        args.caps = parse_caps(args.cap)
        selected = [s.strip() for s in args.sections.split(",") if s.strip()]
        selected = list(SECTIONS) if selected == ["all"] else selected
        unknown = [s for s in selected if s not in SECTIONS]
        if unknown or not selected:
            raise CheckError(f"--sections {args.sections}: expected some of {','.join(SECTIONS)}, or all")
        selected = [s for s in SECTIONS if s in selected]
        if args.jobs is not None and args.jobs < 1:
            raise CheckError(f"--jobs {args.jobs}: expected a positive number")
        model_names(args.models)
    except CheckError as e:
        print(f"scripts/gpu/gpu_check.sh: {e}", file=sys.stderr)
        return 2
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("scripts/gpu/gpu_check.sh: no CUDA device; use --dry-run to check the script on CPU", file=sys.stderr)
            return 2
    out_dir = args.out_dir = Path(args.out_dir)
    if args.data and not (Path(args.data) / "dict.src.txt").exists():
        print(f"scripts/gpu/gpu_check.sh: --data {args.data}: expected a binarized toy task (dict.src.txt)",
              file=sys.stderr)
        return 2
    caps = {n: args.caps.get(n, DRY_CAPS[n] if args.dry_run else cap) for n, (_, cap) in SECTIONS.items()}
    report = {"dry_run": args.dry_run, "started": time.time(), "selected": selected, "caps": caps,
              "command": args.command, "sections": {},
              "verdicts": []}
    write_report(report, out_dir, "gpu_check")  # the header first: every section "not run yet"
    data = Path(args.data) if args.data else None
    if data is None and set(NEED_DATA) & set(selected):
        started = time.monotonic()
        try:
            data = prepare_toy_data(REPO / "data" / "toy", DATA_CAP)
            report["data"] = f"{relative(data)}, ready in {time.monotonic() - started:.0f} s"
        except (CheckError, OSError) as e:  # the sections that need it fail with this reason
            report["data"] = f"not prepared: {last_line(str(e))}"
        log(f"toy data: {report['data']}")
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as work:
        for name in selected:
            log(f"== {SECTIONS[name][0]} (cap {caps[name]:g} s)")
            if data is None and name in NEED_DATA:
                s = {"title": SECTIONS[name][0], "cap_s": caps[name], "seconds": 0.0, "status": "failed",
                     "reason": f"toy data {report['data']}", "rows": []}
            else:
                s = run_section(name, args, caps[name], data, Path(work))
            report["sections"][name] = s
            report["verdicts"] = verdicts(report)
            write_report(report, out_dir, "gpu_check")
            log(f"== {SECTIONS[name][0]}: {status_line(s)} Written: {relative(out_dir / 'gpu_check.md')}")
    failed = [v["check"] for v in report["verdicts"] if not v["passed"]]
    if failed:  # the report is written either way; the status says whether anything GPU-only may become a default
        log("FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
