"""VecNorm on low-precision data: the running statistics of float16 / bfloat16 entries are
kept in float32 (a float16 sum of squares overflows to inf on ordinary data, and a checkpoint
holding inf is refused on load), outputs keep the input's dtype, and a batch that would make
the statistics non-finite is refused, the statistics unchanged, so a buffer's checkpoint
always loads back."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.core.testing import assert_same
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import VecNorm
from tdreplay.transforms.vecnorm import stats_dtype


def _obs(n, dtype, seed=0, shape=(3,)):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, *shape, generator=g, dtype=torch.float64) * 3 + 10).to(dtype)


def _reference(batches, decay, eps=1e-4):
    """What VecNorm computes for the last batch, in float64."""
    total = ssq = count = 0.0
    for batch in batches:
        wide = batch.double()
        total = total * decay + wide.sum(0)
        ssq = ssq * decay + wide.pow(2).sum(0)
        count = count * decay + batch.shape[0]
    mean = total / count
    std = (ssq / count - mean.pow(2)).clamp_min(eps).sqrt()
    return (batches[-1].double() - mean) / std


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3,), ()], ids=["features", "scalar"])
def test_low_precision_statistics_stay_finite_and_outputs_keep_the_dtype(dtype, shape):
    # 20 batches of 500 values around 10: a float16 sum of squares passes 65504 in the first
    t = VecNorm(in_keys=["obs"], decay=0.9999)
    batches = [_obs(500, dtype, seed, shape) for seed in range(20)]
    for batch in batches:
        out = t(TensorDict({"obs": batch.clone()}, [500]))["obs"]
    assert out.dtype == dtype and out.shape == batches[-1].shape
    state = t.state_dict()
    assert {v.dtype for v in state.values()} == {torch.float32}
    assert all(bool(torch.isfinite(v).all()) for v in state.values())
    tolerance = 2e-2 if dtype is torch.bfloat16 else 2e-3  # the output's own rounding
    torch.testing.assert_close(out.double(), _reference(batches, 0.9999), atol=tolerance * 8,
                               rtol=tolerance)
    fresh = VecNorm(in_keys=["obs"], decay=0.9999)
    fresh.load_state_dict(state)  # the state a float16 history leaves loads back
    assert_same(fresh.state_dict(), state)


def test_statistics_dtype_follows_the_data_at_least_float32():
    assert stats_dtype(torch.float16) is torch.float32
    assert stats_dtype(torch.bfloat16) is torch.float32
    assert stats_dtype(torch.float32) is torch.float32
    assert stats_dtype(torch.float64) is torch.float64
    t = VecNorm(in_keys=["obs"])
    out = t(TensorDict({"obs": _obs(10, torch.float64)}, [10]))["obs"]
    assert out.dtype == torch.float64 and t.state_dict()["obs_sum"].dtype == torch.float64


def test_denorm_keeps_the_dtype():
    t = VecNorm(in_keys=["obs"], decay=1.0)
    data = TensorDict({"obs": _obs(200, torch.float16)}, [200])
    normalised = t(data.clone())
    back = t.denorm(normalised)["obs"]
    assert back.dtype == torch.float16
    torch.testing.assert_close(back, data["obs"], atol=0.05, rtol=1e-2)


@pytest.mark.parametrize("tmp_kind", ["state_dict", "dumps"])
def test_a_float16_buffer_checkpoint_loads_back(tmp_kind, tmp_path):
    def make():
        return TensorDictReplayBuffer(storage=LazyTensorStorage(1000), batch_size=500,
                                      transform=VecNorm(in_keys=["obs"], decay=0.9999))

    rb = make()
    rb.extend(TensorDict({"obs": _obs(1000, torch.float16)}, [1000]))
    for _ in range(10):
        rb.sample()
    restored = make()
    if tmp_kind == "state_dict":
        restored.load_state_dict(rb.state_dict())
    else:
        rb.dumps(tmp_path)
        restored.loads(tmp_path)
    assert_same(restored.transform.state_dict(), rb.transform.state_dict())
    torch.manual_seed(0)
    expected = rb.sample()["obs"]
    torch.manual_seed(0)
    assert torch.equal(restored.sample()["obs"], expected) and expected.dtype == torch.float16


@pytest.mark.parametrize("bad", ["nan", "inf", "squares-overflow"])
def test_a_batch_making_the_statistics_non_finite_is_refused(bad):
    t = VecNorm(in_keys=["obs", "reward"], decay=0.9)
    t(TensorDict({"obs": _obs(8, torch.float32), "reward": torch.ones(8, 1)}, [8]))
    before = t.state_dict()
    reward = {"nan": float("nan"), "inf": float("inf"), "squares-overflow": 1e20}[bad]
    data = TensorDict({"obs": _obs(8, torch.float32, seed=1),
                       "reward": torch.full((8, 1), reward)}, [8])
    with pytest.raises(ValueError, match="'reward'.*non-finite.*unchanged"):
        t(data)
    assert_same(t.state_dict(), before)  # obs (checked first, fine) unchanged as well
    t.freeze()
    assert t(data.clone())["obs"].shape == (8, 3)  # frozen: nothing to update, nothing refused


def test_saved_low_precision_statistics_load_and_go_on_in_float32():
    # e.g. saved by a VecNorm that kept them in the data's dtype
    state = {"obs_sum": torch.full((3,), 100.0, dtype=torch.float16),
             "obs_ssq": torch.full((3,), 1100.0, dtype=torch.float16),
             "obs_count": torch.tensor([10.0])}
    t = VecNorm(in_keys=["obs"], decay=0.9999)
    t.load_state_dict(state)
    assert t.state_dict()["obs_sum"].dtype == torch.float32
    for seed in range(5):
        t(TensorDict({"obs": _obs(500, torch.float16, seed)}, [500]))
    assert bool(torch.isfinite(t.state_dict()["obs_ssq"]).all())


def test_shared_statistics_in_low_precision_are_refused():
    stats = TensorDict({"obs_sum": torch.zeros(3, dtype=torch.float16),
                        "obs_ssq": torch.zeros(3, dtype=torch.float16),
                        "obs_count": torch.zeros(1)}, []).share_memory_()
    with pytest.raises(ValueError, match=r"shared_td\['obs_sum'\] is torch.float16.*float32"):
        VecNorm(in_keys=["obs"], shared_td=stats)
