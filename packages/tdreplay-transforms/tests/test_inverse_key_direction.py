"""The inverse of a transform with ``in_keys_inv`` and ``out_keys_inv`` reads
``out_keys_inv`` and writes ``in_keys_inv``, as TorchRL's ``Transform._inv_call`` (the names
outside, in the data given to ``extend``, are mapped back to the stored names). The stored
values below are TorchRL 0.14.1's for the same buffers. Before, tdreplay read ``in_keys_inv``
and wrote ``out_keys_inv``: the same pipelines stored other entries, silently."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import (
    DeviceCastTransform,
    DoubleToFloat,
    ObservationNorm,
    SqueezeTransform,
    UnsqueezeTransform,
)


def _data() -> TensorDict:
    return TensorDict({"a": torch.full((2, 1), 10.0), "b": torch.full((2, 1), 20.0),
                       "a64": torch.full((2, 1), 10.0, dtype=torch.float64)}, [2])


def _stored(transform) -> TensorDict:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), transform=transform)
    rb.extend(_data())  # (a buffer's transform runs its inverse on extend)
    return rb.storage[:2]


def test_observation_norm_maps_the_outside_name_back():
    stored = _stored(ObservationNorm(1.0, 2.0, in_keys=["a"], in_keys_inv=["a"],
                                     out_keys_inv=["b"]))
    assert stored["a"].flatten().tolist() == [9.5, 9.5]  # (20 - 1) / 2, from "b"
    assert stored["b"].flatten().tolist() == [20.0, 20.0]


def test_double_to_float_casts_the_outside_entry_back_to_double():
    stored = _stored(DoubleToFloat(in_keys_inv=["a64"], out_keys_inv=["b"]))
    assert stored["a64"].dtype == torch.float64 and stored["a64"].flatten().tolist() == [20.0] * 2
    assert stored["b"].dtype == torch.float32


@pytest.mark.parametrize("cls, shape_a, shape_b", [(UnsqueezeTransform, (2,), (2, 1)),
                                                    (SqueezeTransform, (2, 1, 1), (2, 1))])
def test_squeeze_and_unsqueeze_write_the_stored_name(cls, shape_a, shape_b):
    stored = _stored(cls(-1, in_keys_inv=["a"], out_keys_inv=["b"]))
    assert stored["a"].shape == shape_a and stored["b"].shape == shape_b


def test_device_cast_moves_the_outside_entry_back():
    t = DeviceCastTransform("cpu", "cpu", in_keys_inv=["x"], out_keys_inv=["y"])
    back = t.inv(TensorDict({"y": torch.ones(2)}, [2]))
    assert back["x"].tolist() == [1.0, 1.0] and back["x"].device == torch.device("cpu")


def test_a_missing_outside_entry_raises_naming_it():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), transform=ObservationNorm(
        1.0, 2.0, in_keys=["a"], in_keys_inv=["a"], out_keys_inv=["c"]))
    with pytest.raises(KeyError, match="'c' is missing"):
        rb.extend(_data())
    assert len(rb) == 0
