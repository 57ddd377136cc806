"""Tests of TensorDictMaxValueWriter: what is kept, where, and that the heap survives checkpoints."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.writers import TensorDictMaxValueWriter


def make_rb(capacity: int, **writer_kwargs) -> TensorDictReplayBuffer:
    writer_kwargs.setdefault("rank_key", "rank")
    return TensorDictReplayBuffer(storage=ListStorage(capacity),
                                  writer=TensorDictMaxValueWriter(**writer_kwargs))


def batch(ranks, ids) -> TensorDict:
    ranks = torch.as_tensor(ranks, dtype=torch.float32)
    return TensorDict({"rank": ranks, "id": torch.as_tensor(ids, dtype=torch.long)},
                      [ranks.shape[0]])


def contents(rb) -> list[tuple[float, int]]:
    """(rank, id) of every row, in row order."""
    return [(float(item["rank"]), int(item["id"])) for item in rb.storage._storage]


class SequentialModel:
    """The specification (TorchRL's): rows offered one at a time; a full buffer replaces its
    lowest-ranked row (the lowest row of equal-ranked ones) only with a strictly higher rank."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: list[tuple[float, int, int]] = []  # (rank, age, id) per row
        self.age = 0

    def offer(self, rank: float, id_: int) -> int | None:
        age = self.age
        self.age += 1
        if len(self.rows) < self.capacity:
            self.rows.append((rank, age, id_))
            return len(self.rows) - 1
        worst = min(range(len(self.rows)), key=lambda r: (self.rows[r][0], r))
        if rank > self.rows[worst][0]:
            self.rows[worst] = (rank, age, id_)
            return worst
        return None

    def contents(self) -> list[tuple[float, int]]:
        return [(rank, id_) for rank, _, id_ in self.rows]


def test_torchrl_docs_example_keeps_the_best():
    rb = TensorDictReplayBuffer(storage=ListStorage(1), sampler=RandomSampler(), batch_size=1,
                                writer=TensorDictMaxValueWriter(rank_key="key"))
    for keys, expected in [(range(10), 9), (range(10, 20), 19), (range(10), 19)]:
        rb.extend(TensorDict({"key": torch.tensor(list(keys)), "obs": torch.tensor(list(keys))},
                             [10]))
        assert rb.sample()["obs"].item() == expected


def test_extend_returns_the_slot_of_each_row_and_minus_one_for_the_rows_not_kept():
    # as TorchRL's: one entry per batch row
    rb = make_rb(3)
    assert rb.extend(batch([5, 1, 3], [0, 1, 2])).tolist() == [0, 1, 2]
    # full, min is 1 (row 1): 0.5 is not kept, 4 replaces 1 (row 1); the min is then 3, so 1 is
    # not kept and 6 replaces 3 (row 2)
    written = rb.extend(batch([0.5, 4, 1, 6], [10, 11, 12, 13]))
    assert written.tolist() == [-1, 1, -1, 2]
    assert contents(rb) == [(5.0, 0), (4.0, 11), (6.0, 13)]
    assert rb.write_count == 5
    # nothing above the minimum (4): nothing written, write count unchanged
    assert rb.extend(batch([1, 2, 4], [20, 21, 22])).tolist() == [-1, -1, -1]
    assert rb.write_count == 5


def test_row_evicted_within_the_same_batch_is_never_written():
    rb = make_rb(2)
    rb.extend(batch([1, 2], [0, 1]))
    # offered one by one, 3 would replace 1, then 5 replace 2, then 6 replace 3: id 10 never lands
    written = rb.extend(batch([3, 5, 6], [10, 11, 12]))
    assert sorted(contents(rb)) == [(5.0, 11), (6.0, 12)]
    assert written[0] == -1 and sorted(written[1:].tolist()) == [0, 1]
    assert [contents(rb)[row][1] for row in written[1:]] == [11, 12]  # batch order
    assert rb.write_count == 4


def test_ties_keep_the_rows_already_there():
    rb = make_rb(2)
    rb.extend(batch([1, 1], [0, 1]))
    assert rb.extend(batch([1], [2])).tolist() == [-1]
    assert [i for _, i in contents(rb)] == [0, 1]


def test_batch_larger_than_capacity_on_empty_buffer():
    rb = make_rb(3)
    written = rb.extend(batch([1, 7, 2, 9, 3, 8], list(range(6))))
    assert sorted(contents(rb)) == [(7.0, 1), (8.0, 5), (9.0, 3)]
    assert (written >= 0).tolist() == [False, True, False, True, False, True]
    assert [contents(rb)[row][1] for row in written[written >= 0]] == [1, 3, 5]


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 6),
       batches=st.lists(st.lists(st.integers(0, 6), min_size=0, max_size=9), min_size=1,
                        max_size=6))
