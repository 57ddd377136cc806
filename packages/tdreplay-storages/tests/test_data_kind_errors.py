"""Data of another kind than a tensor storage holds raises ``DataKindMismatchError``: a
``TypeError`` as before, and the ``ValueError`` / ``RuntimeError`` TorchRL raises for these
kinds (an ``except ValueError:`` written for TorchRL missed tdreplay's ``TypeError``). The
buffer keeps what it held."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.core import ReplayBuffer
from tdreplay.core.utils import DataKindMismatchError
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


@tensorclass
class Steps:
    obs: torch.Tensor


@tensorclass
class Other:
    obs: torch.Tensor


def _data(kind: str):
    if kind == "tensordict":
        return TensorDict({"obs": torch.ones(3)}, [3])
    if kind == "tensor":
        return torch.ones(3, 2)
    if kind == "dict":
        return {"obs": torch.ones(3)}
    return (Steps if kind == "Steps" else Other)(obs=torch.ones(3), batch_size=[3])


KINDS = [("tensordict", "dict"), ("tensordict", "tensor"), ("tensor", "tensordict"),
         ("tensor", "dict"), ("dict", "tensordict"), ("dict", "tensor"), ("Steps", "Other")]


@pytest.mark.parametrize("held, written", KINDS)
@pytest.mark.parametrize("make", [LazyTensorStorage, LazyMemmapStorage])
def test_another_kind_of_data_is_every_error_torchrl_raises(make, held, written, tmp_path):
    storage = make(8, scratch_dir=tmp_path) if make is LazyMemmapStorage else make(8)
    rb = ReplayBuffer(storage=storage)
    rb.extend(_data(held))
    before = rb[:]
    with pytest.raises(DataKindMismatchError, match=r"this storage holds .*; got ") as caught:
        rb.extend(_data(written))
    assert isinstance(caught.value, TypeError)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, RuntimeError)
    assert len(rb) == 3
    after = rb[:]
    if isinstance(before, torch.Tensor):
        assert torch.equal(after, before)
    elif isinstance(before, dict):
        assert torch.equal(after["obs"], before["obs"])
    else:
        assert torch.equal(after.obs if held == "Steps" else after["obs"],
                           before.obs if held == "Steps" else before["obs"])

