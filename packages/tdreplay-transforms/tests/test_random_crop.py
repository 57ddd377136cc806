"""RandomCropTensorDict: contiguous crops, one start per row, every start reachable, seeded by
the torch RNG, masks, sample_dim, in a buffer; bad input names the argument."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import RandomCropTensorDict


def trajectories(B: int = 3, T: int = 8) -> TensorDict:
    step = torch.arange(B * T).reshape(B, T)
    return TensorDict({"step": step, "obs": step.unsqueeze(-1).float().expand(B, T, 2).clone(),
                       ("next", "reward"): torch.ones(B, T, 1, dtype=torch.float64)}, [B, T])


def test_crops_contiguous_steps_of_each_row():
    td = trajectories()
    out = RandomCropTensorDict(5)(td)
    assert out.batch_size == (3, 5)
    assert out["obs"].shape == (3, 5, 2) and out["obs"].dtype == torch.float32
    assert out["next", "reward"].shape == (3, 5, 1)
    assert out["next", "reward"].dtype == torch.float64
    assert bool((out["step"].diff(dim=-1) == 1).all())
    assert torch.equal(out["step"] // 8, torch.arange(3).unsqueeze(-1).expand(3, 5))  # own row
    assert torch.equal(out["obs"][..., 0].long(), out["step"])
    assert td.batch_size == (3, 8)                         # the input is left as it is


def test_every_start_is_drawn_and_rows_differ():
    torch.manual_seed(0)
    starts = torch.cat([RandomCropTensorDict(5)(trajectories(4))["step"][:, 0] % 8
                        for _ in range(100)])
    assert set(starts.tolist()) == {0, 1, 2, 3}             # 0..T-L, the last one included
    assert RandomCropTensorDict(8)(trajectories())["step"].equal(trajectories()["step"])


def test_seeded_by_the_torch_rng():
    torch.manual_seed(3)
    first = RandomCropTensorDict(3)(trajectories(16))["step"]
    torch.manual_seed(3)
    assert torch.equal(RandomCropTensorDict(3)(trajectories(16))["step"], first)


def test_mask_keeps_crops_within_valid_steps():
    td = trajectories(3, 8)
    td["valid"] = torch.arange(8) < torch.tensor([[3], [8], [5]])
    torch.manual_seed(0)
    for _ in range(30):
        out = RandomCropTensorDict(3, mask_key="valid")(td)
        assert bool(out["valid"].all())
        assert out["step"][0].tolist() == [0, 1, 2]
    missing = RandomCropTensorDict(3, mask_key="absent")(td)  # as TorchRL: no mask, no check
    assert missing.batch_size == (3, 3)


def test_sample_dim():
    td = trajectories(3, 8).transpose(0, 1)                # [T, B]
    with pytest.warns(UserWarning, match="non-negative sample_dim"):
        crop = RandomCropTensorDict(4, sample_dim=0)
    out = crop(td)
    assert out.batch_size == (4, 3)
    assert bool((out["step"].diff(dim=0) == 1).all())
    assert RandomCropTensorDict(2, sample_dim=-2)(td).batch_size == (2, 3)


def test_in_a_buffer_of_trajectories():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4,
                                transform=RandomCropTensorDict(sub_seq_len=3))
    rb.extend(trajectories(5, 8))
    sample = rb.sample()
    assert sample.batch_size == (4, 3)
    assert bool((sample["step"].diff(dim=-1) == 1).all())
    assert rb.storage[:5]["step"].shape == (5, 8)           # stored whole


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"sub_seq_len": 0}, ValueError, "sub_seq_len"),
    ({"sub_seq_len": 2.5}, ValueError, "sub_seq_len"),
    ({"sub_seq_len": 2, "sample_dim": "time"}, TypeError, "sample_dim"),
    ({"sub_seq_len": 2, "mask_key": 3}, TypeError, "mask_key"),
])
def test_bad_arguments_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        RandomCropTensorDict(**kwargs)


def test_bad_data_is_refused_and_left_unchanged():
    td = trajectories(2, 4)
    before = td.clone()
    with pytest.raises(RuntimeError, match="sub_seq_len=5"):
        RandomCropTensorDict(5)(td)
    with pytest.raises(ValueError, match="sample_dim=-3"):
        RandomCropTensorDict(2, sample_dim=-3)(td)
    with pytest.raises(RuntimeError, match="empty batch_size"):
        RandomCropTensorDict(2)(td[0, 0])
    td["valid"] = torch.ones(2, 4, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="batch shape"):
        RandomCropTensorDict(2, mask_key="valid")(td)
    td["valid"] = torch.arange(4) < torch.tensor([[4], [1]])
    with pytest.raises(RuntimeError, match="1 valid steps"):
        RandomCropTensorDict(2, mask_key="valid")(td)
    assert (td.exclude("valid") == before).all() and td.batch_size == (2, 4)
    with pytest.raises(TypeError, match="RandomCropTensorDict"):
        RandomCropTensorDict(2)(torch.zeros(3, 4))
