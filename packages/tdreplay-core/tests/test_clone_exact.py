"""``tdreplay.core.utils.clone_exact``: copies bit for bit where ``TensorDict.clone()`` (tensordict
0.15, a TensorDict with a device) turns ``-0.0`` into ``+0.0`` and quiets signalling NaNs (the
buffer's copy-on-read uses it: see tdreplay-storages' test_negative_zero_copies.py)."""

from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict, tensorclass

from tdreplay.core.utils import clone_exact

NEG_ZERO = torch.tensor([-0.0, 1.0, -0.0])
SIGNALLING_NAN = torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32)


@tensorclass
class _Step:
    obs: torch.Tensor
    label: str


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_tensordict_leaves_are_copied_bit_for_bit(device):
    td = TensorDict({"x": NEG_ZERO.clone(), "nested": {"nan": SIGNALLING_NAN.expand(3).clone()},
                     "flag": torch.tensor([True, False, True]),
                     "name": NonTensorData("run-1", batch_size=[3])}, [3], device=device,
                    names=["time"])
    copy = clone_exact(td)
    assert type(copy) is TensorDict and copy.batch_size == (3,) and copy.names == ["time"]
    assert copy.device == td.device
    assert torch.equal(torch.signbit(copy["x"]), torch.tensor([True, False, True]))
    assert torch.equal(_bits(copy["nested", "nan"]), _bits(td["nested", "nan"]))
    assert copy["flag"].tolist() == [True, False, True] and copy["name"] == "run-1"
    for key in ("x", ("nested", "nan"), "flag"):
        assert copy[key].data_ptr() != td[key].data_ptr()  # memory of its own
    copy["x"].fill_(5.0)
    assert td["x"].tolist() == [-0.0, 1.0, -0.0]


def test_lazy_stacks_tensorclasses_and_tensors():
    stack = LazyStackedTensorDict(*(TensorDict({"x": NEG_ZERO[i:i + 1].clone()}, [1],
                                               device="cpu") for i in range(3)), stack_dim=0)
    copy = clone_exact(stack)
    assert isinstance(copy, LazyStackedTensorDict)
    assert torch.signbit(copy["x"]).reshape(-1).tolist() == [True, False, True]
    step = _Step(obs=NEG_ZERO.clone(), label="a", batch_size=[3], device="cpu")
    copied = clone_exact(step)
    assert type(copied) is _Step and copied.label == "a"
    assert torch.signbit(copied.obs).tolist() == [True, False, True]
    assert copied.obs.data_ptr() != step.obs.data_ptr()
    tensor = clone_exact(NEG_ZERO)
    assert torch.signbit(tensor).tolist() == [True, False, True]
    assert tensor.data_ptr() != NEG_ZERO.data_ptr()


def test_gradients_flow_through_the_copy():
    weight = torch.tensor([2.0, -0.0], requires_grad=True)
    copy = clone_exact(TensorDict({"w": weight * 1.0}, [2], device="cpu"))
    copy["w"].sum().backward()
    assert weight.grad.tolist() == [1.0, 1.0]


def test_other_objects_are_refused():
    with pytest.raises(TypeError, match="clone_exact copies tensors and tensor collections, "
                                        "got list"):
        clone_exact([NEG_ZERO])

