"""Tensors that are views with a lazy bit (a conjugate view ``x.conj()``, a negative view of
its imaginary part) are stored by their values in a ``CompressedListStorage``: the raw byte
view of a conjugate view raised torch's ``RuntimeError``."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import CompressedListStorage


def views() -> dict[str, torch.Tensor]:
    z = torch.randn(3, 2, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    return {"conj": z.conj(), "neg_imag": z.conj().imag}


@pytest.mark.parametrize("name", ["conj", "neg_imag"])
def test_views_round_trip_by_value(name):
    x = views()[name]
    rb = ReplayBuffer(storage=CompressedListStorage(10))
    rb.extend(TensorDict({"c": x}, [3]))  # the batch path
    rb.add(TensorDict({"c": x[0]}, []))  # one row
    stored = rb[:]
    assert torch.equal(stored[:3]["c"], x.resolve_conj().resolve_neg())
    assert torch.equal(stored[3]["c"], x[0].resolve_conj().resolve_neg())
    assert not stored["c"].is_conj()


def test_conj_view_tensor_rows_round_trip():
    x = views()["conj"]
    storage = CompressedListStorage(4)
    storage.set(torch.arange(3), x)
    assert torch.equal(storage.get(torch.arange(3)), x.resolve_conj())
