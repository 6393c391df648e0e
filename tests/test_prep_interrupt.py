"""Data preparation killed mid-step: scripts/prepare_bitext.sh SIGKILLed during sentencepiece training, during
the sentencepiece encoding of a split and during fairseq-preprocess, each time rerun with the same command; the
final run's outputs equal, file for file and byte for byte, those of a clean, uninterrupted run with the same
paths (sentencepiece models record their input paths and model prefix)."""
import hashlib
import re
import shutil

from helpers.small_task import VOCAB, kill_group, run1, small_raw, start, wait_for

# fairseq-preprocess's console log (OUT/preprocess.log) carries wall-clock timestamps; they are dropped before
# comparing. Everything else must be byte-identical.
TIMESTAMP = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| ", re.M)


def snapshot(out):
    """{path relative to out: sha256} for every file and (as None) every directory under out."""
    tree = {}
    for path in sorted(out.rglob("*")):
        rel = str(path.relative_to(out))
        if path.is_dir():
            tree[rel] = None
        else:
            data = path.read_bytes()
            if rel == "preprocess.log":
                data = TIMESTAMP.sub(b"", data)
            tree[rel] = hashlib.sha256(data).hexdigest()
    return tree


def test_killed_prepare_reruns_to_the_clean_result(tmp_path):
    raw = small_raw(tmp_path / "raw")
    out = tmp_path / "out"
    cmd = ["bash", "scripts/prepare_bitext.sh", str(raw), str(out), "src", "tgt", VOCAB, "test_long"]
    run1(cmd)
    clean = snapshot(out)
    assert "bin/.done" in clean and "bin/test_long.src-tgt.src.bin" in clean and "spm.model" in clean
    shutil.rmtree(out)

    steps = [  # (what is running, how to see it, what must not exist yet)
        ("sentencepiece training", lambda: (out / "spm").is_dir(), "spm.model"),
        ("sentencepiece encoding", lambda: any((out / "spm").glob("*.tmp")), "spm/test_long.tgt"),
        ("fairseq-preprocess", lambda: (out / "bin.tmp").is_dir(), "bin"),
    ]
    for i, (what, running, not_yet) in enumerate(steps):
        proc = start(cmd, tmp_path / f"kill{i}.log")
        wait_for(running, proc, timeout=120, what=what)
        kill_group(proc)
        assert proc.returncode == -9
        assert not (out / not_yet).exists(), f"the run got past {what} before the kill"

    log = run1(cmd).stdout
    assert "binarized data in" in log
    assert snapshot(out) == clean
