"""A copy of a prefetching buffer samples as the original would, also over a memory-mapped
storage: ``copy.deepcopy`` gives the copy its own storage, whose making counts as a restore
(``shared_reset_count``), and the copy dropped the batches it had drawn ahead."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def _buffer(make) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=make(), batch_size=4, prefetch=3,
                                generator=torch.Generator().manual_seed(0))
    rb.extend(TensorDict({"a": torch.arange(40.0)}, [40]))
    rb.sample()
    return rb


@pytest.mark.parametrize("make", [lambda: LazyMemmapStorage(64), lambda: LazyTensorStorage(64)])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_samples_as_the_original(make, how):
    original = _buffer(make)
    copied = copy.deepcopy(original) if how == "deepcopy" else \
        pickle.loads(pickle.dumps(original))
    ahead = [original.sample()["index"].tolist() for _ in range(4)]
    assert [copied.sample()["index"].tolist() for _ in range(4)] == ahead

