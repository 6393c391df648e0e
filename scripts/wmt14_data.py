#!/usr/bin/env python3
"""The text steps of scripts/prepare_wmt14.sh: checksum, extract, SGML to text, normalise + clean.

    wmt14_data.py verify ARCHIVE --checksums FILE
    wmt14_data.py extract ARCHIVE OUT_DIR MEMBER [MEMBER ...]
    wmt14_data.py sgm SGM_FILE OUT_FILE
    wmt14_data.py clean --pair SRC_FILE TGT_FILE [--pair ...] --out-prefix PREFIX --src en --tgt de
    wmt14_data.py aligned FILE_A FILE_B

Every output is written to a temporary name in its directory and renamed when complete, so a killed run
never leaves a file that looks finished. Errors are one line on stderr naming the file and what was
expected, with exit status 1.

Normalisation (train only; fairseq's prepare-wmt14en2de.sh runs Moses' remove-non-printing-char.perl and
normalize-punctuation.perl, which need Perl and Moses): every Unicode "other" character (category C*:
controls, format characters such as soft hyphens and zero-width spaces, private use, unassigned) becomes a
space, as remove-non-printing-char.perl does (s/\\p{C}/ /g); then runs of whitespace (str.isspace, which
includes no-break spaces) collapse to one space and the line is stripped. Nothing else changes: no
punctuation rewriting, no tokenisation (sentencepiece works on the raw text).

Cleaning (Moses' clean-corpus-n.perl with fairseq's settings, -ratio 1.5, 1..250): a pair is dropped if
either side has fewer than 1 or more than 250 tokens, if one side has more than 1.5 times the tokens of the
other, or if a token is longer than 1000 characters (clean-corpus-n's default max word length). Tokens are
the space-separated words of the normalised line; fairseq's recipe counts BPE tokens of Moses-tokenised text,
so our limits are slightly looser.

SGML (the dev/test sets): the text of each `<seg ...>...</seg>` line, stripped, with internal whitespace
collapsed, exactly as sacrebleu extracts WMT test sets (no entity unescaping: the WMT files hold raw text),
so raw/test.<lang> equals sacrebleu's wmt14/full reference.
"""
import argparse
import gzip
import hashlib
import re
import sys
import tarfile
import unicodedata
from pathlib import Path

from tooling.atomic import atomic_open

MAX_TOKENS, MIN_TOKENS, RATIO, MAX_WORD_CHARS = 250, 1, 1.5, 1000


class PrepError(Exception):
    """One line: what is wrong with which file."""


# --- checksums -------------------------------------------------------------------------------------------

def read_checksums(path):
    """{archive name: (algorithm, hex digest or None)} from lines 'ALGO HEX NAME  # comment' ('-' = unknown)."""
    table = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            algo, digest, name = line.split()
            table[name] = (None, None) if algo == "-" else (algo, digest.lower())
    return table


def file_digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(archive, checksums):
    """Checks `archive` against the recorded digest; an unrecorded one is reported with its sha256."""
    archive = Path(archive)
    algo, expected = read_checksums(checksums).get(archive.name, (None, None))
    if expected is None:
        print(f"{archive.name}: no checksum recorded in {checksums}; computed sha256 "
              f"{file_digest(archive, 'sha256')} (record it as: sha256 <that> {archive.name})")
        return
    actual = file_digest(archive, algo)
    if actual != expected:
        raise PrepError(f"{archive}: {algo} {actual} does not match the recorded {expected} ({checksums}); "
                        "a corrupt or partial download? delete it and rerun")
    print(f"{archive.name}: {algo} ok")


# --- archives --------------------------------------------------------------------------------------------

def extract(archive, out_dir, members):
    """Extracts the named members (paths inside the archive) in one pass, each to OUT_DIR/<member path>;
    a member ending in .gz is decompressed (its output drops the .gz)."""
    archive, out_dir = Path(archive), Path(out_dir)
    wanted = {m[2:] if m.startswith("./") else m for m in members}
    found = set()
    try:
        with tarfile.open(archive, "r:*") as tar:
            for info in tar:
                name = info.name[2:] if info.name.startswith("./") else info.name
                if name not in wanted or not info.isfile():
                    continue
                src = tar.extractfile(info)
                if name.endswith(".gz"):
                    src, dest = gzip.GzipFile(fileobj=src), out_dir / name[:-3]
                else:
                    dest = out_dir / name
                with atomic_open(dest, "wb") as f:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        f.write(block)
                found.add(name)
    except (tarfile.TarError, OSError, EOFError) as err:
        raise PrepError(f"{archive}: not a readable tar archive ({type(err).__name__}: {err})")
    missing = sorted(wanted - found)
    if missing:
        raise PrepError(f"{archive}: has no member {missing[0]} (expected the WMT14 archive layout)")


