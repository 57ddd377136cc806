"""Differential fuzzing of the storage checkpointers.

For seeded configurations (Flat / Nested / H5 / Tensor checkpointer, Lazy tensor or memmap
storage, ndim 1 or 2, tensor / TED TensorDict / tensorclass / tuple / dict data, dtypes
float32, float16, bfloat16, bool, uint8, int64, complex64), a buffer is written, ``dumps``
then ``loads`` into a fresh buffer; both must hold bitwise the same rows, and must go on
identically (same slots for the next extend, same rows, same seeded sample).
"""

from __future__ import annotations

import random
import tempfile

import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import (
    FlatStorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    TensorStorageCheckpointer,
)

try:
    import h5py  # noqa: F401

    from tdreplay.storages import H5StorageCheckpointer
    CHECKPOINTERS = [FlatStorageCheckpointer, NestedStorageCheckpointer, H5StorageCheckpointer,
                     TensorStorageCheckpointer]
except ImportError:  # pragma: no cover
    CHECKPOINTERS = [FlatStorageCheckpointer, NestedStorageCheckpointer,
                     TensorStorageCheckpointer]


@tensorclass
class TC:
    obs: torch.Tensor
    flag: torch.Tensor


DTYPES = [torch.float32, torch.bool, torch.bfloat16, torch.uint8, torch.complex64, torch.int64,
          torch.float16]


def rnd(g, shape, dt):
    if dt == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dt in (torch.uint8, torch.int64):
        return torch.randint(0, 200, shape, generator=g).to(dt)
    if dt.is_complex:
        return torch.complex(torch.randn(shape, generator=g),
                             torch.randn(shape, generator=g)).to(dt)
    return torch.randn(shape, generator=g).to(dt)


def bits(x):
    if isinstance(x, torch.Tensor):
        if x.dtype.is_complex:
            x = torch.view_as_real(x)
        flat = x.reshape(-1).clone()
        data = flat.tolist() if x.dtype == torch.bool else flat.view(torch.uint8).tolist()
        return str(x.dtype), tuple(x.shape), data
    if isinstance(x, (tuple, list)):
        return tuple(bits(v) for v in x)
    if isinstance(x, dict):
        return {k: bits(v) for k, v in x.items()}
    if hasattr(x, "to_tensordict"):
        x = x.to_tensordict()
    return {k: bits(v) for k, v in x.items(include_nested=True, leaves_only=True)}


def make_data(kind, g, n, lanes, dt, ndim):
    shp = [n] if ndim == 1 else [lanes, n]
    if kind == "tensor":
        return rnd(g, shp + [3], dt)
    if kind == "td":
        obs = rnd(g, shp + [2], dt)
        return TensorDict({"obs": obs, "a": rnd(g, shp, dt),
                           ("next", "obs"): torch.roll(obs, -1, len(shp) - 1),
                           ("next", "done"): torch.rand(shp + [1], generator=g) < 0.3}, shp)
    if kind == "tc":
        return TC(obs=rnd(g, shp + [2], dt), flag=torch.rand(shp, generator=g) < 0.5,
                  batch_size=shp)
    if kind == "tuple":
        return rnd(g, shp, dt), rnd(g, shp + [2], torch.float32)
    return {"x": rnd(g, shp, dt), "y": {"z": rnd(g, shp + [2], dt)}}


def run(seed):
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    ck = rng.choice(CHECKPOINTERS)
    kind = rng.choice(["tensor", "td", "tc", "tuple", "dict"])
    ndim, dt = rng.choice([1, 2]), rng.choice(DTYPES)
    cap, lanes = rng.randint(4, 12), rng.randint(1, 3)
    cls = rng.choice([LazyTensorStorage, LazyMemmapStorage])
    buffer = TensorDictReplayBuffer if kind == "td" else ReplayBuffer

    def make():
        return buffer(storage=cls(cap * lanes, ndim=ndim, checkpointer=ck()), batch_size=3)

    a = make()
    for _ in range(rng.randint(1, 3)):
        a.extend(make_data(kind, g, rng.randint(1, cap + 2), lanes, dt, ndim))
    with tempfile.TemporaryDirectory() as path:
        a.dumps(path)
        b = make()
        b.loads(path)
    assert (len(a), a.write_count) == (len(b), b.write_count)
    assert bits(a[:]) == bits(b[:])
    more = make_data(kind, g, rng.randint(1, cap), lanes, dt, ndim)
    assert torch.equal(torch.as_tensor(a.extend(more)), torch.as_tensor(b.extend(more)))
    assert bits(a[:]) == bits(b[:])
    torch.manual_seed(seed)
    sa = a.sample()
    torch.manual_seed(seed)
    assert bits(sa) == bits(b.sample())


@pytest.mark.parametrize("block", range(4))
def test_checkpointer_roundtrip_bitwise(block):
    for seed in range(block * 7, block * 7 + 7):
        run(seed)
