#!/usr/bin/env python3
"""Where the suite's time goes: the per-file table of one run, from the JUnit XML pytest writes and, optionally, a
census of every Python process the tests started.

    PYTEST_ADDOPTS="--junitxml=run.xml" make test                       # CPU seconds per test (tier_clock's)
    PYTHONPATH=$PWD/tests/census PROCESS_CENSUS=$PWD/census.jsonl make test   # optional: a line per Python process
    python tests/suite_times.py run.xml [--census census.jsonl] [--top 15] > results/suite/times_COMMIT.md

CPU seconds are tier_clock's (the test's process and the children it waited for); wall seconds are pytest's. The
census counts each process started by a test, a script or a recipe (tests/census/sitecustomize.py, imported at
every interpreter start): its command and its own CPU seconds, so that a table can say how much of a file's time
is interpreter start-up (importing torch and fairseq) rather than work."""
import argparse
import collections
import json
import sys
import xml.etree.ElementTree as ET


def per_test(xml):
    """[(file, test, cpu s, wall s)] of a JUnit XML written by pytest with tests/helpers/tier_clock.py loaded."""
    rows = []
    for case in ET.parse(xml).iter("testcase"):
        cpu = next((float(p.get("value")) for p in case.iter("property") if p.get("name") == "cpu_seconds"), 0.0)
        module = case.get("classname", "").split(".")
        rows.append((f"{'/'.join(module[:2])}.py", case.get("name"), cpu, float(case.get("time", 0))))
    return rows


def command(argv):
    """A process's command as a table names it: the script or module, without paths and arguments."""
    argv = [a.rsplit("/", 1)[-1] for a in argv]
    return " ".join(argv[:2]) if argv and argv[0] in ("-m", "-c") else (argv[0] if argv else "?")


def census_table(path, top):
    by = collections.defaultdict(lambda: [0, 0, 0.0])
    for line in open(path, encoding="utf-8"):
        record = json.loads(line)
        row = by[command(record["argv"])]
        row[0] += 1
        row[1] += bool(record.get("fairseq"))
        row[2] += record["cpu"]
    n, fairseq, cpu = (sum(row[k] for row in by.values()) for k in range(3))
    lines = [f"{n:,} Python processes, {fairseq:,} of them importing fairseq (and torch), {cpu / 60:.1f} CPU minutes "
             "in all.", "", "| command | processes | importing fairseq | CPU s |", "|---|---|---|---|"]
    for name, (n, fairseq, cpu) in sorted(by.items(), key=lambda kv: -kv[1][2])[:top]:
        lines.append(f"| `{name}` | {n} | {fairseq} | {cpu:.0f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml")
    parser.add_argument("--census")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    rows = per_test(args.xml)
    files = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for file, _, cpu, wall in rows:
        files[file][0] += 1
        files[file][1] += cpu
        files[file][2] += wall
    out = [f"{len(rows):,} tests, {sum(r[2] for r in rows) / 60:.1f} CPU minutes, "
           f"{sum(r[3] for r in rows) / 60:.1f} minutes of test wall time summed over the workers.", "",
           "| file | tests | CPU s | wall s |", "|---|---|---|---|"]
    for file, (n, cpu, wall) in sorted(files.items(), key=lambda kv: -kv[1][1])[:args.top]:
        out.append(f"| `{file}` | {n} | {cpu:.0f} | {wall:.0f} |")
    out += ["", "| test | CPU s | wall s |", "|---|---|---|"]
    for file, test, cpu, wall in sorted(rows, key=lambda r: -r[2])[:args.top]:
        out.append(f"| `{file}::{test}` | {cpu:.0f} | {wall:.0f} |")
    if args.census:
        out += [""] + census_table(args.census, args.top)
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
