"""CatTensors, UnsqueezeTransform, DTypeCastTransform, DeviceCastTransform."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import (
    CatTensors,
    DeviceCastTransform,
    DTypeCastTransform,
    SqueezeTransform,
    UnsqueezeTransform,
)
from tdreplay.transforms.tensors import DimOutOfRangeError, PositiveDimError


def td3() -> TensorDict:
    return TensorDict({
        "pos": torch.arange(6.0).reshape(3, 2),
        ("agent", "vel"): torch.arange(9.0).reshape(3, 3) + 100,
        "reward": torch.tensor([1.0, 2.0, 3.0]),
        "step": torch.arange(3),
    }, [3])


class TestCatTensors:
    def test_sorted_concatenation_with_unsqueeze(self):
        out = CatTensors(["pos", "reward", ("agent", "vel")], "obs")(td3())
        # sorted order: "agent.vel", "pos", "reward"
        expected = torch.cat([torch.arange(9.0).reshape(3, 3) + 100,
                              torch.arange(6.0).reshape(3, 2),
                              torch.tensor([[1.0], [2.0], [3.0]])], -1)
        assert torch.equal(out["obs"], expected)
        assert "pos" not in out.keys() and ("agent", "vel") not in out.keys(True, True)

    def test_given_order_and_keep_keys(self):
        out = CatTensors(["reward", "pos"], ("nested", "obs"), sort=False, del_keys=False)(td3())
        assert out["nested", "obs"][:, 0].tolist() == [1.0, 2.0, 3.0]
        assert out["nested", "obs"].shape == (3, 3)
        assert "pos" in out.keys()

    def test_other_dim(self):
        td = TensorDict({"a": torch.zeros(2, 3, 4), "b": torch.ones(2, 5, 4)}, [2])
        out = CatTensors(["a", "b"], "c", dim=-2)(td)
        assert out["c"].shape == (2, 8, 4)
        assert out["c"][:, 3:].eq(1).all() and out["c"][:, :3].eq(0).all()

    def test_unsqueeze_if_oor_gives_entries_the_dimension_they_lack(self):
        td = TensorDict({"key1": torch.zeros(1), "key2": torch.ones(1)}, [])  # TorchRL's example
        out = CatTensors(in_keys=["key1", "key2"], dim=-2, unsqueeze_if_oor=True)(td)
        assert out["observation_vector"].tolist() == [[0.0], [1.0]]
        td = TensorDict({"key1": torch.zeros(1), "key2": torch.ones(1)}, [])
        with pytest.raises(ValueError, match="cannot concatenate"):
            CatTensors(in_keys=["key1", "key2"], dim=-2)(td)

    def test_errors(self):
        with pytest.raises(KeyError, match="missing"):
            CatTensors(["pos", "missing"], "obs")(td3())
        with pytest.raises(ValueError, match="in_keys"):
            CatTensors(None, "obs")
        with pytest.raises(ValueError, match="negative"):
            CatTensors(["pos"], "obs", dim=1)
        td = TensorDict({"a": torch.zeros(2, 3, 4), "b": torch.ones(2, 5, 3)}, [2])
        with pytest.raises(ValueError, match="cannot concatenate"):
            CatTensors(["a", "b"], "c")(td)
        with pytest.raises(ValueError, match="cannot concatenate"):
            CatTensors(["pos", "reward"], "obs", unsqueeze_if_needed=False)(td3())


class TestUnsqueeze:
    def test_forward_and_inverse(self):
        t = UnsqueezeTransform(-1, in_keys=["reward", ("agent", "vel")], out_keys=["r", "v"],
                               in_keys_inv=["reward_back"], out_keys_inv=["r"])
        out = t(td3())
        assert out["r"].shape == (3, 1) and out["v"].shape == (3, 3, 1)
        assert torch.equal(out["r"][:, 0], out["reward"])
        back = t.inv(out)  # (TorchRL's direction: out_keys_inv read, in_keys_inv written)
        assert back["reward_back"].shape == (3,)
        assert "reward_back" not in out.keys()  # inverse works on a copy

    def test_positive_dim_needs_opt_in(self):
        with pytest.raises(ValueError, match="allow_positive_dim"):
            UnsqueezeTransform(1, in_keys=["pos"])
        # TorchRL raises RuntimeError: the error is both
        for cls in (UnsqueezeTransform, SqueezeTransform):
            with pytest.raises(RuntimeError, match="allow_positive_dim") as info:
                cls(0, in_keys=["pos"])
            assert type(info.value) is PositiveDimError
            assert isinstance(info.value, ValueError)
        out = UnsqueezeTransform(1, allow_positive_dim=True, in_keys=["pos"])(td3())
        assert out["pos"].shape == (3, 1, 2)

    def test_errors(self):
        with pytest.raises(KeyError, match="nope"):
            UnsqueezeTransform(-1, in_keys=["nope"])(td3())
        with pytest.raises(ValueError, match="same length"):
            UnsqueezeTransform(-1, in_keys=["a", "b"], out_keys=["c"])
        with pytest.raises(ValueError, match="out of range"):
            UnsqueezeTransform(-4, in_keys=["reward"])(td3())
        with pytest.raises(IndexError, match="out of range"):  # torch's (TorchRL's) class
            UnsqueezeTransform(-4, in_keys=["reward"])(td3())
        with pytest.raises(DimOutOfRangeError, match="no dimension at dim=-3"):
            UnsqueezeTransform(-3, in_keys_inv=["pos"]).inv(td3())
        with pytest.raises(ValueError, match="no singleton"):  # SqueezeTransform's forward
            SqueezeTransform(-1, in_keys=["pos"])(td3())

    def test_inverse_keeps_a_non_singleton_dim_as_torchrl(self):
        # TorchRL's inverse is tensor.squeeze(dim): a no-op on a dim of size > 1
        out = UnsqueezeTransform(-1, in_keys_inv=["pos", "reward", "step"]).inv(
            td3().set("step", torch.arange(3).unsqueeze(-1)))
        assert out["pos"].shape == (3, 2) and out["reward"].shape == (3,)
        assert out["step"].shape == (3,) and out["step"].tolist() == [0, 1, 2]
        assert torch.equal(out["pos"], torch.arange(6.0).reshape(3, 2))

    def test_inverse_in_a_buffer(self):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                    transform=UnsqueezeTransform(-1, in_keys_inv=["act"]))
        rb.extend(TensorDict({"act": torch.arange(4), "obs": torch.zeros(4, 3)}, [4]))
        stored = rb.storage[:]
        assert stored["act"].shape == (4,) and stored["act"].tolist() == [0, 1, 2, 3]
        assert stored["obs"].shape == (4, 3)
        rb2 = TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                     transform=UnsqueezeTransform(-2, in_keys_inv=["act"]))
        rb2.extend(TensorDict({"act": torch.arange(4.0).reshape(4, 1, 1)}, [4]))
        assert rb2.storage[:]["act"].shape == (4, 1)
        before = buffer_snapshot(rb2)
        with pytest.raises(DimOutOfRangeError):  # act [4] has no dim -2: nothing written
            rb2.extend(TensorDict({"act": torch.arange(4.0)}, [4]))
        assert_same(buffer_snapshot(rb2), before, "buffer state")


class TestDTypeCast:
    def test_all_entries_of_dtype_and_mirror_inverse(self):
        t = DTypeCastTransform(torch.float32, torch.float16)
        out = t(td3())
        assert out["pos"].dtype == torch.float16 and out["agent", "vel"].dtype == torch.float16
        assert out["step"].dtype == torch.int64
        back = t.inv(out)
        assert back["pos"].dtype == torch.float32
        assert torch.equal(back["pos"], td3()["pos"])
        assert out["pos"].dtype == torch.float16  # inverse on a copy

    def test_listed_keys(self):
        t = DTypeCastTransform(torch.int64, torch.float64, in_keys=["step"], out_keys=["stepf"],
                               in_keys_inv=["step_back"], out_keys_inv=["stepf"])
        out = t(td3())
        assert out["stepf"].dtype == torch.float64 and out["pos"].dtype == torch.float32
        assert t.inv(out)["step_back"].dtype == torch.int64
        listed_no_inv = DTypeCastTransform(torch.float32, torch.float64, in_keys=["pos"])
        data = td3()
        assert listed_no_inv.inv(data) is data

    def test_errors(self):
        with pytest.raises(KeyError, match="absent"):
            DTypeCastTransform(torch.float32, torch.float64, in_keys=["absent"])(td3())
        with pytest.raises(TypeError, match="dtype_out"):
            DTypeCastTransform(torch.float32, "float64")


class TestDeviceCast:
    def test_whole_tensordict_and_back(self):
        # (meta tensors hold no data, so the round trip goes cpu -> meta on each side)
        out = DeviceCastTransform("meta", "cpu")(td3())
        assert out.device == torch.device("meta") and out["pos"].device.type == "meta"
        data = td3()
        written = DeviceCastTransform("cpu", orig_device="meta").inv(data)
        assert written.device == torch.device("meta") and written["pos"].device.type == "meta"
        assert data["pos"].device.type == "cpu"
        some = DeviceCastTransform("cpu", "meta", in_keys_inv=["pos"]).inv(data)
        assert some["pos"].device.type == "meta" and some["reward"].device.type == "cpu"
        assert data["pos"].device.type == "cpu"

    def test_some_keys(self):
        td = td3().to("cpu")  # a TensorDict with a device
        out = DeviceCastTransform("meta", in_keys=["pos"])(td)
        assert out["pos"].device.type == "meta" and out["reward"].device.type == "cpu"
        assert DeviceCastTransform("meta").inv(td) is td  # no orig_device: nothing on extend

    def test_missing_key(self):
        with pytest.raises(KeyError, match="absent"):
            DeviceCastTransform("cpu", in_keys=["absent"])(td3())
