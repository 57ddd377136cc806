"""``TensorDictMaxValueWriter`` on equal ranks follows TorchRL's heap of ``(rank, row)``.

Rows offered one by one (a batch in its order) fill the free rows first; once the storage is
full a row is written only with a rank strictly higher than the lowest kept, and it replaces
the lowest ``(rank, row)``: of several rows of the lowest rank, the one in the lowest row. So a
new row of the same rank as an old one may outlive it (it filled a free row, the old one sat
in a lower row), but a row of a full buffer that only ties the lowest rank is not written.
``extend`` returns TorchRL's rows (``-1`` for a row not kept). tdreplay's documented
difference stays: a row of a batch that a later row of the same batch replaces is not
written, and not counted in ``write_count``. The heap's checkpoint format is unchanged, and
checkpoints of earlier versions (whose heap ordered ties by age) load and go on by this rule.
"""

from __future__ import annotations

import random

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyStackStorage, LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter

_STORAGES = {
    "list": ListStorage,
    "lazy": LazyTensorStorage,
    "memmap": LazyMemmapStorage,
    "stack": LazyStackStorage,
}


def _rb(capacity: int, storage: str = "lazy") -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=_STORAGES[storage](capacity),
                                  writer=TensorDictMaxValueWriter(rank_key="score"))


def _td(scores, ids) -> TensorDict:
    return TensorDict({"score": torch.tensor(scores, dtype=torch.float32),
                       "id": torch.tensor(ids)}, [len(scores)])


def _item(score: float, id_: int) -> TensorDict:
    return TensorDict({"score": torch.tensor(score), "id": torch.tensor(id_)}, [])


def _ids(rb) -> list[int]:
    """id of each row, in row order."""
    if not len(rb):
        return []
    data = rb[:]
    if isinstance(data, list):
        data = torch.stack(data)
    return data["id"].tolist()


@pytest.mark.parametrize("storage", sorted(_STORAGES))
def test_a_new_row_of_equal_rank_fills_a_free_row_and_the_older_one_is_replaced(storage):
    # findings' repro_04: TorchRL returns [1, 0, -1] and keeps ids [2, 1]
    rb = _rb(2, storage)
    assert rb.add(_item(3.0, 0)) == 0
    out = rb.extend(_td([3.0, 7.0, 0.5], [1, 2, 3]))
    assert out.tolist() == [1, 0, -1]
    assert _ids(rb) == [2, 1]
    assert rb.write_count == 3  # id 0, then ids 1 and 2
    assert rb.writer.ranks.tolist() == [7.0, 3.0]


@pytest.mark.parametrize("storage", sorted(_STORAGES))
def test_ties_within_one_batch(storage):
    # TorchRL: [3, 3, 7] into 2 rows returns [-1, 1, 0] and keeps ids [2, 1] (7 replaces the
    # 3 in row 0); id 0 is not written at all here (documented), so write_count is 2
    rb = _rb(2, storage)
    out = rb.extend(_td([3.0, 3.0, 7.0], [0, 1, 2]))
    assert out.tolist() == [-1, 1, 0]
    assert _ids(rb) == [2, 1]
    assert rb.write_count == 2
    assert rb.writer.written_positions.tolist() == [1, 2]


def test_distinct_ranks_land_in_torchrl_rows():
    # [1, 5, 6] into 2 rows: 1 -> row 0, 5 -> row 1, 6 replaces 1 in row 0 (TorchRL [-1, 1, 0])
    rb = _rb(2)
    assert rb.extend(_td([1.0, 5.0, 6.0], [0, 1, 2])).tolist() == [-1, 1, 0]
    assert _ids(rb) == [2, 1]
    assert rb.write_count == 2


def test_of_equal_lowest_ranks_the_lowest_row_is_replaced_first():
    rb = _rb(3)
    assert rb.extend(_td([4.0, 2.0, 2.0], [0, 1, 2])).tolist() == [0, 1, 2]
    assert rb.writer.get_insert_index(_item(3.0, 9)) == 1  # (changes nothing)
    assert rb.extend(_td([3.0], [3])).tolist() == [1]
    assert rb.writer.get_insert_index(_item(3.0, 9)) == 2
    assert rb.add(_item(3.0, 4)) == 2
    # now ranks [4, 3, 3]: a 3 ties the lowest: not written; a 5 replaces row 1
    assert rb.writer.get_insert_index(_item(3.0, 9)) is None
    assert rb.add(_item(3.0, 5)) is None
    assert rb.extend(_td([5.0, 5.0], [6, 7])).tolist() == [1, 2]
    assert _ids(rb) == [0, 6, 7]
    assert rb.write_count == 7


