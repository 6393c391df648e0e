"""scripts/tooling/atomic.py, the scripts' one atomic write: a temporary name beside the target, the usual
permissions, a rename only when the write completed; nothing left behind and the target untouched on an error;
writers of one path never share a temporary name."""
import json
import os
import stat
import threading
from contextlib import contextmanager

import pytest

from tooling import atomic


@contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writes_text_bytes_json_and_callables(tmp_path):
    atomic.write_atomic(tmp_path / "a.txt", "héllo\n")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    atomic.write_atomic(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    atomic.write_json(tmp_path / "c.json", {"b": 1, "a": [2]}, indent=2, sort_keys=True)
    assert (tmp_path / "c.json").read_text() == json.dumps({"a": [2], "b": 1}, indent=2, sort_keys=True) + "\n"
    atomic.write_atomic(str(tmp_path / "d.txt"), lambda tmp: open(tmp, "w").write("by a writer"))
    assert (tmp_path / "d.txt").read_text() == "by a writer"
    with atomic.atomic_open(tmp_path / "e.txt", newline="\n") as f:
        f.writelines(["x\n", "y\n"])
    assert (tmp_path / "e.txt").read_text() == "x\ny\n"
    atomic.write_text(tmp_path / "new" / "dir" / "f.txt", "made")  # missing directories are created
    assert (tmp_path / "new" / "dir" / "f.txt").read_text() == "made"
    atomic.write_text(tmp_path / "a.txt", "replaced")
    assert (tmp_path / "a.txt").read_text() == "replaced"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.json", "d.txt", "e.txt", "new"]


@pytest.mark.parametrize("how", ["callable", "file object", "unserialisable json", "interrupt"])
def test_an_error_leaves_the_target_untouched_and_no_temporary_file(tmp_path, how):
    target = tmp_path / "out.txt"
    target.write_text("old\n")

    def fail(tmp):
        with open(tmp, "w") as f:
            f.write("partial")
        raise (KeyboardInterrupt if how == "interrupt" else RuntimeError)("killed")

    with pytest.raises((RuntimeError, KeyboardInterrupt, TypeError)):
        if how in ("callable", "interrupt"):
            atomic.write_atomic(target, fail)
        elif how == "file object":
            with atomic.atomic_open(target) as f:
                f.write("partial")
                raise RuntimeError("killed")
        else:
            atomic.write_json(target, {"x": object()})
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_failed_rename_leaves_no_temporary_file(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "inside").write_text("x")
    with pytest.raises(OSError):
        atomic.write_text(tmp_path / "taken", "a file where a directory is")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert (tmp_path / "taken" / "inside").read_text() == "x"


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_permissions_are_those_of_a_normal_new_file(tmp_path, mask):
    with umask(mask):
        with open(tmp_path / "plain", "w") as f:
            f.write("x")
        atomic.write_text(tmp_path / "text", "x")
        atomic.write_atomic(tmp_path / "written", lambda tmp: None)  # the writer leaves mkstemp's file as is
        with atomic.atomic_open(tmp_path / "opened", "wb") as f:
            f.write(b"x")
    assert mode(tmp_path / "plain") == 0o666 & ~mask
    for name in ("text", "written", "opened"):
        assert mode(tmp_path / name) == mode(tmp_path / "plain"), name
    assert mode(tmp_path / "text") == (0o644 if mask == 0o022 else 0o666 & ~mask)


def test_replacing_a_private_file_gives_the_usual_permissions(tmp_path):
    target = tmp_path / "t.json"
    target.write_text("{}\n")
    target.chmod(0o600)
    with umask(0o022):
        atomic.write_json(target, {})
    assert mode(target) == 0o644


def test_concurrent_writers_of_one_path_never_share_a_temporary_name(tmp_path):
    """Every writer holds its temporary file open until all have one (two study runs finishing together)."""
    target, n = tmp_path / "table.md", 8
    barrier, names, errors, lock = threading.Barrier(n, timeout=30), [], [], threading.Lock()

    def writer(i):
        def write(tmp):
            with lock:
                names.append(tmp)
            with open(tmp, "w") as f:
                f.write(f"writer {i}\n" * 1000)
            barrier.wait()  # every writer has its file written, none renamed yet
        try:
            atomic.write_atomic(target, write)
        except BaseException as err:  # a thread's exception would not fail the test by itself
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(names) == n and len(set(names)) == n
    assert all(os.path.dirname(name) == str(tmp_path) and os.path.basename(name).startswith(".table.md.")
               for name in names)
    lines = set(target.read_text().splitlines())
    assert len(lines) == 1 and lines.pop().startswith("writer ")  # one writer's whole file, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]


def test_save_figure_takes_the_format_from_the_target(tmp_path):
    class Figure:
        def savefig(self, path, **kwargs):
            self.kwargs = kwargs
            with open(path, "wb") as f:
                f.write(b"image")

    fig = Figure()
    atomic.save_figure(fig, tmp_path / "plot.PNG", dpi=80)
    assert fig.kwargs == {"format": "png", "dpi": 80}
    atomic.save_figure(fig, tmp_path / "plot.svg", format="pdf")
    assert fig.kwargs == {"format": "pdf"}
    assert (tmp_path / "plot.PNG").read_bytes() == b"image"
