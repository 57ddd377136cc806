"""A dropped ReplayBufferEnsemble is freed, with its members' storages, by its last reference
going, without a gc pass (no reference cycle through its collate function)."""

from __future__ import annotations

import gc
import weakref

import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.storages import LazyTensorStorage


def test_last_reference_frees_the_ensemble_and_its_storages():
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        members = [TensorDictReplayBuffer(storage=LazyTensorStorage(10)) for _ in range(2)]
        for i, rb in enumerate(members):
            rb.extend(TensorDict(obs=torch.full((4, 2), float(i)), batch_size=[4]))
        ensemble = ReplayBufferEnsemble(*members, batch_size=4)
        batch = ensemble.sample()
        assert batch["obs"].shape == torch.Size([2, 2, 2])
        assert ensemble[:, 0]["obs"][:, 0].tolist() == [0.0, 1.0]
        refs = [weakref.ref(ensemble)] + [weakref.ref(rb.storage) for rb in members]
        del ensemble, members, rb, batch
        assert [r() for r in refs] == [None, None, None]
    finally:
        if enabled:
            gc.enable()


def test_parts_collate_applies_each_buffers_transform():
    doubled = ReplayBuffer(storage=LazyTensorStorage(4), transform=lambda x: x * 2)
    plain = ReplayBuffer(storage=LazyTensorStorage(4))
    doubled.extend(torch.ones(2))
    plain.extend(torch.ones(2))
    ensemble = ReplayBufferEnsemble(doubled, plain)
    assert ensemble[:, 0].tolist() == [2.0, 1.0]
