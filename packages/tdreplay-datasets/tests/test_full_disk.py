"""A conversion or a preprocess on a full disk raises ``OSError`` (``ENOSPC``) and leaves no
scratch files: the memory-mapped files are allocated before anything is written through
them. Before, the first write into a sparse file's mapping killed the process (``SIGBUS``).

A small tmpfs is mounted for these tests (root and mount(8) needed; skipped otherwise)."""

from __future__ import annotations

import errno
import os

import pytest

from tdreplay.core.testing import fill_disk, in_forked_child, small_tmpfs
from tdreplay.datasets import MinariExperienceReplay

LEFT = 48 * 1024  # room left for the metadata, not for the data


@pytest.fixture
def full_disk(tmp_path):
    with small_tmpfs(tmp_path / "disk", 4 << 20) as disk:
        filler = fill_disk(disk)
        with open(filler, "r+b") as f:
            f.truncate(os.path.getsize(filler) - LEFT)
        yield disk


def _convert(dataset_id, root):
    try:
        MinariExperienceReplay(dataset_id, 4, root=root, load_from_local_minari=True)
    except OSError as err:
        return err.errno
    return "converted"


def test_a_conversion_on_a_full_disk_raises_enospc(cartpole_maker, minari_dir, full_disk):
    cartpole_maker(seeds=tuple(range(60)))  # ~600 steps: more than LEFT once converted
    root = full_disk / "converted"
    outcome = in_forked_child(lambda: _convert("cartpole/tiny-v0", root), timeout=120)
    assert outcome == errno.ENOSPC  # (a SIGBUS would fail in_forked_child: the child died)
    leftovers = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    assert leftovers == []


def _under_a_file_size_limit(convert, limit=100):
    """``convert()`` with files limited to ``limit`` bytes: the ``(errno, filename)`` of the
    ``OSError`` it raises (``"converted"`` if none). Standard output and error go to
    /dev/null first (the limit applies to pytest's capture files too: the progress bar)."""
    import resource
    import sys

    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the child's, to its end)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        convert()
    except OSError as err:
        return err.errno, str(err.filename)
    return "converted"


@pytest.mark.parametrize("split_trajs", [False, True])
def test_a_conversion_past_a_file_size_limit_raises_efbig_naming_the_file(
        cartpole_maker, minari_dir, tmp_path, split_trajs):
    # torch could not size the files (memmap_like) and raised its RuntimeError, naming no
    # errno: the datasets promise OSError for a disk without room
    cartpole_maker(seeds=tuple(range(20)))
    root = tmp_path / "converted"
    if split_trajs:  # the flat conversion first, then the split one past the limit
        MinariExperienceReplay("cartpole/tiny-v0", 4, root=root, load_from_local_minari=True)
    outcome = in_forked_child(lambda: _under_a_file_size_limit(
        lambda: MinariExperienceReplay("cartpole/tiny-v0", 4, root=root, split_trajs=split_trajs,
                                       load_from_local_minari=True)), timeout=120)
    assert outcome != "converted"
    code, filename = outcome
    assert code == errno.EFBIG and filename.endswith(".memmap"), outcome
    assert not any(".tmp-" in str(p) for p in root.rglob("*"))  # nothing half-built left