def test_matches_sequential_specification(capacity, batches):
    rb = make_rb(capacity)
    model = SequentialModel(capacity)
    next_id = 0
    n_written = 0
    for ranks in batches:
        ids = list(range(next_id, next_id + len(ranks)))
        next_id += len(ranks)
        before = contents(rb)
        for r, i in zip(ranks, ids):
            model.offer(float(r), i)
        per_row = rb.extend(batch(ranks, ids)).tolist() if ranks else []
        assert len(per_row) == len(ranks)
        written = [row for row in per_row if row >= 0]  # -1: a row not kept
        n_written += len(written)
        after = contents(rb)
        # the same rows are kept, in the same rows, as when offering them one at a time
        assert after == model.contents()
        # the rows returned are exactly those whose content changed, listed in batch order
        changed = [row for row in range(len(after))
                   if row >= len(before) or after[row] != before[row]]
        assert sorted(written) == changed
        written_ids = [after[row][1] for row in written]
        assert written_ids == sorted(written_ids) and set(written_ids) <= set(ids)
    assert rb.write_count == n_written
    # the writer's rank per row agrees with the data in the row
    assert rb.writer.ranks.tolist() == [r for r, _ in contents(rb)]


def test_write_count_counts_rows_written():
    rb = make_rb(2)
    rb.extend(batch([1, 2], [0, 1]))
    rb.extend(batch([3, 0], [2, 3]))
    rb.extend(batch([4, 5, 6], [4, 5, 6]))
    # 1 + 2 rows, then 3 replaced 1, then 4,5,6 -> only 5 and 6 survive (4 evicted in-batch)
    assert rb.write_count == 2 + 1 + 2


@pytest.mark.parametrize("reduction, expected_kept", [
    ("sum", 3), ("mean", 3), ("max", 0), ("min", 1), ("median", 2),
])
def test_multidimensional_rank_reduction(reduction, expected_kept):
    rank = torch.tensor([[0.0, 0.0, 0.0, 10.0],   # sum 10, max 10, min  0, median  0
                         [2.0, 2.0, 2.0, 2.0],    # sum  8, max  2, min  2, median  2
                         [-9.0, 5.0, 5.0, 5.0],   # sum  6, max  5, min -9, median  5
                         [-1.0, -1.0, 6.0, 9.0]])  # sum 13, max  9, min -1, median -1
    td = TensorDict({"rank": rank.unsqueeze(-1), "id": torch.arange(4)}, [4])
    rb = make_rb(1, reduction=reduction)
    rb.extend(td)
    assert int(rb.storage.get(0)["id"]) == expected_kept


def test_trajectory_rows_ranked_by_summed_reward():
    # rows of a [B, T] batch (one trajectory per row), default rank key ("next", "reward")
    reward = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 5.0], [2.0, 0.0, 0.0]]).unsqueeze(-1)
    td = TensorDict({"obs": torch.arange(9).reshape(3, 3), ("next", "reward"): reward}, [3, 3])
    rb = TensorDictReplayBuffer(storage=ListStorage(2), writer=TensorDictMaxValueWriter())
    assert rb.writer.rank_key == ("next", "reward")
    rb.extend(td)
    kept = sorted(int(item["obs"][0]) for item in rb.storage._storage)
    assert kept == [0, 3]  # sums 3 and 5 beat 2
    assert sorted(rb.writer.ranks.tolist()) == [3.0, 5.0]


