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
