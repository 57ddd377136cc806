"""``dumps`` on a full disk raises ``OSError`` and keeps the previous checkpoint.

A small tmpfs is mounted for the test (root and a working ``mount`` needed; skipped
otherwise). The disk fills while the storage's items are written, and before anything at
all can be written (not even the pointer's record of the new snapshot).
"""

from __future__ import annotations

import errno
import uuid
from pathlib import Path

import pytest
import torch

SIZE = 2 * 1024 * 1024




def fill(disk: Path) -> Path:
    """Fill ``disk`` completely with one file; returns it."""
    filler = disk / f"filler-{uuid.uuid4().hex[:6]}"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 1 << 10, 1):  # big writes, then the last bytes of the last page
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as err:
                assert err.errno == errno.ENOSPC
    return filler


@pytest.mark.parametrize("tensordict", [False, True], ids=["list", "tensordict"])
def test_full_disk_while_writing_items(small_disk, faults, tally, tensordict):
    path = small_disk / "ckpt"
    family = faults.Family(offset=800, tensordict=tensordict)
    faults.plant_decoys(path)
    small = family.build(2)
    small.dumps(path)
    entries = sorted(p.name for p in path.iterdir())

    # a buffer whose items do not fit in what is left
    big = faults.Family(offset=800, tensordict=tensordict, capacity=64).empty()
    big.extend([torch.zeros(20_000) for _ in range(40)] if not tensordict else
               __import__("tensordict").TensorDict({"x": torch.zeros(40, 20_000)}, [40]))
    with pytest.raises(OSError) as err:
        big.dumps(path)
    assert err.value.errno == errno.ENOSPC
    tally.injected("full disk during dumps")
    assert sorted(p.name for p in path.iterdir()) == entries  # the new snapshot is gone
    restored = family.empty()
    restored.loads(path)
    faults.assert_same_state(restored, family.build(2))

    # room again: the next save works
    family.advance(small, 3)
    small.dumps(path)
    restored = family.empty()
    restored.loads(path)
    faults.assert_same_state(restored, family.build(3))
    faults.assert_owned_layout(path, settled=True)


def test_full_disk_before_anything_is_written(small_disk, faults, tally, monkeypatch):
    path = small_disk / "ckpt"
    family = faults.Family(offset=900)
    rb = family.build(1)
    rb.dumps(path)
    filler = fill(small_disk)
    family.advance(rb, 2)
    before = faults.buffer_fingerprint(rb)
    for _ in range(3):  # every retry fails the same way and leaves no trace
        with pytest.raises(OSError) as err:
            rb.dumps(path)
        assert err.value.errno == errno.ENOSPC
        tally.injected("full disk before dumps writes")
        faults.assert_unchanged(rb, before)
        restored = family.empty()
        restored.loads(path)
        faults.assert_same_state(restored, family.build(1))
    filler.unlink()
    rb.dumps(path)
    restored = family.empty()
    restored.loads(path)
    faults.assert_same_state(restored, family.build(2))
    assert faults.snapshot_dirs(path) == {faults.pointer(path)["snapshot"]}