# --- text ------------------------------------------------------------------------------------------------

_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")


def sgm_to_text(sgm, out):
    n = 0
    with open(sgm, encoding="utf-8") as f, atomic_open(out, newline="\n") as g:
        for line in f:
            if line.startswith("<seg "):
                g.write(" ".join(_SEG.sub(r"\1", line).split()) + "\n")
                n += 1
    if n == 0:
        raise PrepError(f"{sgm}: no <seg ...>...</seg> lines (expected a WMT SGML file)")
    print(f"{out}: {n} segments from {Path(sgm).name}")


def normalise(line):
    """Non-printing characters (Unicode C*) to spaces, whitespace runs to one space, stripped."""
    if not line.isprintable():
        line = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in line)
    return " ".join(line.split())


def keep_pair(src_tokens, tgt_tokens):
    """clean-corpus-n.perl -ratio 1.5 ... 1 250 on token lists."""
    ns, nt = len(src_tokens), len(tgt_tokens)
    if not (MIN_TOKENS <= ns <= MAX_TOKENS and MIN_TOKENS <= nt <= MAX_TOKENS):
        return False
    if ns / nt > RATIO or nt / ns > RATIO:
        return False
    return all(len(w) <= MAX_WORD_CHARS for w in src_tokens) and all(len(w) <= MAX_WORD_CHARS for w in tgt_tokens)


def read_pairs(src_file, tgt_file):
    """Line pairs of two line-aligned files; a PrepError naming both if one has more lines."""
    with open(src_file, encoding="utf-8", errors="replace", newline="\n") as fs, \
            open(tgt_file, encoding="utf-8", errors="replace", newline="\n") as ft:
        n = 0
        for n, (s, t) in enumerate(zip(fs, ft), 1):
            yield s, t
        rest_s, rest_t = sum(1 for _ in fs), sum(1 for _ in ft)
    if rest_s or rest_t:
        raise PrepError(f"{src_file} has {n + rest_s} lines but {tgt_file} has {n + rest_t} "
                        "(a corpus must be line-aligned)")


def clean(pairs, out_prefix, src, tgt):
    kept = total = 0
    with atomic_open(f"{out_prefix}.{src}", newline="\n") as fs, \
            atomic_open(f"{out_prefix}.{tgt}", newline="\n") as ft:
        for src_file, tgt_file in pairs:
            for s, t in read_pairs(src_file, tgt_file):
                total += 1
                s, t = normalise(s), normalise(t)
                if keep_pair(s.split(" ") if s else [], t.split(" ") if t else []):
                    fs.write(s + "\n")
                    ft.write(t + "\n")
                    kept += 1
    print(f"{out_prefix}.{{{src},{tgt}}}: kept {kept} of {total} pairs")


def aligned(a, b):
    na, nb = (sum(1 for _ in open(p, "rb")) for p in (a, b))
    if na != nb:
        raise PrepError(f"{a} has {na} lines but {b} has {nb} (must be line-aligned)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("verify")
    p.add_argument("archive")
    p.add_argument("--checksums", required=True)
    p = sub.add_parser("extract")
    p.add_argument("archive")
    p.add_argument("out_dir")
    p.add_argument("members", nargs="+")
    p = sub.add_parser("sgm")
    p.add_argument("sgm")
    p.add_argument("out")
    p = sub.add_parser("clean")
    p.add_argument("--pair", nargs=2, action="append", required=True, metavar=("SRC_FILE", "TGT_FILE"))
    p.add_argument("--out-prefix", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p = sub.add_parser("aligned")
    p.add_argument("a")
    p.add_argument("b")
    args = ap.parse_args()
    try:
        if args.cmd == "verify":
            verify(args.archive, args.checksums)
        elif args.cmd == "extract":
            extract(args.archive, args.out_dir, args.members)
        elif args.cmd == "sgm":
            sgm_to_text(args.sgm, args.out)
        elif args.cmd == "clean":
            clean(args.pair, args.out_prefix, args.src, args.tgt)
        else:
            aligned(args.a, args.b)
    except PrepError as err:
        sys.exit(f"prepare_wmt14.sh: {err}")
    except FileNotFoundError as err:
        sys.exit(f"prepare_wmt14.sh: {err.filename}: no such file")


if __name__ == "__main__":
    main()
