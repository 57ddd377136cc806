"""VecNorm: running statistics, freezing, state, denorm, conversion to ObservationNorm."""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import ObservationNorm, VecNorm


def batch(n: int = 200, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"obs": torch.randn(n, 3, generator=g) * 3 + 1,
                       "reward": torch.randn(n, 1, generator=g)}, [n])


def test_statistics_match_the_formula():
    t = VecNorm(in_keys=["obs"], decay=0.5)
    a, b = batch(10, 0), batch(10, 1)
    t(a.clone())
    out = t(b.clone())["obs"]
    total = 0.5 * a["obs"].sum(0) + b["obs"].sum(0)
    ssq = 0.5 * a["obs"].pow(2).sum(0) + b["obs"].pow(2).sum(0)
    count = 0.5 * 10 + 10
    mean = total / count
    std = (ssq / count - mean.pow(2)).clamp_min(1e-4).sqrt()
    torch.testing.assert_close(out, (b["obs"] - mean) / std)
    torch.testing.assert_close(t.loc["obs"], mean)
    torch.testing.assert_close(t.scale["obs"], std)
    assert t.state_dict()["obs_count"].item() == pytest.approx(15.0)


def test_default_keys_skip_absent_and_dtype():
    t = VecNorm()
    out = t(TensorDict({"observation": torch.randn(8, 2)}, [8]))
    assert out["observation"].dtype == torch.float32 and out["observation"].shape == (8, 2)
    assert sorted(t.state_dict()) == ["observation_count", "observation_ssq", "observation_sum"]


def test_freeze_keeps_statistics():
    t = VecNorm(in_keys=["obs"])
    t(batch(50, 0))
    before = t.state_dict()
    t.freeze()
    t(batch(50, 1))
    after = t.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    t.unfreeze()
    t(batch(50, 2))
    assert not torch.equal(before["obs_sum"], t.state_dict()["obs_sum"])


def test_frozen_copy_is_independent():
    t = VecNorm(in_keys=["obs"])
    with pytest.raises(RuntimeError, match="no data"):
        t.frozen_copy()
    t(batch(50, 0))
    copy = t.frozen_copy()
    t(batch(50, 1))
    assert copy.frozen and not torch.equal(copy.state_dict()["obs_sum"],
                                           t.state_dict()["obs_sum"])


def test_state_round_trip_and_checks():
    t = VecNorm(in_keys=["obs", ("nested", "x")])
    t(TensorDict({"obs": torch.randn(20, 3), ("nested", "x"): torch.randn(20, 2)}, [20]))
    state = t.state_dict()
    assert "nested.x_sum" in state
    fresh = VecNorm(in_keys=["obs", ("nested", "x")]).freeze()
    fresh.load_state_dict(state)
    td = TensorDict({"obs": torch.randn(5, 3), ("nested", "x"): torch.randn(5, 2)}, [5])
    t.freeze()
    assert torch.equal(fresh(td.clone())["obs"], t(td.clone())["obs"])
    with pytest.raises(KeyError, match="other_sum"):
        fresh.load_state_dict({"other_sum": torch.zeros(3)})
    with pytest.raises(TypeError, match="obs_sum"):
        fresh.load_state_dict({"obs_sum": [0.0]})


def test_denorm_and_observation_norm():
    t = VecNorm(in_keys=["obs"], out_keys=["obs_norm"])
    data = batch(100)
    out = t(data.clone())
    back = t.denorm(out.exclude("obs"))
    torch.testing.assert_close(back["obs"], data["obs"], atol=1e-4, rtol=1e-4)
    norm = t.to_observation_norm()
    assert isinstance(norm, ObservationNorm) and norm.standard_normal
    torch.testing.assert_close(norm(data.clone())["obs_norm"], out["obs_norm"])


def test_in_buffer_with_prefetch_threads():
    t = VecNorm(in_keys=["obs"], lock=threading.Lock())
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=16, transform=t,
                                prefetch=2)
    rb.extend(batch(100))
    for _ in range(5):
        s = rb.sample()
        assert s["obs"].shape == (16, 3)
    assert t.state_dict()["obs_count"].item() > 16


def test_shared_td_updated_in_place():
    shared = TensorDict({"obs_sum": torch.zeros(3), "obs_ssq": torch.zeros(3),
                         "obs_count": torch.zeros(1)}, []).share_memory_()
    t = VecNorm(in_keys=["obs"], shared_td=shared)
    t(batch(10))
    assert shared["obs_count"].item() == pytest.approx(10.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="decay"):
        VecNorm(decay=1.5)
    with pytest.raises(ValueError, match="eps"):
        VecNorm(eps=-1)
    with pytest.raises(ValueError, match="shapes"):
        VecNorm(in_keys=["a"], shapes=[(1,), (2,)])
    with pytest.raises(RuntimeError, match="shared"):
        VecNorm(in_keys=["obs"], shared_td=TensorDict({"obs_sum": torch.zeros(1)}, []))
    with pytest.raises(NotImplementedError, match="VecNormV2"):
        VecNorm(new_api=True)
    with pytest.raises(RuntimeError, match="no statistics"):
        _ = VecNorm(in_keys=["obs"]).loc
