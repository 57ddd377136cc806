"""TorchRL's transforms used in buffers: reshape, reward, normalisation, checks, actions."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import (
    BinarizeReward,
    DiscreteActionProjection,
    DoubleToFloat,
    FiniteTensorDictCheck,
    FlattenObservation,
    ObservationNorm,
    PinMemoryTransform,
    RewardClipping,
    RewardScaling,
    SqueezeTransform,
    gSDENoise,
)


class TestFlattenObservation:
    def test_values_shape_and_out_key(self):
        x = torch.arange(2 * 3 * 4.0).reshape(2, 3, 4)
        out = FlattenObservation(-2, -1, in_keys=["x"], out_keys=["y"])(
            TensorDict({"x": x}, [2]))
        assert out["y"].shape == (2, 12) and out["y"].dtype == torch.float32
        assert torch.equal(out["y"], x.reshape(2, 12))
        assert out["x"].shape == (2, 3, 4)

    def test_default_key_is_pixels(self):
        out = FlattenObservation(-3, -2)(TensorDict({"pixels": torch.zeros(5, 2, 3, 4)}, [5]))
        assert out["pixels"].shape == (5, 6, 4)

    def test_in_a_buffer(self):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=3,
                                    transform=FlattenObservation(-2, -1, in_keys=["x"]))
        rb.extend(TensorDict({"x": torch.randn(6, 4, 5)}, [6]))
        assert rb.sample()["x"].shape == (3, 20)
        assert rb.storage[0]["x"].shape == (4, 5)  # stored unflattened

    @pytest.mark.parametrize("first, last, match", [(0, -1, "first_dim"), (-1, 2, "last_dim"),
                                                    (-1, -2, "first_dim")])
    def test_bad_dims_raise(self, first, last, match):
        with pytest.raises(ValueError, match=match):
            FlattenObservation(first, last, in_keys=["x"])

    def test_dim_out_of_range_names_entry(self):
        with pytest.raises(ValueError, match="'x'"):
            FlattenObservation(-4, -1, in_keys=["x"])(TensorDict({"x": torch.zeros(2, 3)}, [2]))

    def test_not_an_int(self):
        with pytest.raises(TypeError, match="first_dim"):
            FlattenObservation(-1.0, -1, in_keys=["x"])


class TestSqueezeTransform:
    def test_forward_and_inverse(self):
        t = SqueezeTransform(-1, in_keys=["x"], in_keys_inv=["x"])
        out = t(TensorDict({"x": torch.ones(4, 3, 1)}, [4]))
        assert out["x"].shape == (4, 3)
        back = t.inv(TensorDict({"x": torch.ones(4, 3)}, [4]))
        assert back["x"].shape == (4, 3, 1)

    def test_in_buffer_unsqueezes_writes_squeezes_samples(self):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2,
                                    transform=SqueezeTransform(-1, in_keys=["x"],
                                                               in_keys_inv=["x"]))
        rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
        assert rb.storage[0]["x"].shape == (1,)        # unsqueezed on write
        assert rb.sample()["x"].shape == (2,)          # squeezed on sample

    def test_non_singleton_raises(self):
        with pytest.raises(ValueError, match="singleton"):
            SqueezeTransform(-1, in_keys=["x"])(TensorDict({"x": torch.ones(2, 3)}, [2]))

    def test_squeeze_dim_alias_and_missing_dim(self):
        with pytest.warns(DeprecationWarning):
            t = SqueezeTransform(squeeze_dim=-2, in_keys=["x"])
        assert t.squeeze_dim == t.dim == -2
        with pytest.raises(TypeError, match="dim"):
            SqueezeTransform(in_keys=["x"])
        with pytest.raises(ValueError, match="dim"):
            SqueezeTransform(0, in_keys=["x"])


class TestRewardTransforms:
    def test_scaling_affine_and_standard_normal(self):
        td = TensorDict({"reward": torch.tensor([[1.0], [3.0]])}, [2])
        assert RewardScaling(1.0, 2.0)(td.clone())["reward"].flatten().tolist() == [3.0, 7.0]
        out = RewardScaling(1.0, 2.0, standard_normal=True)(td.clone())["reward"]
        assert out.flatten().tolist() == [0.0, 1.0]

    def test_scaling_state_dict_round_trip(self):
        t = RewardScaling(torch.tensor([1.0, 2.0]), 3.0, in_keys=["r"], standard_normal=True)
        with pytest.raises(RuntimeError, match=r"'loc'\] has shape \(2,\)"):  # as TorchRL's
            RewardScaling(0.0, 1.0, in_keys=["r"]).load_state_dict(t.state_dict())
        t2 = RewardScaling(torch.zeros(2), 1.0, in_keys=["r"])
        t2.load_state_dict(t.state_dict())
        td = TensorDict({"r": torch.ones(2, 2)}, [2])
        assert torch.equal(t(td.clone())["r"], t2(td.clone())["r"])
        with pytest.raises(KeyError, match="missing"):
            t2.load_state_dict({"loc": torch.zeros(())})
        with pytest.raises(TypeError, match="scale"):
            RewardScaling(0.0, "2")

    def test_scale_clamped(self):
        assert RewardScaling(0.0, 0.0).scale.item() == pytest.approx(1e-6)

    def test_clipping(self):
        td = TensorDict({"reward": torch.tensor([[-5.0], [0.5], [5.0]])}, [3])
        out = RewardClipping(0.1, 0.9)(td.clone())["reward"]
        assert out.flatten().tolist() == pytest.approx([0.1, 0.5, 0.9])
        assert RewardClipping(clamp_max=0.0)(td.clone())["reward"].flatten().tolist() == [
            -5.0, 0.0, 0.0]
        with pytest.raises(ValueError, match="clamp_min"):
            RewardClipping()
        with pytest.raises(ValueError, match="clamp_min"):
            RewardClipping(1.0, 0.0)

    def test_binarize(self):
        td = TensorDict({"reward": torch.tensor([[-1.0], [0.0], [2.0]])}, [3])
        out = BinarizeReward()(td)["reward"]
        assert out.dtype == torch.int8 and out.flatten().tolist() == [0, 0, 1]
        with pytest.raises(RuntimeError, match="singleton"):
            BinarizeReward()(TensorDict({"reward": torch.zeros(3)}, [3]))

    def test_reward_missing_names_key(self):
        with pytest.raises(KeyError, match="reward"):
            RewardClipping(0.0, 1.0)(TensorDict({"x": torch.zeros(2)}, [2]))


class TestObservationNorm:
    def test_forward_and_inverse_in_buffer(self):
        t = ObservationNorm(loc=1.0, scale=2.0, in_keys=["obs"], in_keys_inv=["obs"])
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4, transform=t)
        rb.extend(TensorDict({"obs": torch.full((4,), 5.0)}, [4]))
        assert rb.storage[0]["obs"].item() == 2.0   # (5 - 1) / 2 on write
        assert rb.sample()["obs"].tolist() == [5.0] * 4  # 2 * 2 + 1 on sample

    def test_init_stats_from_data_and_state_round_trip(self):
        torch.manual_seed(0)
        data = TensorDict({"obs": torch.randn(500, 3) * 4 + 2}, [500])
        t = ObservationNorm(in_keys=["obs"])
        assert not t.initialized
        with pytest.raises(RuntimeError, match="not initialized"):
            t(data.clone())
        t.init_stats_from(data)
        out = t(data.clone())["obs"]
        torch.testing.assert_close(out.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
        torch.testing.assert_close(out.std(0), torch.ones(3), atol=1e-5, rtol=0)
        with pytest.raises(RuntimeError, match="already"):
            t.init_stats_from(data)
        fresh = ObservationNorm(in_keys=["obs"])
        fresh.load_state_dict(t.state_dict())
        assert torch.equal(fresh(data.clone())["obs"], out)

    def test_keep_dims(self):
        data = TensorDict({"px": torch.rand(10, 3, 4, 4)}, [10])
        t = ObservationNorm(in_keys=["px"], standard_normal=True)
        t.init_stats_from(data, reduce_dim=(0, -2, -1), keep_dims=(-2, -1))
        assert t.loc.shape == (3, 1, 1) and t.scale.shape == (3, 1, 1)

    def test_bad_arguments(self):
        with pytest.raises(RuntimeError, match="in_keys"):
            ObservationNorm(loc=0.0, scale=1.0)
        with pytest.raises(ValueError, match="loc and scale"):
            ObservationNorm(loc=0.0, in_keys=["x"])
        with pytest.raises(ValueError, match="reduce_dim"):
            ObservationNorm(in_keys=["x"]).init_stats_from(
                TensorDict({"x": torch.zeros(3, 2)}, [3]), reduce_dim=5)


class TestChecks:
    def test_finite_check_names_entry(self):
        check = FiniteTensorDictCheck()
        td = TensorDict({"a": torch.zeros(2), ("b", "c"): torch.tensor([1.0, float("inf")]),
                         "i": torch.arange(2)}, [2])
        with pytest.raises(ValueError, match="'c'"):
            check(td)
        ok = TensorDict({"a": torch.zeros(2), "i": torch.arange(2)}, [2])
        assert check(ok) is ok

    def test_finite_check_in_buffer_on_sample(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(4), transform=FiniteTensorDictCheck(),
                          batch_size=2)
        rb.extend(TensorDict({"a": torch.tensor([float("nan")] * 2)}, [2]))  # writes pass
        with pytest.raises(ValueError, match="non-finite"):
            rb.sample()

    def test_pin_memory(self):
        out = PinMemoryTransform()(TensorDict({"a": torch.zeros(2)}, [2]))
        assert out["a"].is_pinned() == torch.cuda.is_available()
        assert torch.equal(out["a"], torch.zeros(2))


class TestDoubleToFloat:
    def test_keys_and_automatic(self):
        td = TensorDict({"a": torch.ones(2, dtype=torch.double),
                         "b": torch.ones(2, dtype=torch.double)}, [2])
        out = DoubleToFloat(in_keys=["a"])(td.clone())
        assert out["a"].dtype == torch.float32 and out["b"].dtype == torch.float64
        out = DoubleToFloat()(td.clone())
        assert out["a"].dtype == out["b"].dtype == torch.float32

    def test_in_buffer_stores_double(self):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), batch_size=2,
                                    transform=DoubleToFloat(in_keys=["a"],
                                                            in_keys_inv=["a"]))
        rb.extend(TensorDict({"a": torch.ones(2)}, [2]))
        assert rb.storage[0]["a"].dtype == torch.float64
        assert rb.sample()["a"].dtype == torch.float32


class TestDiscreteActionProjection:
    def test_write_and_sample_sides(self):
        torch.manual_seed(0)
        t = DiscreteActionProjection(num_actions_effective=2, max_actions=4)
        narrow = t.inv(TensorDict({"action": torch.eye(4)}, [4]))["action"]
        assert narrow.dtype == torch.int64 and narrow.shape == (4, 2)
        assert narrow[:2].tolist() == [[1, 0], [0, 1]]
        assert (narrow.sum(-1) == 1).all()  # beyond-range actions drawn among the 2
        wide = t(TensorDict({"action": torch.tensor([[0, 1], [1, 0]])}, [2]))["action"]
        assert wide.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]

    def test_in_buffer(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=3,
                          transform=DiscreteActionProjection(1, 3))
        rb.extend(TensorDict({"action": torch.tensor([[1.0, 0.0, 0.0]] * 3)}, [3]))
        assert rb.storage[0]["action"].tolist() == [1]
        assert rb.sample()["action"].tolist() == [[1, 0, 0]] * 3

    def test_bad_arguments(self):
        with pytest.raises(RuntimeError, match="max_actions"):
            DiscreteActionProjection(3, 2)
        with pytest.raises(ValueError, match="num_actions_effective"):
            DiscreteActionProjection(0, 2)
        with pytest.raises(RuntimeError, match="max_actions=3"):
            DiscreteActionProjection(1, 3).inv(TensorDict({"action": torch.zeros(2, 4)}, [2]))

    def test_without_forward(self):
        t = DiscreteActionProjection(1, 3, include_forward=False)
        td = TensorDict({"action": torch.tensor([[1, 0]])}, [1])
        assert t(td)["action"].tolist() == [[1, 0]]


class TestGSDENoise:
    def test_zeros_and_random(self):
        out = gSDENoise()(TensorDict({}, [3]))["_eps_gSDE"]
        assert out.shape == (3, 1) and (out == 0).all()
        out = gSDENoise(state_dim=4, action_dim=2)(TensorDict({}, [3]))["_eps_gSDE"]
        assert out.shape == (3, 2, 4) and out.dtype == torch.float32 and out.std() > 0

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="state_dim"):
            gSDENoise(state_dim=3)
        with pytest.raises(RuntimeError, match="shape"):
            gSDENoise(shape=(2,))(TensorDict({}, [3]))
