"""scripts/prepare_wmt14.sh on a miniature mirror of the WMT14 downloads (tests/helpers/wmt14_mirror.py): archives
-> cleaned text -> joint sentencepiece -> fairseq binarized data, for both pairs, offline; reruns skip what is
done; bad input stops with one line naming the file."""
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from conftest import SHARED_DATA, run
from helpers.wmt14_mirror import DROPPED, build_mirror, sgm, write_archive, write_checksums

import wmt14_data

VOCAB = "120"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("wmt14_mirror")
    expected = build_mirror(root / "archives")
    write_checksums(root / "archives", root / "sums.txt", unknown=("training-giga-fren.tar",))
    return root, expected


def prepare(pair, archives, out, sums, *extra, check=True):
    return run(["bash", "scripts/prepare_wmt14.sh", pair, "--from", str(archives), "--out", str(out),
                "--vocab", VOCAB, "--checksums", str(sums), *extra], check=check)


def lines(path):
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


@pytest.mark.parametrize("pair", ["en-de", "en-fr"])
def test_prepare_from_mirror(mirror, tmp_path, pair):
    root, expected = mirror
    tgt = pair[-2:]
    out = tmp_path / pair
    log = prepare(pair, root / "archives", out, root / "sums.txt").stdout
    for split in ("train", "valid", "test"):
        pairs = expected[split][pair]
        assert lines(out / "raw" / f"{split}.en") == [s for s, _ in pairs], split
        assert lines(out / "raw" / f"{split}.{tgt}") == [t for _, t in pairs], split
    n_dropped = len(DROPPED) * (3 if pair == "en-de" else 4)
    assert f"kept {len(expected['train'][pair])} of {len(expected['train'][pair]) + n_dropped} pairs" in log
    if pair == "en-fr":  # recorded as unknown in the checksum file: reported with its digest
        assert "training-giga-fren.tar: no checksum recorded" in log and "computed sha256" in log
    assert (out / "spm.model").is_file()
    for name in (f"dict.en.txt", f"dict.{tgt}.txt", f"train.en-{tgt}.en.bin", f"test.en-{tgt}.{tgt}.idx",
                 f"valid.en-{tgt}.en.bin"):
        assert (out / "bin" / name).is_file(), name

    # a rerun does nothing but report
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = prepare(pair, root / "archives", out, root / "sums.txt").stdout
    assert "kept" not in again and "segments" not in again and "sha256" not in again
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps


def test_interrupted_step_is_redone(mirror, tmp_path):
    """A step's marker is written after its files: without it (a run killed mid-step), a rerun redoes the step
    and overwrites whatever half-written state it finds."""
    root, expected = mirror
    out = tmp_path / "en-de"
    prepare("en-de", root / "archives", out, root / "sums.txt")
    (out / ".done" / "train").unlink()
    (out / "raw" / "train.de").write_text("half a file\n")
    log = prepare("en-de", root / "archives", out, root / "sums.txt").stdout
    assert "kept" in log
    assert lines(out / "raw" / "train.de") == [t for _, t in expected["train"]["en-de"]]


