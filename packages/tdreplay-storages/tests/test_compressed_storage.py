"""CompressedListStorage: round trips, lazy decompression, codecs, bytes saved."""

from __future__ import annotations

import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import LazyStackedTensorDict, TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import CompressedListStorage
from tdreplay.storages import compressed_storage as compressed_module


def atari_like_frames(n: int, seed: int = 0) -> torch.Tensor:
    """uint8 [n, 84, 84, 4] frames with structure: flat background, moving blocks, a little noise."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.full((n, 84, 84, 4), 40, dtype=torch.uint8)
    frames[:, 70:, :, :] = 120  # ground
    for i in range(n):
        for k in range(4):
            x = (3 * i + 5 * k) % 70
            frames[i, 20 + k * 10: 28 + k * 10, x: x + 8, k] = 200
    noise = torch.rand(frames.shape, generator=g) < 0.01
    frames[noise] = 255
    return frames


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_rows_round_trip_bitwise(dtype):
    g = torch.Generator().manual_seed(1)
    data = (torch.randn(5, 3, 2, generator=g) * 50)
    data = data > 0 if dtype is torch.bool else data.to(dtype)
    s = CompressedListStorage(10)
    s.set(torch.arange(5), data)
    out = s.get(torch.tensor([4, 0, 2]))
    assert out.dtype is dtype and out.shape == (3, 3, 2)
    assert torch.equal(out.view(-1).view(torch.uint8) if dtype is torch.bool else out,
                       data[[4, 0, 2]].view(-1).view(torch.uint8) if dtype is torch.bool
                       else data[[4, 0, 2]])


def test_tensordict_rows_with_nested_keys_and_batch_dims():
    data = TensorDict({
        "pixels": atari_like_frames(6),
        "action": torch.arange(6),
        ("next", "pixels"): atari_like_frames(6, seed=1),
        ("next", "done"): torch.zeros(6, 1, dtype=torch.bool),
        ("next", "reward"): torch.arange(6.).unsqueeze(-1),
        "traj": torch.arange(12).reshape(6, 2),
    }, [6])
    s = CompressedListStorage(10)
    s.set(torch.arange(6), data)
    out = s.get(torch.tensor([[5, 1], [0, 0]]))
    assert out.batch_size == torch.Size([2, 2])
    expected = data[torch.tensor([[5, 1], [0, 0]])]
    assert set(out.keys(True, True)) == set(data.keys(True, True))
    for key in data.keys(True, True):
        assert out.get(key).dtype == data.get(key).dtype
        assert torch.equal(out.get(key), expected.get(key))


def test_single_row_add_and_int_get():
    s = CompressedListStorage(4)
    row = TensorDict({"a": torch.arange(3), "b": torch.ones(2, 2)}, [])
    s.set(0, row)
    out = s.get(0)
    assert out.batch_size == torch.Size([]) and torch.equal(out["a"], row["a"])


def test_inner_batch_size_is_kept():
    s = CompressedListStorage(4)
    s.set(torch.arange(2), TensorDict({"x": torch.arange(6).reshape(2, 3)}, [2, 3]))
    out = s.get(torch.tensor([1]))
    assert out.batch_size == torch.Size([1, 3]) and out["x"].tolist() == [[3, 4, 5]]


def test_only_requested_rows_are_decompressed():
    calls = []

    def compress(raw: torch.Tensor) -> bytes:
        return zlib.compress(raw.numpy().tobytes())

    def decompress(blob: torch.Tensor) -> bytes:
        calls.append(blob.numel())
        return zlib.decompress(blob.numpy().tobytes())

    s = CompressedListStorage(100, compression_fn=compress, decompression_fn=decompress)
    s.set(torch.arange(50), atari_like_frames(50))
    assert calls == []  # writing never decompresses
    out = s.get(torch.tensor([7, 3, 7]))
    assert len(calls) == 3
    assert torch.equal(out, atari_like_frames(50)[[7, 3, 7]])
    assert s.codec.name.startswith("custom:")


def test_custom_codec_returning_tensors():
    s = CompressedListStorage(
        10,
        compression_fn=lambda raw: raw.flip(0).clone(),
        decompression_fn=lambda blob: blob.flip(0).clone(),
    )
    s.set(torch.arange(3), torch.arange(6.).reshape(3, 2))
    assert s.get(torch.tensor([2]))[0].tolist() == [4.0, 5.0]


def test_codec_that_does_not_round_trip_is_reported():
    s = CompressedListStorage(10, compression_fn=lambda raw: raw, decompression_fn=lambda b: b[:-1])
    s.set(torch.arange(1), torch.ones(1, 4))
    with pytest.raises(ValueError, match="does not round-trip"):
        s.get(torch.tensor([0]))


def test_zlib_fallback_without_zstandard(monkeypatch):
    monkeypatch.setattr(compressed_module, "_zstd", None)
    s = CompressedListStorage(10, compression_level=15)  # capped at zlib's 9
    assert s.codec.name == "zlib"
    s.set(torch.arange(4), atari_like_frames(4))
    assert torch.equal(s.get(torch.arange(4)), atari_like_frames(4))
    assert s.nbytes < s.raw_nbytes


def test_zstd_is_the_default_when_installed():
    pytest.importorskip("zstandard")
    assert CompressedListStorage(3).codec.name == "zstd"


def test_bad_arguments():
    with pytest.raises(ValueError, match="together"):
        CompressedListStorage(3, compression_fn=zlib.compress)
    with pytest.raises(TypeError, match="compression_fn must be callable"):
        CompressedListStorage(3, compression_fn=1, decompression_fn=zlib.decompress)
    with pytest.raises(TypeError, match="compression_level"):
        CompressedListStorage(3, compression_level=2.5)


def test_non_tensor_rows_are_refused_and_nothing_changes():
    s = CompressedListStorage(5)
    s.set(torch.arange(2), torch.zeros(2, 3))
    with pytest.raises(TypeError, match="tensors and TensorDicts"):
        s.set(torch.arange(2, 4), ["a", "b"])
    with pytest.raises(IndexError):
        s.set(torch.tensor([4]), torch.zeros(1, 3))  # a gap: rows are filled in order
    assert len(s) == 2


def test_rows_of_different_structures_are_returned_as_a_list_and_stacked_lazily():
    s = CompressedListStorage(5)
    s.set(0, TensorDict({"x": torch.zeros(3)}, [3]))
    s.set(1, TensorDict({"x": torch.ones(5)}, [5]))
    out = s.get(torch.tensor([0, 1]))
    assert isinstance(out, list) and [o.batch_size[0] for o in out] == [3, 5]
    batch = s.default_collate(out)
    assert isinstance(batch, LazyStackedTensorDict)


def test_in_a_buffer_with_wrap_around():
    rb = ReplayBuffer(storage=CompressedListStorage(4), batch_size=3)
    frames = atari_like_frames(6)
    rb.extend(TensorDict({"pixels": frames, "i": torch.arange(6)}, [6]))
    assert len(rb) == 4 and rb.write_count == 6
    assert rb[:]["i"].tolist() == [4, 5, 2, 3]
    sample = rb.sample()
    assert torch.equal(sample["pixels"], frames[sample["i"]])


def test_device_of_decompressed_rows():
    s = CompressedListStorage(3, device="cpu")
    s.set(torch.arange(1), torch.ones(1, 2))
    assert s.get(torch.tensor([0])).device == torch.device("cpu")


def test_bytes_saved_on_atari_like_frames():
    s = CompressedListStorage(64)
    s.set(torch.arange(64), TensorDict({"pixels": atari_like_frames(64)}, [64]))
    assert s.raw_nbytes == 64 * 84 * 84 * 4
    # structured frames compress by far more than 4x
    assert s.nbytes * 4 < s.raw_nbytes


def test_state_dict_round_trip_keeps_rows_compressed():
    s = CompressedListStorage(5)
    s.set(torch.arange(3), torch.arange(9).reshape(3, 3))
    state = s.state_dict()
    t = CompressedListStorage(5)
    t.load_state_dict(state)
    assert torch.equal(t.get(torch.arange(3)), torch.arange(9).reshape(3, 3))
    with pytest.raises(ValueError, match="compressed with"):
        CompressedListStorage(5, compression_fn=zlib.compress,
                              decompression_fn=zlib.decompress).load_state_dict(state)


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=3), min_size=1, max_size=3),
    dtype=st.sampled_from(DTYPES),
    n=st.integers(1, 6),
    level=st.integers(1, 9),
)
def test_round_trip_property(shapes, dtype, n, level):
    g = torch.Generator().manual_seed(n)
    source = {}
    for i, shape in enumerate(shapes):
        value = torch.randn(n, *shape, generator=g) * 10
        source[f"k{i}"] = value > 0 if dtype is torch.bool else value.to(dtype)
    data = TensorDict(source, [n])
    s = CompressedListStorage(n, compression_level=level)
    s.set(torch.arange(n), data)
    index = torch.arange(n).flip(0)
    out = s.get(index)
    for key, value in source.items():
        assert out[key].dtype is value.dtype
        assert torch.equal(out[key].view(torch.uint8) if dtype is torch.bool else out[key],
                           value[index].view(torch.uint8) if dtype is torch.bool else value[index])
