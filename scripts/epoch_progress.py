#!/usr/bin/env python3
"""A fairseq-train log on stdin: appended to LOG as it comes, and one line per finished epoch on stdout.

    fairseq-train ... 2>&1 | scripts/epoch_progress.py LOG [--prefix TEXT]

Each line: ``epoch E: valid loss L, N updates, S s`` (S: seconds since this filter started), from fairseq's
``valid on 'valid' subset`` line. A long training is then visibly alive and its figure visible while it runs; the
full log stays in LOG.
"""
import argparse
import re
import sys
import time

VALID = re.compile(r"epoch (\d+) \| valid on 'valid' subset \| loss ([0-9.]+).*?\| num_updates (\d+)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the file the whole log is appended to")
    parser.add_argument("--prefix", default="", help="text before each progress line")
    args = parser.parse_args()
    start = time.monotonic()
    with open(args.log, "a") as log:
        for line in sys.stdin:
            log.write(line)
            log.flush()
            m = VALID.search(line)
            if m:
                epoch, loss, updates = m.groups()
                print(f"{args.prefix}epoch {int(epoch)}: valid loss {loss}, {updates} updates, "
                      f"{time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
