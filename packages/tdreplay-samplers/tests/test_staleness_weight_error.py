"""Weights ``StalenessAwareSampler`` cannot draw from raise a ``StalenessWeightError``: a
``ValueError`` (as before) and the ``RuntimeError`` TorchRL raises there."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import StalenessAwareSampler
from tdreplay.samplers.staleness import StalenessWeightError
from tdreplay.storages import LazyTensorStorage

FNS = {
    "not finite (repro)": (lambda s: 1.0 / (1.0 + s), "finite weight"),
    "negative": (lambda s: -torch.ones_like(s), "finite weight"),
    "nan": (lambda s: s * float("nan"), "finite weight"),
    "wrong shape": (lambda s: torch.ones(1), "finite weight"),
    "all zero": (lambda s: s * 0.0, "weight 0 to every one"),
}


def _rb(fn) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                sampler=StalenessAwareSampler(staleness_weight_fn=fn),
                                batch_size=3)
    rb.extend(TensorDict({"x": torch.arange(6.0),
                          "policy_version": torch.tensor([0, 0, 1, 2, 3, 3])}, [6]))
    return rb


@pytest.mark.parametrize("name", list(FNS))
@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_bad_weights_are_runtime_and_value_errors(name: str, error: type) -> None:
    fn, match = FNS[name]
    rb = _rb(fn)
    with pytest.raises(error, match=match) as info:
        rb.sample()
    assert type(info.value) is StalenessWeightError
    assert rb.sampler.state_dict() == {"consumer_version": 0, "max_staleness": -1}


def test_fine_weights_still_sample() -> None:
    rb = _rb(lambda s: 1.0 / (1.0 + s.clamp_min(0)))
    assert rb.sample().batch_size == torch.Size([3])
