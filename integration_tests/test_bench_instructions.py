"""``nox -s bench-instructions`` (``benchmarks/instructions.py``) without valgrind: reading
callgrind's reports, the overhead rows, and the floor that the counts are compared with."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

ANNOTATED = """\
--------------------------------------------------------------------------------
91,920,725 (100.0%)  PROGRAM TOTALS
--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
54,524,544 (59.32%)  ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S:__memcpy_avx_unaligned_erms [/usr/lib/x86_64-linux-gnu/libc.so.6]
 5,203,103 ( 5.66%)  /tmp/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault [/usr/lib/libpython3.11.so.1.0]
 1,000,000 ( 1.09%)  ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S:__memmove_avx_unaligned_erms [/usr/lib/x86_64-linux-gnu/libc.so.6]
   700,000 ( 0.80%)  ???:my_memcpy_like_kernel [/site-packages/numpy/_core/_multiarray_umath.so]
"""


@pytest.fixture(scope="module")
def instructions(benchmark_script):
    return benchmark_script("instructions")


@pytest.fixture(scope="module")
def peers(benchmark_script):
    return benchmark_script("peers")


def test_bulk_copy_counts_libc_memcpy_and_memmove_only(instructions):
    # numpy's own loops and the interpreter are work; libc's rep-movsb copies count bytes
    assert instructions.bulk_copy_in(ANNOTATED) == 54_524_544 + 1_000_000
    assert instructions.bulk_copy_in("") == 0


def test_valgrind_total_is_read_from_its_last_collected_line(instructions):
    err = "==12== Callgrind\n==12== Collected : 1234\n==12==\n==12== Collected : 98765\n"
    assert instructions.COLLECTED.findall(err)[-1] == "98765"


def test_overhead_rows_subtract_the_floor_outside_bulk_copies(instructions):
    results = [
        {"peer": "tdreplay", "name": "sample_256", "instructions": 200, "outside_bulk_copy": 150},
        {"peer": "floor", "name": "sample_256", "instructions": 120, "outside_bulk_copy": 100},
        {"peer": "floor_td", "name": "sample_256", "instructions": 135, "outside_bulk_copy": 125},
        {"peer": "cpprb", "name": "sample_256", "instructions": 300, "outside_bulk_copy": 290},
        {"peer": "tdreplay", "name": "prioritized_cycle_B256", "instructions": 900,
         "outside_bulk_copy": 880},
        {"peer": "floor", "name": "prioritized_cycle_B256", "skipped": "no prioritized buffer"},
    ]
    rows = {row["name"]: row for row in instructions.overhead(results)}
    assert rows["sample_256"] == {"name": "sample_256", "tdreplay": 150, "floor": 100,
                                  "floor_td": 125, "cpprb": 290, "over_floor": 50,
                                  "over_floor_td": 25}
    assert rows["prioritized_cycle_B256"] == {"name": "prioritized_cycle_B256", "tdreplay": 880}
    assert list(rows) == ["sample_256", "prioritized_cycle_B256"]  # the order of WORKLOADS


def test_floor_reads_back_the_rows_it_wrote(peers):
    floor = peers.FloorPeer()
    rows = TensorDict({"obs": torch.arange(24.0).reshape(8, 3),
                       "done": torch.arange(8).reshape(8, 1) % 2 == 0}, batch_size=[8])
    handle = floor.uniform(8, floor.convert(rows[:4]))
    handle.extend(floor.convert(rows[:4]))
    handle.extend(floor.convert(rows[4:]))
    torch.manual_seed(0)
    batch = handle.sample(32)
    obs, done = batch["obs"], batch["done"]
    assert obs.shape == (32, 3) and obs.dtype == torch.float32 and done.dtype == torch.bool
    slot = (obs[:, 0] / 3).long()  # row i holds 3i, 3i + 1, 3i + 2
    assert torch.equal(obs, rows["obs"][slot]) and torch.equal(done, rows["done"][slot])
    assert set(slot.tolist()) > set(range(4))  # rows of both extends are drawn


def test_floor_td_takes_and_returns_tensordicts_with_the_slots_written(peers):
    floor = peers.FloorTensorDictPeer()
    rows = TensorDict({"obs": torch.arange(16.0).reshape(8, 2),
                       "next": {"reward": torch.arange(8.0).reshape(8, 1) * 10,
                                "done": torch.arange(8).reshape(8, 1) % 2 == 0}},
                      batch_size=[8])
    handle = floor.uniform(8, floor.convert(rows[:4]))
    assert handle.extend(floor.convert(rows[:4])).tolist() == [0, 1, 2, 3]
    slots = handle.extend(floor.convert(rows[4:]))
    assert slots.dtype == torch.int64 and slots.tolist() == [4, 5, 6, 7]
    torch.manual_seed(0)
    batch = handle.sample(32)
    assert isinstance(batch, TensorDict) and batch.batch_size == (32,)
    assert batch.device == torch.device("cpu")
    slot = (batch["obs"][:, 0] / 2).long()  # row i holds 2i, 2i + 1
    assert torch.equal(batch["obs"], rows["obs"][slot])
    assert torch.equal(batch["next", "reward"], rows["next", "reward"][slot])
    assert torch.equal(batch["next", "done"], rows["next", "done"][slot])
    assert batch["next"].batch_size == (32,) and set(slot.tolist()) > set(range(4))
