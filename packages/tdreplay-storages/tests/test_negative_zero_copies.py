"""Copies of a tensor storage's rows are bit-exact: ``-0.0`` keeps its sign through ``rb[:]``,
``rb[0]``, ``rb[0:2]`` and a ``state_dict`` round trip. They used to go through
``TensorDict.clone()``, which in tensordict 0.15 copies the leaves of a TensorDict with a device
with ``x + 0`` and so turned ``-0.0`` into ``+0.0`` (and quieted signalling NaNs)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

VALUES = [-0.0, 1.0, -0.0, -2.5]
SIGNALLING_NAN = 0x7F800001  # (float32 bits: x + 0 sets the quiet bit, 0x7FC00001)


def _storage(kind, tmp_path):
    return LazyTensorStorage(6) if kind == "lazy" else LazyMemmapStorage(
        6, scratch_dir=tmp_path / "rb")


def _data() -> TensorDict:
    bits = torch.tensor([SIGNALLING_NAN, 0, 0, 0], dtype=torch.int32)
    return TensorDict({"o": torch.tensor(VALUES), ("n", "p"): torch.tensor(VALUES).double(),
                       "nan": bits.view(torch.float32)}, [4])


def _check(td: TensorDict, rows) -> None:
    expected = torch.signbit(torch.tensor(VALUES))[rows]
    assert torch.equal(torch.signbit(td["o"]), expected)
    assert torch.equal(torch.signbit(td["n", "p"]), expected)
    assert td["o"].tolist() == torch.tensor(VALUES)[rows].tolist()
    assert torch.equal(td["nan"].view(torch.int32),
                       _data()["nan"].view(torch.int32)[rows])  # bit for bit


@pytest.mark.parametrize("kind", ["lazy", "memmap"])
def test_reads_of_a_buffer_keep_the_sign_of_zero(kind, tmp_path):
    rb = TensorDictReplayBuffer(storage=_storage(kind, tmp_path))
    rb.extend(_data())
    _check(rb[:], slice(None))
    _check(rb[0], 0)
    _check(rb[0:2], slice(0, 2))
    _check(rb[torch.tensor([2, 0])], [2, 0])
    first = rb[0:2]
    first["o"].fill_(7.0)  # (still copies: the storage is untouched)
    _check(rb[:], slice(None))


@pytest.mark.parametrize("kind", ["lazy", "memmap"])
def test_state_dict_round_trip_keeps_the_sign_of_zero(kind, tmp_path):
    rb = TensorDictReplayBuffer(storage=_storage(kind, tmp_path))
    rb.extend(_data())
    state = rb.state_dict()
    _check(state["_storage"]["storage"], slice(None))
    restored = TensorDictReplayBuffer(storage=LazyTensorStorage(6))
    restored.load_state_dict(state)
    _check(restored.storage[:4], slice(None))
    _check(restored[:], slice(None))


def test_a_buffer_of_plain_tensors_keeps_the_sign_of_zero():
    rb = ReplayBuffer(storage=LazyTensorStorage(6))
    rb.extend(torch.tensor(VALUES))
    assert torch.equal(torch.signbit(rb[:]), torch.signbit(torch.tensor(VALUES)))
    assert torch.signbit(rb[0]).item()