def test_download_with_resume(mirror, tmp_path):
    """Without --from the archives are fetched (here from a file:// mirror of statmt.org's layout), a partial
    download is resumed, and every archive is checked against the checksum file."""
    root, expected = mirror
    site = tmp_path / "site"
    where = {"training-parallel-europarl-v7.tgz": "wmt13", "training-parallel-commoncrawl.tgz": "wmt13",
             "training-parallel-nc-v9.tgz": "wmt14", "dev.tgz": "wmt14", "test-full.tgz": "wmt14"}
    for name, year in where.items():
        (site / year).mkdir(parents=True, exist_ok=True)
        shutil.copy(root / "archives" / name, site / year / name)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    full = (root / "archives" / "dev.tgz").read_bytes()
    (downloads / "dev.tgz.part").write_bytes(full[: len(full) // 2])  # an interrupted download
    run(["bash", "scripts/prepare_wmt14.sh", "en-de", "--download-dir", str(downloads), "--out", str(tmp_path / "out"),
         "--vocab", VOCAB, "--checksums", str(root / "sums.txt")], env_extra={"WMT14_URL_BASE": site.as_uri()})
    assert (downloads / "dev.tgz").read_bytes() == full and not (downloads / "dev.tgz.part").exists()
    assert lines(tmp_path / "out" / "raw" / "test.de") == [t for _, t in expected["test"]["en-de"]]


def copy_archives(root, dest, skip=()):
    dest.mkdir()
    for archive in (root / "archives").iterdir():
        if archive.name not in skip:
            shutil.copy(archive, dest / archive.name)
    return dest


def one_line_error(proc):
    assert proc.returncode == 1, proc.stdout[-2000:]
    errors = [line for line in proc.stdout.splitlines() if line.startswith("prepare_wmt14.sh:")]
    assert len(errors) == 1 and "Traceback" not in proc.stdout, proc.stdout[-2000:]
    return errors[0]


def test_missing_archive(mirror, tmp_path):
    root, _ = mirror
    archives = copy_archives(root, tmp_path / "archives", skip=("training-parallel-nc-v9.tgz",))
    proc = prepare("en-de", archives, tmp_path / "out", root / "sums.txt", check=False)
    error = one_line_error(proc)
    assert f"missing archive {archives}/training-parallel-nc-v9.tgz" in error
    assert "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz" in error


def test_misaligned_corpus(mirror, tmp_path):
    root, _ = mirror
    archives = copy_archives(root, tmp_path / "archives", skip=("training-parallel-commoncrawl.tgz",))
    with tarfile.open(root / "archives" / "training-parallel-commoncrawl.tgz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    members["commoncrawl.de-en.de"] += b"one line too many\n"
    write_archive(archives / "training-parallel-commoncrawl.tgz", members)
    write_checksums(archives, tmp_path / "sums.txt")
    out = tmp_path / "out"
    error = one_line_error(prepare("en-de", archives, out, tmp_path / "sums.txt", check=False))
    assert "commoncrawl.de-en.en has" in error and "commoncrawl.de-en.de has" in error and "line-aligned" in error
    assert not (out / "raw" / "train.en").exists() and not (out / ".done" / "train").exists()
    assert not list((out / "raw").glob(".*tmp"))  # no temporary file left behind either


def test_checksum_mismatch(mirror, tmp_path):
    root, _ = mirror
    sums = tmp_path / "sums.txt"
    kept = [line for line in (root / "sums.txt").read_text().splitlines() if not line.endswith(" dev.tgz")]
    sums.write_text("\n".join(kept) + f"\nsha256 {'0' * 64} dev.tgz\n")
    error = one_line_error(prepare("en-de", root / "archives", tmp_path / "out", sums, check=False))
    assert "dev.tgz: sha256" in error and "does not match the recorded 000" in error


def test_normalise_and_clean_rules():
    assert wmt14_data.normalise(" a\u200bb\u00a0 c\x00d \t") == "a b c d"
    assert wmt14_data.normalise("plain text") == "plain text"
    keep = wmt14_data.keep_pair
    assert keep(["a"] * 3, ["b"] * 4) and not keep(["a"] * 2, ["b"] * 4)  # ratio 1.5 is allowed, 2 is not
    assert keep(["a"] * 250, ["b"] * 250) and not keep(["a"] * 251, ["b"] * 250)
    assert not keep([], ["b"]) and not keep(["a" * 1001], ["b"])


@pytest.mark.skipif(not (SHARED_DATA / "wmt14" / "newstest2014.ende.de").is_file(),
                    reason="real newstest2014 text not available (../shared/data/wmt14)")
def test_sgm_extraction_reproduces_real_newstest2014(tmp_path):
    """The full newstest2014 references, written as WMT SGML, come back line for line as sacrebleu extracts
    them: stripped, whitespace runs collapsed by Python's \\s (which includes the no-break spaces of French
    typography; the copies in ../shared/data keep them, sacrebleu's wmt14/full references do not)."""
    for name in ("newstest2014.ende.de", "newstest2014.enfr.fr", "newstest2013.ende.en"):
        real = lines(SHARED_DATA / "wmt14" / name)
        sgm_file = tmp_path / f"{name}.sgm"
        sgm_file.write_text(sgm("refset", "newstest", "xx", real), encoding="utf-8")
        wmt14_data.sgm_to_text(sgm_file, tmp_path / name)
        assert lines(tmp_path / name) == [re.sub(r"\s+", " ", line.strip()) for line in real]
    assert len(lines(tmp_path / "newstest2014.ende.de")) == 3003
    assert lines(tmp_path / "newstest2014.ende.de") == lines(SHARED_DATA / "wmt14" / "newstest2014.ende.de")
