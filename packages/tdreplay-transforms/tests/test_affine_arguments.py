"""``RewardScaling`` / ``ObservationNorm`` refuse at construction the ``loc`` / ``scale``
their saved states refuse (non-finite, not broadcasting together): built with them, a buffer
saved a checkpoint (``dumps``, ``state_dict``) that no buffer built the same way could load.
``RewardClipping`` gives torch's promoted dtype, as TorchRL's: int bounds keep an integer reward
integer, float bounds make it float (it was cast back to the integer dtype, which clipped at
the bounds rounded)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import ObservationNorm, RewardClipping, RewardScaling

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("loc, scale, match", [
    (0.0, NAN, "scale must be finite, got nan"),
    (NAN, 1.0, "loc must be finite, got nan"),
    (torch.tensor(INF), 1.0, "loc must be finite, got inf"),
    (torch.zeros(3), torch.tensor([1.0, INF, 1.0]), "scale must be finite, got non-finite"),
    (torch.zeros(3), torch.ones(2), r"loc of shape \(3,\) and scale of shape \(2,\) do not"),
])
@pytest.mark.parametrize("cls", [RewardScaling, ObservationNorm])
def test_unusable_loc_and_scale_are_refused_at_construction(cls, loc, scale, match):
    with pytest.raises(ValueError, match=f"{cls.__name__}: {match}"):
        cls(loc, scale, in_keys=["obs"])


def test_a_buffer_built_with_finite_values_saves_a_checkpoint_it_loads(tmp_path):
    def make():
        return TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4,
                                      transform=ObservationNorm(0.0, 2.0, in_keys=["obs"]))
    rb = make()
    rb.extend(TensorDict({"obs": torch.arange(8.0)}, [8]))
    rb.dumps(tmp_path / "ckpt")
    restored = make()
    restored.loads(tmp_path / "ckpt")
    assert restored.storage[:8]["obs"].tolist() == list(range(8))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_clipping_keeps_an_integer_reward_integer(dtype):
    reward = torch.tensor([-5, 0, 5], dtype=dtype)
    out = RewardClipping(-1, 1)(TensorDict({"reward": reward}, [3]))["reward"]
    assert out.dtype == dtype and out.tolist() == [-1, 0, 1]
    half = RewardClipping(-1.0, 1.0)(TensorDict({"reward": reward.half()}, [3]))["reward"]
    assert half.dtype == torch.float16


def test_float_bounds_of_an_integer_reward_give_floats_as_torchrl():
    # cast back to int64, RewardClipping(-1.5, 1.5) clipped at -1 and 1
    reward = torch.tensor([-3, -2, -1, 0, 1, 2])
    out = RewardClipping(-1.5, 1.5)(TensorDict({"reward": reward}, [6]))["reward"]
    assert out.dtype == torch.get_default_dtype()
    assert out.tolist() == [-1.5, -1.5, -1.0, 0.0, 1.0, 1.5]


@pytest.mark.parametrize("cls", [RewardScaling, ObservationNorm])
def test_a_loc_and_scale_that_would_change_the_entrys_shape_are_refused(cls):
    """As TorchRL's, a [B, 1] reward scaled by a [5] scale became [B, 5], silently."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2,
                                transform=cls(torch.zeros(5), torch.ones(5), in_keys=["obs"]))
    rb.extend(TensorDict({"obs": torch.ones(4, 1)}, [4]))
    with pytest.raises(ValueError, match=r"would turn an entry of shape \(2, 1\) into \(2, 5\)"):
        rb.sample()
    assert len(rb) == 4 and rb.storage[:4]["obs"].shape == (4, 1)
    fits = cls(torch.zeros(1), torch.full((1,), 2.0), in_keys=["obs"])
    assert fits(TensorDict({"obs": torch.ones(4, 1)}, [4]))["obs"].shape == (4, 1)
