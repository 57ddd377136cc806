"""A process killed inside ``with rb.locked():`` after a write returned: the write's rows are
kept (its writer's counters moved: it was committed), not dropped as torn. They were dropped,
with the write count still counting them, because the record of an overwrite stays until the
lock is released. A write killed before its counters moved is still dropped."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage

CHILD = r"""
import os, signal, sys
import torch
from tensordict import TensorDict
from tdreplay.core import RoundRobinWriter, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage

def rows(ids):
    return TensorDict({"id": torch.tensor(ids)}, [len(ids)])

rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=sys.argv[1]))
rb.extend(rows(list(range(10))))  # a full ring: the next extend overwrites rows 0, 1
case = sys.argv[2]
with rb.locked():
    if case == "edit, extend":
        rb[2:4] = rows([-1, -1])
    if case == "extend before its counters":
        RoundRobinWriter._advance = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
    rb.extend(rows([100, 101]))
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("case,ids,writes", [
    ("extend", [100, 101, 2, 3, 4, 5, 6, 7, 8, 9], 12),
    ("edit, extend", [100, 101, -1, -1, 4, 5, 6, 7, 8, 9], 12),
    ("extend before its counters", [2, 3, 4, 5, 6, 7, 8, 9], 10),  # torn: dropped
])
def test_a_write_that_returned_survives_a_kill_in_its_hold(tmp_path, case, ids, writes):
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), case], timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path,
                                                          existsok=True))
    assert rb[:]["id"].tolist() == ids
    assert (len(rb), rb.write_count) == (len(ids), writes)
    rb.extend(TensorDict({"id": torch.tensor([200])}, [1]))  # the ring goes on after them
    row = 2 if len(ids) == 10 else len(ids)
    assert rb[:]["id"].tolist()[row] == 200
