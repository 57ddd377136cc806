"""Pickling a list storage (``pickle.dumps(rb)``, a buffer sent to a Ray actor): rows that are
views of one batch are written once, and come back sharing one batch."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer


def test_pickled_rows_of_one_batch_are_written_once_and_share_it_again() -> None:
    # (each row pickled the whole batch it is a view of: 1,000 rows of 16 bytes made 16 MB)
    n = 1000
    batch = TensorDict({"obs": torch.randn(n, 4)}, [n])
    rb = ReplayBuffer(storage=ListStorage(n))
    rb.extend(batch)
    pickled = pickle.dumps(rb)
    assert len(pickled) < 200_000
    restored = pickle.loads(pickled)
    rows = restored.storage.get(torch.arange(n))
    assert torch.equal(torch.stack([row["obs"] for row in rows]), batch["obs"])
    assert len({row["obs"].untyped_storage().data_ptr() for row in rows}) == 1
    restored.extend(TensorDict({"obs": torch.ones(2, 4)}, [2]))  # a copy: the original keeps
    assert torch.equal(rb.storage.get(0)["obs"], batch["obs"][0])
    assert torch.equal(restored.storage.get(0)["obs"], torch.ones(4))


def test_pickled_plain_items_and_tensors_come_back_as_they_were() -> None:
    rb = ReplayBuffer(storage=ListStorage(6))
    rb.extend(["a", {"b": 1}, 3.5, torch.arange(3, dtype=torch.int16)])
    restored = pickle.loads(pickle.dumps(rb))
    first, second, third, fourth = restored.storage.get(torch.arange(4))
    assert (first, second, third) == ("a", {"b": 1}, 3.5)
    assert fourth.dtype == torch.int16 and fourth.tolist() == [0, 1, 2]
    assert len(restored) == 4 and restored.writer.cursor == 4


def test_only_plain_items_that_share_memory_go_through_torch_save():
    class Local:  # a class of the user's script: torch.save would pickle it by reference
        def __init__(self, obs):
            self.obs = obs

    batch = torch.zeros(4, 2)
    storage = ListStorage(8)
    storage.set(torch.arange(4), list(batch.unbind(0)))
    assert "_saved_items" in storage.__getstate__()  # rows of one batch: written once
    storage.set(4, Local(torch.ones(2)))
    state = storage.__getstate__()
    assert "_saved_items" not in state and isinstance(state["_storage"][4], Local)
    own = ListStorage(4)
    own.set(torch.arange(2), [torch.zeros(2), 7])  # nothing shared: pickled as it is
    assert own.__getstate__()["_storage"][1] == 7


def test_items_of_a_local_class_travel_by_value_with_cloudpickle():
    # (torch.save pickled the class by reference: a Ray worker could not find a dataclass
    # defined in the driver script)
    cloudpickle = pytest.importorskip("cloudpickle")
    import dataclasses

    @dataclasses.dataclass
    class Step:
        obs: torch.Tensor
        reward: float

    batch = torch.zeros(2, 2)
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([Step(row, float(i)) for i, row in enumerate(batch.unbind(0))])
    restored = cloudpickle.loads(cloudpickle.dumps(rb))
    assert [step.reward for step in restored.storage.items()] == [0.0, 1.0]

def _rows_of_a_large_batch() -> tuple[torch.Tensor, ReplayBuffer]:
    batch = torch.arange(10_000 * 100, dtype=torch.float32).reshape(10_000, 100)  # 4 MB
    rb = ReplayBuffer(storage=ListStorage(8))
    for i in range(4):
        rb.add(TensorDict({"x": batch[i]}, []))  # 4 rows of 400 bytes, views of the batch
    return batch, rb


def test_a_checkpoint_of_a_few_rows_of_a_large_batch_holds_those_rows(tmp_path):
    # (torch.save wrote the whole batch behind the views: 4 MB for 1.6 KB of rows)
    batch, rb = _rows_of_a_large_batch()
    rb.dumps(tmp_path)
    assert sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()) < 200_000
    restored = ReplayBuffer(storage=ListStorage(8))
    restored.loads(tmp_path)
    assert [row["x"].tolist() for row in restored.storage.items()] == [
        batch[i].tolist() for i in range(4)]
    assert rb.storage.get(0)["x"].untyped_storage().data_ptr() == batch.data_ptr()  # unchanged


def test_a_state_dict_and_a_pickle_of_a_few_rows_of_a_large_batch_hold_those_rows():
    import io

    batch, rb = _rows_of_a_large_batch()
    saved = io.BytesIO()
    torch.save(rb.state_dict(), saved)
    assert len(saved.getvalue()) < 100_000
    assert len(pickle.dumps(rb)) < 100_000
    restored = pickle.loads(pickle.dumps(rb))
    assert torch.equal(restored.storage.get(3)["x"], batch[3])


def test_a_deep_copy_keeps_the_items_sharing_and_copies_them():
    import copy

    batch = torch.zeros(6, 2)
    outside = batch[5]
    rb = ReplayBuffer(storage=ListStorage(8))
    rb.extend(list(batch.unbind(0)))
    copied_rb, copied_outside = copy.deepcopy((rb, outside))
    rows = copied_rb.storage.items()
    rows[0].add_(1.0)  # the copied rows still share one batch, as the originals do
    assert rows[1].untyped_storage().data_ptr() == rows[0].untyped_storage().data_ptr()
    assert copied_outside.untyped_storage().data_ptr() == rows[0].untyped_storage().data_ptr()
    assert batch.sum() == 0  # a copy: the original is untouched
    assert copied_rb.storage.max_size == 8 and len(copied_rb) == 6


def test_a_compacted_view_keeps_its_values_not_the_graph_it_hangs_from():
    from tdreplay.core.storage import compact_views

    weight = torch.ones(1000, 4, requires_grad=True)
    (kept,) = compact_views([(weight * 2)[0]])
    assert kept.tolist() == [2.0] * 4 and kept.requires_grad and kept.grad_fn is None
    assert kept.untyped_storage().nbytes() == 16