def test_add_returns_row_or_none():
    rb = make_rb(1)
    item = TensorDict({"rank": torch.tensor(2.0), "id": torch.tensor(0)}, [])
    assert rb.add(item) == 0
    low = TensorDict({"rank": torch.tensor(1.0), "id": torch.tensor(1)}, [])
    assert rb.add(low) is None  # not kept: None, as TorchRL's
    assert rb.writer.get_insert_index(low) is None
    high = TensorDict({"rank": torch.tensor(3.0), "id": torch.tensor(2)}, [])
    assert rb.writer.get_insert_index(high) == 0
    assert rb.add(high) == 0
    assert contents(rb) == [(3.0, 2)]
    assert rb.write_count == 2


@pytest.mark.parametrize("bad, err, match", [
    (TensorDict({"id": torch.arange(2)}, [2]), KeyError, "'rank'"),
    (TensorDict({"rank": torch.tensor([1.0, float("nan")]), "id": torch.arange(2)}, [2]),
     ValueError, "NaN"),
    (TensorDict({"rank": torch.tensor([1 + 1j, 2j]), "id": torch.arange(2)}, [2]),
     TypeError, "real-valued"),
])
def test_bad_rank_leaves_buffer_unchanged(bad, err, match):
    rb = make_rb(3)
    rb.extend(batch([1, 2], [0, 1]))
    state = rb.writer.state_dict()
    with pytest.raises(err, match=match):
        rb.extend(bad)
    assert contents(rb) == [(1.0, 0), (2.0, 1)]
    assert all(torch.equal(torch.as_tensor(state[k]), torch.as_tensor(v))
               for k, v in rb.writer.state_dict().items())


def test_non_tensordict_data_is_refused():
    rb = ReplayBuffer(storage=ListStorage(3), writer=TensorDictMaxValueWriter())
    with pytest.raises(TypeError, match="TensorDict"):
        rb.extend(torch.zeros(2))


