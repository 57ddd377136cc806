"""Transport: tensors cross as out-of-band buffers and are rebuilt as views (no copies)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict

from tdreplay.distributed._wire import Packed, pack, unpack

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]


def _same(a, b) -> None:
    assert type(a) is type(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_round_trip_keeps_dtype_shape_values(dtype):
    x = (torch.randn(3, 4, 2) * 10).to(dtype)
    _same(unpack(pack(x)), x)


@pytest.mark.parametrize("shape", [(), (0,), (5, 0, 2), (1,)])
def test_scalar_and_empty_tensors(shape):
    x = torch.arange(int(np.prod(shape)) if shape else 1, dtype=torch.float32).reshape(shape)
    _same(unpack(pack(x)), x)


def test_non_contiguous_and_expanded_tensors_arrive_with_their_values():
    base = torch.arange(24.0).reshape(4, 6)
    for x in (base.T, base[:, ::2], torch.tensor(7).expand(3, 2), base[1:3]):
        out = unpack(pack(x))
        assert torch.equal(out, x) and out.shape == x.shape and out.is_contiguous()


def test_tensor_bytes_travel_out_of_band_not_in_the_pickle():
    td = TensorDict({"obs": torch.randn(1000, 8), "next": {"r": torch.ones(1000, 1)}}, [1000])
    packed = pack(td)
    assert packed.nbytes == 1000 * 8 * 4 + 1000 * 4
    assert len(packed.buffers) == 2
    assert len(packed.header) < 4000  # the structure only
    assert all(b.dtype == np.uint8 and b.ndim == 1 for b in packed.buffers)


def test_unpacked_tensors_view_the_received_buffers():
    x = torch.randn(256, 16)
    packed = pack(x)
    received = pickle.loads(pickle.dumps(packed, protocol=5))  # as a receiver gets it
    out = unpack(received)
    assert out.data_ptr() == received.buffers[0].ctypes.data  # no copy
    assert torch.equal(out, x)


def test_copy_gives_tensors_their_own_memory():
    x = torch.randn(8, 2)
    packed = pack(x)
    out = unpack(packed, copy=True)
    assert out.data_ptr() != packed.buffers[0].ctypes.data
    out += 1  # writable, and the message is untouched
    assert torch.equal(unpack(packed), x)


def test_packing_does_not_copy_contiguous_tensors():
    x = torch.randn(64, 4)
    assert pack(x).buffers[0].ctypes.data == x.data_ptr()


def test_tensordict_structure_round_trips():
    td = TensorDict({
        "obs": torch.randn(4, 3),
        "next": {"done": torch.tensor([True, False, True, False]), "r": torch.ones(4, 1)},
        "name": NonTensorData("walker", batch_size=[4]),
    }, [4])
    out = unpack(pack(td))
    assert out.batch_size == td.batch_size
    assert set(out.keys(True, True)) == set(td.keys(True, True))
    for key in (("obs",), ("next", "done"), ("next", "r")):
        _same(out.get(key), td.get(key))
    assert out["name"] == "walker"


def test_lazy_stack_of_different_shapes_round_trips():
    td = LazyStackedTensorDict(TensorDict({"a": torch.arange(3.0)}, [3]),
                               TensorDict({"a": torch.arange(5.0)}, [5]), stack_dim=0)
    out = unpack(pack(td))
    assert isinstance(out, LazyStackedTensorDict)
    assert [t["a"].tolist() for t in out.tensordicts] == [[0.0, 1.0, 2.0],
                                                          [0.0, 1.0, 2.0, 3.0, 4.0]]


def test_pytrees_and_plain_objects_round_trip():
    obj = [torch.tensor(1.5), (torch.zeros(2, dtype=torch.int64), {"k": torch.ones(0, 3)}),
           "text", 3, None]
    out = unpack(pack(obj))
    _same(out[0], obj[0])
    _same(out[1][0], obj[1][0])
    _same(out[1][1]["k"], obj[1][1]["k"])
    assert out[2:] == ["text", 3, None]


def test_tensors_requiring_grad_are_sent_detached():
    x = torch.randn(3, requires_grad=True)
    out = unpack(pack(x))
    assert not out.requires_grad and torch.equal(out, x.detach())


def test_unpack_passes_through_what_was_not_packed():
    x = torch.ones(2)
    assert unpack(x) is x
    assert isinstance(pack(x), Packed)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
       dtype=st.sampled_from(DTYPES))
def test_round_trip_property(shape, dtype):
    x = (torch.rand(shape) * 100).to(dtype)
    _same(unpack(pack(x)), x)


def test_ray_object_store_carries_the_bytes_without_a_copy(ray_session):
    """What Ray gets back from its object store is viewed in place by the rebuilt tensor."""
    x = torch.randn(64 * 1024)  # 256 KiB: stored in the shared-memory object store
    ref = ray_session.put(pack(x))
    received = ray_session.get(ref)
    out = unpack(received)
    assert torch.equal(out, x)
    buffer = received.buffers[0]
    assert not buffer.flags.writeable  # Ray's read-only view of the stored object
    assert out.data_ptr() == buffer.ctypes.data


def test_what_does_not_pickle_is_a_type_error_naming_it():
    # (a lambda raised pickle's AttributeError "Can't pickle local object", a generator
    # TypeError "cannot pickle 'generator' object", naming no remote buffer)
    import threading

    from tdreplay.distributed._wire import sendable_batch

    for obj in (lambda: 1, threading.Lock()):
        with pytest.raises(TypeError, match="cannot send a .* to a remote buffer: it does not "
                           "pickle"):
            pack(obj)
    assert sendable_batch(i for i in range(3)) == [0, 1, 2]  # extend sends its items
    batch = [1, 2]
    assert sendable_batch(batch) is batch and sendable_batch(iter(batch)) == batch


def test_dropped_calls_are_fetched_errors_and_all(monkeypatch):
    # (dropped prefetched calls whose answer was an error were never fetched: Ray logged each
    # as an "Unhandled error" traceback after the caller already had the error)
    import types

    from tdreplay.distributed import client

    fetched = []

    def get(ref):
        fetched.append(ref)
        if ref % 2:
            raise RuntimeError("Cannot sample from an empty storage")
        return ref

    monkeypatch.setattr(client, "import_ray", lambda: types.SimpleNamespace(get=get))
    client._settle([1, 2, 3])
    assert fetched == [1, 2, 3]
