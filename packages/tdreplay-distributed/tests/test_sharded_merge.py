"""Samples drawn from several shards are merged in draw order, non-tensor entries included
(they were dropped: the merge indexed TensorDicts leaf by leaf with ``apply``)."""

from __future__ import annotations

import torch
from tensordict import NonTensorStack, TensorDict

from tdreplay.distributed._sharding import merge_samples


def _drawn(shard: int, slots: list[int]) -> TensorDict:
    td = TensorDict({"obs": torch.tensor(slots, dtype=torch.float32) + 100 * shard}, [len(slots)])
    td["name"] = NonTensorStack(*[f"shard{shard}-slot{s}" for s in slots])
    return td


def test_a_merged_sample_keeps_non_tensor_entries_in_draw_order() -> None:
    which = torch.tensor([1, 0, 1, 0])  # positions 0 and 2 drew shard 1
    pieces = [(0, _drawn(0, [3, 4]), {"index": torch.tensor([3, 4])}, 1.0, None, 2, 2),
              (1, _drawn(1, [0, 1]), {"index": torch.tensor([0, 1])}, 1.0, None, 2, 2)]
    merged, info = merge_samples(which, pieces, 1.0, torch.tensor([0, 8, 16]))
    assert merged["obs"].tolist() == [100.0, 3.0, 101.0, 4.0]
    assert merged["name"] == ["shard1-slot0", "shard0-slot3", "shard1-slot1", "shard0-slot4"]
    assert info["index"].tolist() == [8, 3, 9, 4]
