"""Scratch directories beside converted datasets: a killed conversion's is removed by the next
conversion on the host (each is a full copy of a dataset at worst), and replacing a dataset
moves the old one aside first, so a crash leaves the old dataset or none (the next open
converts again), never a directory without its marker that no call would fix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tdreplay.datasets import MinariExperienceReplay
from tdreplay.datasets._files import publish, remove_dir, staging_dir

CARTPOLE = "cartpole/tiny-v0"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_processs_scratch_is_removed_by_the_next_staging(tmp_path):
    target = tmp_path / "data"
    host = socket.gethostname()
    dead = tmp_path / f".data.tmp-{host}-{_dead_pid()}-abc"
    live = tmp_path / f".data.tmp-{host}-{os.getppid()}-abc"  # (a live process's)
    other_host = tmp_path / f".data.tmp-elsewhere-{_dead_pid()}-abc"
    for directory in (dead, live, other_host):
        (directory / "converted").mkdir(parents=True)
        (directory / "converted" / "rows.memmap").write_bytes(b"\0" * 64)
    with staging_dir(target) as scratch:
        assert scratch.name.startswith(f".data.tmp-{host}-{os.getpid()}-")
    assert not dead.exists() and live.exists() and other_host.exists()


def _crash_while_replacing(target, built) -> int:
    """``publish(built, target, replace=True)`` in a child killed right after its first
    rename (the old directory moved aside)."""
    code = f"""
import os, sys
sys.path[:0] = {sys.path!r}
from pathlib import Path
from tdreplay.datasets import _files
real, calls = os.replace, []
def replace(a, b):
    real(a, b)
    calls.append(1)
    if len(calls) == 1:
        os._exit(9)
_files.os.replace = replace
_files.publish(Path({str(built)!r}), Path({str(target)!r}), replace=True)
"""
    return subprocess.run([sys.executable, "-c", code]).returncode


def test_a_crash_while_replacing_leaves_no_half_removed_dataset(cartpole, root):
    data = MinariExperienceReplay(cartpole, 4, root=root, load_from_local_minari=True)
    before = data[:]["observation"].clone()
    target = root / CARTPOLE
    built = root / "built"
    built.mkdir()
    (built / "rows.memmap").write_bytes(b"\0" * 64)
    assert _crash_while_replacing(target, built) == 9
    assert not target.exists()  # (the old one moved aside: gone, not half there)
    again = MinariExperienceReplay(cartpole, 4, root=root, load_from_local_minari=True)
    assert (again[:]["observation"] == before).all()  # converted again
    siblings = [p.name for p in target.parent.iterdir() if p.name.startswith(".")]
    assert siblings == []  # the dead child's aside directory removed too


def test_publish_replaces_a_dataset_whole(tmp_path):
    target, built = tmp_path / "data", tmp_path / "built"
    (target / "old").mkdir(parents=True)
    (built / "new").mkdir(parents=True)
    assert publish(built, target, replace=True)
    assert sorted(os.listdir(target)) == ["new"] and not built.exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


def test_remove_dir_removes_whole_and_takes_a_directory_already_gone(tmp_path):
    # (three processes re-converting one dataset with download="force" at once: 4 of 24
    # calls raised FileNotFoundError from rmtree, the split directory removed under them)
    target = tmp_path / "data_split"
    (target / "sub").mkdir(parents=True)
    (target / "sub" / "rows.memmap").write_bytes(b"\0" * 64)
    remove_dir(target)
    assert os.listdir(tmp_path) == []  # no scratch directory left beside it
    remove_dir(target)  # removed by another process meanwhile: nothing to do
    assert os.listdir(tmp_path) == []


def test_a_crash_while_removing_leaves_the_directory_whole_or_gone(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    for name in ("a.memmap", "b.memmap", "marker.json"):
        (target / name).write_bytes(b"\0" * 64)
    code = f"""
import os, shutil, sys
sys.path[:0] = {sys.path!r}
from pathlib import Path
from tdreplay.datasets import _files
def die(*args, **kwargs):
    os._exit(9)
_files.shutil.rmtree = die  # killed once the directory is renamed aside
_files.remove_dir(Path({str(target)!r}))
"""
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    assert not target.exists()  # not a marker without some of its files
    with staging_dir(target):
        pass
    assert os.listdir(tmp_path) == []  # the dead process's aside directory removed
