"""Atomic writes: all or nothing, and the user's umask decides who can read the files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from moglm.atomic import atomic_directory, atomic_write, atomic_write_text, exclusive_lock, write_once


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_and_folders_get_the_modes_the_umask_gives_not_temporary_file_modes(tmp_path, umask_027):
    atomic_write_text(tmp_path / "a.json", "{}")
    with atomic_directory(tmp_path / "checkpoint") as tmp:
        (tmp / "model.safetensors").write_bytes(b"x")
    assert _mode(tmp_path / "a.json") == 0o640  # 0o666 & ~0o027, not mkstemp's 0o600
    assert _mode(tmp_path / "checkpoint") == 0o750  # 0o777 & ~0o027, not mkdtemp's 0o700
    assert write_once(tmp_path / "once.json", "1", lambda p: True)
    assert _mode(tmp_path / "once.json") == 0o640


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temporary_file(tmp_path):
    path = atomic_write_text(tmp_path / "results.json", "old")

    def dies(tmp):
        tmp.write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic_write(path, dies)
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "dir") as tmp:
            (tmp / "f").write_text("x")
            raise RuntimeError("killed")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_directory_replaces_an_unreferenced_leftover(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "stale").write_text("x")
    with atomic_directory(tmp_path / "d") as tmp:
        (tmp / "fresh").write_text("y")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["fresh"]


def test_write_once_keeps_the_first_valid_file_and_replaces_an_invalid_one(tmp_path):
    path = tmp_path / "route.json"
    assert write_once(path, "first", lambda p: p.read_text() != "bad")
    assert not write_once(path, "second", lambda p: p.read_text() != "bad")
    assert path.read_text() == "first"
    path.write_text("bad")
    assert write_once(path, "third", lambda p: p.read_text() != "bad")
    assert path.read_text() == "third"
    assert not write_once(tmp_path / "missing" / "x.json", "t", lambda p: True)  # unwritable: skipped, no error


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_exclusive_lock_keeps_another_process_out_until_released(tmp_path):
    lock = tmp_path / ".lock"
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')")
    other = lambda: subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True,  # noqa: E731
                                   text=True, check=True).stdout.strip()
    with exclusive_lock(lock):
        assert other() == "held"
    assert other() == "free"


def test_exclusive_lock_says_when_it_waits_for_another_process(tmp_path):
    lock = tmp_path / "lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(1.5)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waited = []
        with exclusive_lock(lock, on_wait=lambda: waited.append(True)):
            pass
        assert waited == [True]  # it was held: it said so, then waited for it
        waited.clear()
        with exclusive_lock(lock, on_wait=lambda: waited.append(True)):
            pass
        assert waited == []  # free: no wait, no word
    finally:
        holder.kill()
        holder.wait()
