"""``CompressedListStorage.bytes()`` and ``to_bytestream()`` (TorchRL's)."""

from __future__ import annotations

import pickle
import zlib

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.storages import CompressedListStorage


def test_bytes_is_the_sum_of_the_compressed_blobs():
    storage = CompressedListStorage(10)
    storage.set(torch.arange(3), torch.zeros(3, 500))
    storage.set(3, TensorDict({"a": torch.arange(100.)}, []))
    blobs = [row.blob for row in storage.items()]
    assert storage.bytes() == sum(len(b) for b in blobs) == storage.nbytes
    assert 0 < storage.bytes() < storage.raw_nbytes


def test_bytes_with_a_codec_of_known_size():
    # (a codec must round-trip: one that kept 8 of the 40 bytes is refused at the write)
    storage = CompressedListStorage(4, compression_fn=lambda raw: torch.cat([raw, raw[:2]]),
                                    decompression_fn=lambda blob: blob[:-2])
    storage.set(torch.arange(2), torch.zeros(2, 10))  # 40 raw bytes a row, 42 kept
    assert storage.bytes() == 84


def test_bytes_follows_overwrites_and_empty():
    storage = CompressedListStorage(2)
    storage.set(torch.arange(2), torch.randn(2, 200))
    random_size = storage.bytes()
    storage.set(torch.arange(2), torch.zeros(2, 200))  # compresses far better
    assert storage.bytes() < random_size
    storage.empty()
    with pytest.warns(UserWarning, match="Compressed storage is empty, returning 0 bytes"):
        assert storage.bytes() == 0


def test_to_bytestream_of_tensors_is_their_raw_bytes():
    storage = CompressedListStorage(2)
    t = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    assert storage.to_bytestream(t) == t.numpy().tobytes()
    assert storage.to_bytestream(t.t()) == t.t().contiguous().numpy().tobytes()  # C order
    b = torch.tensor([1.0, 2.0], dtype=torch.bfloat16, requires_grad=True)
    assert storage.to_bytestream(b) == b.detach().view(torch.int16).numpy().tobytes()
    assert storage.to_bytestream(torch.zeros(0)) == b""


def test_to_bytestream_is_what_the_default_codec_compresses():
    storage = CompressedListStorage(2)
    t = torch.arange(64, dtype=torch.int32)
    storage.set(0, t)
    (row,) = storage.items()
    assert storage.codec.decompress(row.blob) == storage.to_bytestream(t)
    if storage.codec.name == "zlib":
        assert row.blob == zlib.compress(storage.to_bytestream(t), 3)


def test_to_bytestream_of_arrays_and_objects():
    storage = CompressedListStorage(2)
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert storage.to_bytestream(a) == a.tobytes()
    obj = {"k": [1, 2], "s": "x"}
    assert storage.to_bytestream(obj) == pickle.dumps(obj)
    assert pickle.loads(storage.to_bytestream(obj)) == obj


def test_to_bytestream_changes_nothing():
    storage = CompressedListStorage(2)
    storage.set(0, torch.ones(3))
    before = storage.items()
    storage.to_bytestream(torch.zeros(5))
    assert storage.items() == before and len(storage) == 1


# ---- compression_fn / decompression_fn (TorchRL's attributes) ---------------------------------
@pytest.mark.parametrize("tensor", [torch.arange(12.).reshape(3, 4), torch.ones(5, dtype=torch.bool),
                                    torch.arange(6).to(torch.bfloat16), torch.zeros(0, 3),
                                    torch.tensor(7, dtype=torch.int64)])
def test_default_functions_round_trip_a_tensor(tensor):
    storage = CompressedListStorage(4)
    compressed = storage.compression_fn(tensor)
    assert compressed.dtype == torch.uint8 and compressed.ndim == 1
    back = storage.decompression_fn(compressed, {"shape": tensor.shape, "dtype": tensor.dtype})
    assert back.dtype == tensor.dtype and back.shape == tensor.shape and back.equal(tensor)


def test_default_compression_fn_compresses():
    storage = CompressedListStorage(4)
    frames = torch.zeros(84, 84, dtype=torch.uint8)
    assert storage.compression_fn(frames).numel() < frames.numel() // 20


def test_given_functions_are_the_ones_returned():
    def compress(t):
        return t.to(torch.float16)

    def decompress(c, metadata):
        return c.to(metadata["dtype"])

    storage = CompressedListStorage(4, compression_fn=compress, decompression_fn=decompress)
    assert storage.compression_fn is compress and storage.decompression_fn is decompress
