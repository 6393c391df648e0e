"""Atomic file writes: the one place the scripts write a file under a temporary name and rename it into place.

    write_atomic(path, "text")                       # str: UTF-8 text; bytes: as they are
    write_atomic(path, lambda tmp: torch.save(obj, tmp))   # a callable writes the temporary file itself
    write_text(path, text) / write_json(path, obj, indent=2) / save_torch(obj, path) / save_figure(fig, path)
    with atomic_open(path) as f: ...                 # a file object (streams, many writes)

Every form:
- writes to a new name from ``tempfile.mkstemp`` in the target's directory (created if missing): the rename
  stays on one file system, and two writers of one path (runs finishing together) never share a temporary name;
- gives the file the usual permissions of a new file, 0o666 & ~umask (mkstemp makes it private);
- renames it onto the target only when the write completed; on any error (an exception, Ctrl-C) the temporary
  file is removed and the target is left as it was.
"""
import contextlib
import json
import os
import tempfile

__all__ = ["atomic_open", "atomic_path", "save_figure", "save_torch", "write_atomic", "write_json", "write_text"]


def _umask():
    """The process umask, read without changing it where Linux tells it (os.umask can only set it: setting and
    restoring it would briefly give a file made by another thread the wrong permissions)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path, suffix=".tmp"):
    """Yields a new, empty temporary file name beside `path`; when the block completes, the file gets the usual
    permissions and is renamed to `path`; when it raises, the file is removed and `path` is untouched."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path, mode="w", encoding="utf-8", newline=None, suffix=".tmp"):
    """A file object open on a temporary name beside `path` ("w" text, UTF-8, or "wb"); renamed to `path` when
    the block completes, removed when it raises."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a new file: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path, suffix) as tmp:
        with open(tmp, mode, **({} if mode == "wb" else {"encoding": encoding, "newline": newline})) as f:
            yield f


def write_atomic(path, data, mode=None, suffix=".tmp"):
    """Writes `data` to `path` atomically and returns `path`. `data`: str (text, UTF-8), bytes, or a callable
    that writes the temporary file given its name (torch.save, savefig, shutil.copyfile). `mode` ("w" or "wb")
    may say which a str or bytes is meant as; `suffix` ends the temporary name (a writer that picks a format
    from the name may need the target's)."""
    if callable(data):
        with atomic_path(path, suffix) as tmp:
            data(tmp)
        return path
    if mode is None:
        mode = "wb" if isinstance(data, (bytes, bytearray, memoryview)) else "w"
    with atomic_open(path, mode, suffix=suffix) as f:
        f.write(data)
    return path


def write_text(path, text, newline=None):
    """UTF-8 text to `path` atomically (newline: as open(); None writes os.linesep for "\\n")."""
    with atomic_open(path, "w", newline=newline) as f:
        f.write(text)
    return path


def write_json(path, obj, **dumps):
    """json.dumps(obj, **dumps) and a final newline to `path` atomically."""
    return write_text(path, json.dumps(obj, **dumps) + "\n")


def save_torch(obj, path):
    """torch.save(obj) to `path` atomically."""
    import torch

    return write_atomic(path, lambda tmp: torch.save(obj, tmp))


def save_figure(fig, path, **savefig):
    """fig.savefig to `path` atomically; the format is the target's extension unless `format` is given (the
    temporary name's is not an image format)."""
    savefig.setdefault("format", os.path.splitext(os.fspath(path))[1].lstrip(".").lower() or "png")
    return write_atomic(path, lambda tmp: fig.savefig(tmp, **savefig))
