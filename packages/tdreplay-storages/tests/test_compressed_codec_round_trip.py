"""A custom codec of ``CompressedListStorage`` that does not give back what it was given is
refused at the write (the first row of each new layout is decompressed and compared), with an
error naming ``compression_fn`` / ``decompression_fn``, and the storage is left as it was: it used
to be accepted, and the row was lost (``get`` raised later)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import CompressedListStorage


def _state(storage: CompressedListStorage) -> list:
    return [(row.layout, row.blob) for row in storage.items()]


def _drop_last_byte() -> CompressedListStorage:
    return CompressedListStorage(8, compression_fn=lambda raw: raw.clone(),
                                 decompression_fn=lambda blob: blob[:-1].clone())


def _flip_bytes_of_ints() -> CompressedListStorage:
    """Round-trips rows whose first byte is 0 (the float zeros below), else flips them: the
    length is right, the bytes are not."""
    return CompressedListStorage(
        8, compression_fn=lambda raw: raw.clone(),
        decompression_fn=lambda blob: blob.clone() if blob[0] == 0 else blob.flip(0).clone())


@pytest.mark.parametrize("write", ["int", "tensor", "list", "tensordict"])
def test_a_codec_losing_bytes_is_refused_at_the_write(write):
    storage = _drop_last_byte()
    rows = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"compression_fn and decompression_fn do not "
                                         r"round-trip.*11 bytes instead of 12.*nothing was "
                                         r"written"):
        if write == "int":
            storage.set(0, rows[0])
        elif write == "tensor":
            storage.set(torch.arange(2), rows)
        elif write == "list":
            storage.set([0, 1], list(rows))
        else:
            storage.set(torch.arange(2), TensorDict({"x": rows}, [2]))
    assert len(storage) == 0 and _state(storage) == []
    with pytest.raises(IndexError):
        storage.get(0)


def test_a_codec_changing_bytes_of_a_new_layout_leaves_the_storage_unchanged():
    storage = _flip_bytes_of_ints()
    storage.set(torch.arange(2), torch.zeros(2, 4))  # first byte 0: round-trips
    before = _state(storage)
    with pytest.raises(ValueError, match="other bytes than the 8 written; nothing was written"):
        storage.set(torch.arange(1, 3), torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    assert _state(storage) == before and len(storage) == 2
    assert storage.get(torch.arange(2)).tolist() == [[0.0] * 4] * 2


def test_a_refused_write_leaves_a_buffer_unchanged():
    rb = ReplayBuffer(storage=_drop_last_byte())
    with pytest.raises(ValueError, match="compression_fn and decompression_fn"):
        rb.extend(torch.ones(3, 2))
    assert len(rb) == 0 and len(rb.storage) == 0


def test_a_decompression_fn_raising_is_named():
    def broken(blob):
        raise RuntimeError("boom")

    storage = CompressedListStorage(4, compression_fn=lambda raw: raw.clone(),
                                    decompression_fn=broken)
    with pytest.raises(ValueError, match=r"decompression_fn cannot decompress what "
                                         r"compression_fn made of a row \(RuntimeError: boom\)"
                       ) as err:
        storage.set(0, torch.ones(3))
    assert isinstance(err.value.__cause__, RuntimeError)
    assert len(storage) == 0


def test_round_tripping_and_lossy_leaf_codecs_are_accepted():
    exact = CompressedListStorage(4, compression_fn=lambda raw: raw.flip(0).clone(),
                                  decompression_fn=lambda blob: blob.flip(0).clone())
    exact.set(torch.arange(2), torch.tensor([[1.5, -0.0], [3.0, 4.0]]))
    assert exact.get(torch.arange(2)).tolist() == [[1.5, -0.0], [3.0, 4.0]]
    # TorchRL's two-argument contract may be lossy by choice: the size is checked, not bytes
    lossy = CompressedListStorage(4, compression_fn=lambda t: t.to(torch.float16),
                                  decompression_fn=lambda c, meta: c.to(meta["dtype"]))
    lossy.set(0, torch.tensor([1.0, 1.0001]))
    assert lossy.get(0).tolist() == [1.0, 1.0]


def test_the_default_codec_is_not_checked_per_layout():
    calls = []
    storage = CompressedListStorage(4)
    decompress = storage.codec.decompress
    storage.codec.decompress = lambda blob: calls.append(1) or decompress(blob)
    storage.set(torch.arange(2), torch.ones(2, 3))
    storage.set(2, {"a": torch.ones(1)})
    assert calls == []