@pytest.mark.parametrize("kwargs, match", [
    ({"reduction": "prod"}, "reduction"),
    ({"rank_key": ["a", "b"]}, "rank_key"),
    ({"rank_key": 3}, "rank_key"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        TensorDictMaxValueWriter(**kwargs)


class RefusingStorage(ListStorage):
    """A list storage that rejects any item whose id is negative (stands in for a storage that
    validates keys/shapes)."""

    def set(self, rows, data):
        ids = data["id"].reshape(-1)
        if (ids < 0).any():
            raise ValueError("negative id")
        super().set(rows, data)


def test_storage_rejection_restores_the_heap():
    rb = TensorDictReplayBuffer(storage=RefusingStorage(3),
                                writer=TensorDictMaxValueWriter(rank_key="rank"))
    rb.extend(batch([5, 1, 3], [0, 1, 2]))
    state = rb.writer.state_dict()
    with pytest.raises(ValueError, match="negative id"):
        rb.extend(batch([4, 9, 0.5, 7], [3, -1, 5, 6]))
    after = rb.writer.state_dict()
    assert after["write_count"] == state["write_count"] and after["age"] == state["age"]
    for key in ("heap_ranks", "heap_ages", "heap_rows"):
        assert sorted(after[key].tolist()) == sorted(state[key].tolist())
    assert contents(rb) == [(5.0, 0), (1.0, 1), (3.0, 2)]
    # and it goes on exactly as a buffer that never saw the rejected batch
    ref = TensorDictReplayBuffer(storage=ListStorage(3),
                                 writer=TensorDictMaxValueWriter(rank_key="rank"))
    ref.extend(batch([5, 1, 3], [0, 1, 2]))
    for rb_ in (rb, ref):
        rb_.extend(batch([4, 2, 6], [10, 11, 12]))
    assert contents(rb) == contents(ref)


def _continue(rb):
    g = torch.Generator().manual_seed(1)
    out = []
    for step in range(5):
        ranks = torch.randint(0, 20, (6,), generator=g).float()
        out.append(rb.extend(batch(ranks, torch.arange(6) + 100 * step)).tolist())
    return out


def _filled(capacity=4):
    rb = make_rb(capacity)
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        ranks = torch.randint(0, 20, (5,), generator=g).float()
        rb.extend(batch(ranks, torch.arange(5) + 10 * step))
    return rb


def test_state_dict_roundtrip_continues_identically():
    original = _filled()
    state = original.state_dict()
    restored = make_rb(4)
    restored.load_state_dict(state)
    assert contents(restored) == contents(original)
    assert _continue(restored) == _continue(original)
    assert contents(restored) == contents(original)
    assert restored.write_count == original.write_count


def test_dumps_loads_keeps_the_heap(tmp_path):
    original = _filled()
    original.dumps(tmp_path / "ckpt")
    restored = make_rb(4)
    restored.loads(tmp_path / "ckpt")
    assert restored.writer.state_dict()["heap_rows"].tolist() == \
        original.writer.state_dict()["heap_rows"].tolist()
    assert _continue(restored) == _continue(original)
    assert contents(restored) == contents(original)


def test_loading_a_corrupt_heap_is_refused_and_changes_nothing():
    rb = _filled()
    before = contents(rb)
    state = rb.state_dict()
    bad = dict(state["_writer"])
    bad["heap_rows"] = torch.tensor([0, 0, 1, 2])
    with pytest.raises(ValueError, match="heap rows"):
        rb.load_state_dict({**state, "_writer": bad})
    short = dict(state["_writer"])
    short["heap_ages"] = short["heap_ages"][:2]
    with pytest.raises(ValueError, match="length"):
        rb.writer.load_state_dict(short)
    assert contents(rb) == before


def test_empty_resets_the_heap():
    rb = _filled()
    rb.empty()
    assert len(rb) == 0 and rb.write_count == 0
    assert rb.extend(batch([0.0], [1])).tolist() == [0]


def test_concurrent_extends_keep_the_global_top_k():
    capacity, n_threads, per_thread, bs = 16, 4, 25, 8
    rb = make_rb(capacity)
    total = n_threads * per_thread * bs
    ranks = torch.randperm(total).float()  # distinct ranks: the kept set is unique
    barrier = threading.Barrier(n_threads)
    errors = []

    def worker(k):
        try:
            barrier.wait()
            for j in range(per_thread):
                start = (k * per_thread + j) * bs
                r = ranks[start:start + bs]
                rb.extend(batch(r, torch.arange(start, start + bs)))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    kept = sorted(r for r, _ in contents(rb))
    assert kept == sorted(ranks.topk(capacity).values.tolist())
    for rank, id_ in contents(rb):
        assert ranks[id_] == rank  # every row holds the data its rank came from
    assert rb.writer.ranks.tolist() == [r for r, _ in contents(rb)]


def test_max_value_writer_is_not_shareable():
    """The heap lives in one process: a buffer holding the writer refuses to be shared."""
    from tdreplay.core import NotShareableError

    assert TensorDictMaxValueWriter.shareable is False
    rb = make_rb(4)
    with pytest.raises(NotShareableError, match="Writers of type .*TensorDictMaxValueWriter.* "
                                                "cannot be shared between processes"):
        rb.share()
    assert rb.shared is False
    rb.extend(batch([1.0, 2.0], [0, 1]))  # the buffer itself goes on
    assert sorted(contents(rb)) == [(1.0, 0), (2.0, 1)]


def test_a_partly_kept_batch_gets_the_slot_of_each_row_kept_and_minus_one_for_the_others():
    # extend returns them (as TorchRL); the batch itself, stale "index" included, is unchanged
    rb = make_rb(3)
    first = batch([1.0, 5.0, 2.0, 9.0, 0.0], [0, 1, 2, 3, 4])
    assert rb.extend(first).tolist() == [-1, 1, 2, 0, -1]  # (9 replaces 1, in row 0)
    assert sorted(first.keys()) == ["id", "rank"]
    second = batch([0.0, 7.0], [5, 6])
    second["index"] = torch.tensor([9, 9])  # a stale index from elsewhere
    assert rb.extend(second).tolist() == [-1, 2]  # 7 replaces the least kept (rank 2, row 2)
    assert second["index"].tolist() == [9, 9]
    assert rb.writer.written_positions.tolist() == [1]
    whole = batch([10.0, 11.0, 12.0], [7, 8, 9])
    assert sorted(rb.extend(whole).tolist()) == [0, 1, 2]
    assert rb.writer.written_positions is None  # every row written, in order


def test_priorities_of_a_partly_kept_batch_go_to_the_rows_kept():
    samplers = pytest.importorskip("tdreplay.samplers")  # (not a dependency of writers)
    rb = TensorDictReplayBuffer(storage=ListStorage(3),
                                writer=TensorDictMaxValueWriter(rank_key="rank"),
                                sampler=samplers.PrioritizedSampler(3, alpha=1.0, beta=1.0,
                                                                    eps=0.0))
    data = batch([1.0, 5.0, 2.0, 9.0, 0.0], [0, 1, 2, 3, 4])
    data["td_error"] = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0])
    rb.extend(data)  # rows 0, 1, 2 hold ids 1, 2, 3: priorities 20, 30, 40
    assert rb.sampler.total_priority == pytest.approx(90.0)
    more = batch([0.0, 7.0], [5, 6])
    more["td_error"] = torch.tensor([1.0, 2.0])
    rb.extend(more)  # id 6 (priority 2) replaces id 2 (priority 30) at row 1
    assert rb.sampler.total_priority == pytest.approx(62.0)


@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_restored_buffer_knows_the_row_the_writer_wrote_last(how, tmp_path):
    # (a restored buffer took the newest row from a round-robin cursor the max-value writer
    # does not have: None where the saved one had 0, and HER's "final" goals of the buffer
    # below changed from 4.0 to 3.0)
    from tdreplay.core import HERReplayBuffer, SamplerWithoutReplacement
    from tdreplay.storages import LazyTensorStorage

    def make():
        return HERReplayBuffer(
            reward_fn=lambda td: td["next", "reward"], storage=LazyTensorStorage(4),
            batch_size=4, her_ratio=1.0, strategy="final",
            writer=TensorDictMaxValueWriter(rank_key="reward"),
            sampler=SamplerWithoutReplacement(shuffle=False))

    rb = make()
    for step, rank in enumerate([1.0, 5.0, 2.0, 6.0, 3.0]):
        rb.add(TensorDict({
            "x": torch.tensor(step), "reward": torch.tensor(rank),
            "desired_goal": torch.full((1,), -1.0),
            "achieved_goal": torch.full((1,), float(step)),
            "next": {"reward": torch.zeros(1), "done": torch.zeros(1, dtype=torch.bool)}}, []))
    assert rb[:]["x"].tolist() == [4, 1, 2, 3] and rb.storage.last_written_row == 0
    back = make()
    if how == "dumps":
        rb.dumps(tmp_path / "ckpt")
        back.loads(tmp_path / "ckpt")
    else:
        back.load_state_dict(rb.state_dict())
    assert back.storage.last_written_row == 0
    assert back.sample()["desired_goal"].flatten().tolist() == [4.0] * 4
    assert rb.sample()["desired_goal"].flatten().tolist() == [4.0] * 4


@pytest.mark.parametrize("storage", ["lazy_tensor", "list"])
def test_rows_kept_of_a_batch_keep_their_non_tensor_entries(storage):
    from tensordict import NonTensorStack

    from tdreplay.storages import LazyTensorStorage

    def batch(ranks, start):
        td = TensorDict({"r": torch.tensor(ranks), "obs": torch.arange(float(len(ranks))) + start},
                        [len(ranks)])
        td["text"] = NonTensorStack(*[f"s{start + i}" for i in range(len(ranks))])
        return td

    make = LazyTensorStorage if storage == "lazy_tensor" else ListStorage
    rb = TensorDictReplayBuffer(storage=make(2), writer=TensorDictMaxValueWriter(rank_key="r"))
    assert rb.extend(batch([3.0, 1.0, 2.0], 0)).tolist() == [0, -1, 1]  # the middle one is not kept
    assert rb[:]["text"] == ["s0", "s2"]
    rb.extend(batch([0.5, 4.0], 10))  # 4.0 replaces the lowest kept row (rank 2.0, row 1)
    assert rb[:]["obs"].tolist() == [0.0, 11.0]
    assert rb[:]["text"] == ["s0", "s11"]


def test_the_writer_add_of_an_item_ranked_too_low_returns_none_as_torchrl():
    # it returned an empty tensor (the buffer's add already returned None)
    rb = make_rb(2)
    rb.extend(batch([5.0, 6.0], [0, 1]))
    assert rb.writer.add(batch([1.0], [2])[0]) is None
    assert rb.writer.add(batch([9.0], [3])[0]) == 0
    assert contents(rb) == [(9.0, 3), (6.0, 1)]
