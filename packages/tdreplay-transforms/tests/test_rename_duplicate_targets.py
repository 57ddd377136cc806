"""``RenameTransform`` refuses a target name given twice (one entry would be lost silently);
an entry already present under a target name is replaced, as in TorchRL."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import RenameTransform


@pytest.mark.parametrize("out_keys", [["x", "x"], [("a", "b"), ("a", "b")], ["x", ("x",)]])
def test_duplicate_out_keys_are_refused(out_keys: list) -> None:
    with pytest.raises(ValueError, match="out_keys"):
        RenameTransform(["observation", "action"], out_keys)


def test_duplicate_in_keys_inv_are_refused() -> None:
    with pytest.raises(ValueError, match="in_keys_inv"):
        RenameTransform(["a"], ["b"], in_keys_inv=["obs", "obs"], out_keys_inv=["o1", "o2"])


def test_distinct_targets_and_swaps_still_work() -> None:
    t = RenameTransform(["a", "b"], ["b", "a"], in_keys_inv=["a", "b"], out_keys_inv=["b", "a"])
    out = t(TensorDict(a=torch.zeros(2), b=torch.ones(2), batch_size=[2]))
    assert out["a"].tolist() == [1.0, 1.0] and out["b"].tolist() == [0.0, 0.0]


def test_existing_target_is_replaced() -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), batch_size=2,
                                transform=RenameTransform(["observation"], ["action"]))
    rb.extend(TensorDict(observation=torch.zeros(2), action=torch.ones(2), batch_size=[2]))
    assert sorted(rb[:].keys()) == ["action"] and rb[:]["action"].tolist() == [0.0, 0.0]
