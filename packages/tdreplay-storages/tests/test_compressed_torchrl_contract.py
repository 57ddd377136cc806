"""CompressedListStorage with TorchRL's codec contract, ``contains``, errors and sizes."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, StorageIndexError
from tdreplay.storages import CompressedListStorage
from tdreplay.storages.compressed_storage import Codec, LeafCodec


def _half(tensor):
    return tensor.to(torch.float16) if tensor.is_floating_point() else tensor


def _unhalf(compressed, metadata):
    return compressed.to(metadata["dtype"])


def test_two_argument_decompression_fn_is_called_per_leaf_with_metadata():
    seen = []

    def compress(tensor):
        seen.append(("c", tensor.dtype, tuple(tensor.shape)))
        return tensor.to(torch.uint8)

    def decompress(compressed, metadata):
        seen.append(("d", compressed.dtype, tuple(compressed.shape), metadata["dtype"],
                     tuple(metadata["shape"]), metadata["type"]))
        return compressed.to(metadata["dtype"])

    s = CompressedListStorage(4, compression_fn=compress, decompression_fn=decompress)
    assert isinstance(s.codec, LeafCodec)
    s.set(0, torch.tensor([[1.7, 2.2], [3.9, 250.0]]))
    out = s.get(0)
    assert out.dtype == torch.float32 and out.shape == (2, 2)
    assert out.tolist() == [[1.0, 2.0], [3.0, 250.0]]  # the user's lossy uint8 cast
    decompressed = ("d", torch.uint8, (2, 2), torch.float32, (2, 2), "tensor")
    # (the first row of a new layout is decompressed once at the write: the round-trip check)
    assert seen == [("c", torch.float32, (2, 2)), decompressed, decompressed]


def test_leaf_codec_tensordict_rows_batch_and_checkpoint(tmp_path):
    s = CompressedListStorage(8, compression_fn=_half, decompression_fn=_unhalf)
    td = TensorDict({"obs": torch.arange(12.).reshape(3, 4), "a": torch.tensor([1, 2, 3]),
                     ("n", "r"): torch.tensor([0.5, 1.5, 2.5])}, [3])
    s.set(torch.arange(3), td)
    batch = s.get(torch.tensor([2, 0]))
    assert batch["obs"].dtype == torch.float32
    assert batch["obs"].tolist() == [[8., 9., 10., 11.], [0., 1., 2., 3.]]
    assert batch["a"].tolist() == [3, 1] and batch["a"].dtype == torch.int64
    assert batch["n", "r"].tolist() == [2.5, 0.5]
    s.dumps(tmp_path / "ck")
    t = CompressedListStorage(8, compression_fn=_half, decompression_fn=_unhalf)
    t.loads(tmp_path / "ck")
    assert (t.get(torch.arange(3))["obs"] == td["obs"]).all()


def test_leaf_codec_bytes_output_and_wrong_shape_refused():
    s = CompressedListStorage(
        4, compression_fn=lambda t: t.numpy().tobytes(),
        decompression_fn=lambda b, m: torch.frombuffer(bytearray(b), dtype=m["dtype"])
        .reshape(m["shape"]))
    s.set(0, torch.arange(6).reshape(2, 3))
    assert s.get(0).tolist() == [[0, 1, 2], [3, 4, 5]]
    bad = CompressedListStorage(4, compression_fn=lambda t: t,
                                decompression_fn=lambda c, m: c.reshape(-1))
    with pytest.raises(ValueError, match="decompression_fn returned torch.float32 \\(6,\\)"):
        bad.set(0, torch.zeros(2, 3))  # refused at the write
    assert len(bad) == 0


def test_one_argument_functions_keep_the_byte_contract():
    s = CompressedListStorage(4, compression_fn=lambda raw: raw.clone(),
                              decompression_fn=lambda blob: blob.clone())
    assert isinstance(s.codec, Codec)
    s.set(0, torch.tensor([1.5, -2.0]))
    assert s.get(0).tolist() == [1.5, -2.0]


def _reversed_bytes(raw):
    return raw.flip(0)


def test_buffers_with_a_codec_of_module_level_functions_pickle():
    # the byte contract's wrappers are local functions: the codec pickles as the user's two
    # (as TorchRL's storage pickles with its functions); leaf codecs pickle as they are
    import pickle

    for fns in ((_reversed_bytes, _reversed_bytes), (_half, _unhalf)):
        rb = ReplayBuffer(storage=CompressedListStorage(4, compression_fn=fns[0],
                                                        decompression_fn=fns[1]))
        rb.extend(torch.tensor([[1.5, -2.0], [3.0, 4.0]]))
        copy = pickle.loads(pickle.dumps(rb))
        assert copy.storage.codec.name == rb.storage.codec.name
        assert copy[:].tolist() == [[1.5, -2.0], [3.0, 4.0]]
        copy.add(torch.tensor([5.0, 6.0]))
        assert copy[2].tolist() == [5.0, 6.0] and len(rb) == 2


def test_contains():
    s = CompressedListStorage(10)
    assert not s.contains(0)
    s.set(0, torch.randn(2, 2))
    assert s.contains(0) and s.contains(-1) and not s.contains(1)
    assert s.contains(torch.tensor([0, 1, -3])).tolist() == [True, False, False]


def test_write_past_capacity_is_runtime_and_index_error_and_writes_nothing():
    s = CompressedListStorage(5)
    with pytest.raises(RuntimeError):
        s.set(10, torch.randn(2, 2))
    with pytest.raises(StorageIndexError, match="out of range for a CompressedListStorage"):
        s.set(10, torch.randn(2, 2))
    assert len(s) == 0
    with pytest.raises(IndexError):
        s.get(0)
    s.set(0, torch.zeros(1))
    with pytest.raises(IndexError, match="without gaps"):
        s.set(3, torch.zeros(1))
    assert len(s) == 1


def test_row_numel_is_its_compressed_size():
    s = CompressedListStorage(4)
    big = torch.zeros(100, 3, 84, 84, dtype=torch.int64)
    s.set(0, big)
    row = s.items()[0]
    assert row.numel() == len(row.blob) == s.nbytes
    assert big.numel() * big.element_size() / row.numel() > 100
    rb = ReplayBuffer(storage=CompressedListStorage(4), batch_size=2)
    rb.extend(torch.ones(3, 5))
    assert rb.sample().shape == (2, 5)
