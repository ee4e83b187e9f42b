"""Atomic writes: a reader (a resumed run, a teammate's TensorBoard, an image viewer refreshing a plot)
sees the old content or the new, never half a file, and a kill at any moment leaves no partial file
behind.

Everything is first written under a hidden temporary name in the destination's folder, flushed to disk,
given the permissions a plain ``open(path, "w")`` (or ``mkdir``) would give under the user's umask, and
then renamed into place. This module is the one implementation; every file moglm writes for later
reading goes through it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_umask_lock = threading.Lock()


def _umask() -> int:
    """The process's umask (reading it means setting it; the lock keeps threads from seeing the probe)."""
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` to produce the file at a temporary path, then move it to ``path`` atomically.
    The file gets mode ``0o666 & ~umask``, as a freshly created file would (not ``mkstemp``'s 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        _fsync(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def check_free(path: str | Path, force: bool) -> None:
    """Refuse to replace an existing file unless told (``--force``): a user's file is never overwritten by
    accident. Commands check before their work and again just before they write."""
    from .errors import MoglmError

    path = Path(path)
    if path.is_dir():
        raise MoglmError(f"{path} is a folder: give a file name")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise MoglmError(f"{path}: {parent} is a file, not a folder")
            break
    if path.exists() and not force:
        raise MoglmError(f"{path} exists: give --force to replace it, or another --output")


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_once(path: str | Path, text: str, valid: Callable[[Path], bool]) -> bool:
    """Write ``text`` to ``path`` unless another process already wrote a file there that ``valid`` accepts
    (first writer wins; a hard link fails if the name exists). An invalid file is replaced. Returns
    whether this call's text is the one stored; an unwritable folder returns ``False``."""
    path = Path(path)
    try:
        def link(tmp: Path) -> None:
            tmp.write_text(text, encoding="utf-8")
            os.chmod(tmp, 0o666 & ~_umask())
            os.link(tmp, path)

        tmp_dir = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
        try:
            link(tmp_dir / path.name)
            return True
        except FileExistsError:
            if valid(path):
                return False
            os.replace(tmp_dir / path.name, path)
            return True
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    except OSError:
        return False


@contextmanager
def exclusive_lock(path: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) while the block runs, waiting for any
    other holder: it serialises read-modify-write of a shared file between processes, and the kernel
    releases it with a killed holder (no stale lock). ``on_wait`` is called once before waiting, when another
    process holds it (to say so). Outside POSIX it does nothing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Fill the yielded temporary folder; on success it replaces ``path`` (a leftover at ``path`` is
    removed first) with mode ``0o777 & ~umask``; on an error it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".tmp-{path.name}-"))
    try:
        yield tmp
        for f in tmp.iterdir():
            if f.is_file():
                _fsync(f)
        os.chmod(tmp, 0o777 & ~_umask())
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