def test_all_equal_ranks_are_replaced_in_row_order():
    rb = _rb(3)
    rb.extend(_td([2.0, 2.0, 2.0], [0, 1, 2]))
    assert [int(rb.add(_item(5.0, 3 + k))) for k in range(3)] == [0, 1, 2]
    assert _ids(rb) == [3, 4, 5]


def _torchrl_offer(rows: list, offered: list, capacity: int) -> dict[int, int]:
    """TorchRL's rule on ``rows`` ((rank, id) per row); ``{row: position}`` kept at the end."""
    final: dict[int, int] = {}
    for pos, (rank, id_) in enumerate(offered):
        if len(rows) < capacity:
            row = len(rows)
            rows.append((rank, id_))
        else:
            row = min(range(len(rows)), key=lambda r: (rows[r][0], r))
            if not rank > rows[row][0]:
                continue
            rows[row] = (rank, id_)
        final[row] = pos
    return final


@pytest.mark.parametrize("storage", ["list", "lazy"])
def test_random_histories_with_many_ties_keep_torchrl_rows(storage):
    """Returns (-1 for a row not kept), rows in place and write_count, for batches smaller and
    larger than the free rows and the capacity (the writer drops rows that cannot be written
    before its heap loop)."""
    for seed in range(40):
        rng = random.Random(seed)
        capacity = rng.randint(1, 6)
        rb = _rb(capacity, storage)
        rows: list = []
        next_id = write_count = 0
        for _ in range(8):
            if rng.random() < 0.25:
                rank = float(rng.randint(0, 4))
                final = _torchrl_offer(rows, [(rank, next_id)], capacity)
                got = rb.add(_item(rank, next_id))
                assert got == (next(iter(final)) if final else None), seed
                next_id += 1
            else:
                n = rng.randint(1, 3 * capacity + 2)
                ranks = [float(rng.randint(0, 4)) for _ in range(n)]
                ids = list(range(next_id, next_id + n))
                next_id += n
                final = _torchrl_offer(rows, list(zip(ranks, ids)), capacity)
                want = [-1] * n
                for row, pos in final.items():
                    want[pos] = row
                assert rb.extend(_td(ranks, ids)).tolist() == want, seed
            write_count += len(final)
            assert _ids(rb) == [i for _, i in rows], seed
            assert rb.writer.ranks.tolist() == [r for r, _ in rows], seed
            assert rb.write_count == write_count, seed


def test_checkpoint_format_is_unchanged():
    rb = _rb(3)
    rb.extend(_td([2.0, 2.0, 1.0, 2.0], [0, 1, 2, 3]))  # 2 replaces the 1 in row 2
    assert rb.add(_item(3.0, 4)) == 0  # of the three 2s, the one in row 0
    state = rb.writer.state_dict()
    assert sorted(state) == ["age", "heap_ages", "heap_ranks", "heap_rows", "write_count"]
    assert state["heap_rows"].tolist() == [0, 1, 2]  # in row order
    assert state["heap_ranks"].tolist() == [3.0, 2.0, 2.0]
    assert state["heap_ages"].tolist() == [4, 1, 3]  # rows offered before each kept one
    assert state["age"] == 5 and state["write_count"] == 4


def test_a_checkpoint_of_the_earlier_tie_rule_loads_and_goes_on_by_torchrl_rule():
    # what the earlier version saved after extend([2, 2, 2]) (same format); it replaced the
    # newest of equal ranks (row 2) first, TorchRL's rule the lowest row (row 0)
    old = {"write_count": 3, "age": 3,
           "heap_ranks": torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64),
           "heap_ages": torch.tensor([0, 1, 2]), "heap_rows": torch.tensor([0, 1, 2])}
    rb = _rb(3)
    rb.extend(_td([2.0, 2.0, 2.0], [0, 1, 2]))
    rb.writer.load_state_dict(old)
    assert rb.writer.state_dict()["heap_ages"].tolist() == [0, 1, 2]
    assert rb.extend(_td([5.0], [3])).tolist() == [0]
    assert rb.add(_item(6.0, 4)) == 1
    assert _ids(rb) == [3, 4, 2]
    assert rb.write_count == 5


def test_a_restored_buffer_breaks_ties_as_the_original():
    a = _rb(3)
    a.extend(_td([2.0, 2.0, 2.0, 1.0], [0, 1, 2, 3]))
    b = _rb(3)
    b.load_state_dict(a.state_dict())
    for rb in (a, b):
        assert rb.extend(_td([2.0, 3.0, 3.0], [4, 5, 6])).tolist() == [-1, 0, 1]
        assert _ids(rb) == [5, 6, 2]
