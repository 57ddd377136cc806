"""A storage on the default codec loads checkpoints of either built-in codec: rows saved with
zlib (the default without ``zstandard``) load where ``zstandard`` is installed, and the other
way round where it is; the storage then goes on with the codec of the rows it loaded. Rows of a
codec that cannot be read here are refused naming it, and nothing changes."""

from __future__ import annotations

import zlib

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError
from tdreplay.storages import CompressedListStorage, compressed_storage
from tdreplay.storages.compressed_storage import builtin_codec

ROWS = torch.arange(12).reshape(4, 3)


def saved_with(name: str) -> CompressedListStorage:
    storage = CompressedListStorage(6)
    storage.codec = builtin_codec(name, 3)  # as built where that codec is the default
    storage.set(torch.arange(4), ROWS)
    return storage


def restore(source: CompressedListStorage, target: CompressedListStorage, how: str,
            tmp_path) -> None:
    if how == "dumps":
        source.dumps(tmp_path / "ckpt")
        target.loads(tmp_path / "ckpt")
    else:
        target.load_state_dict(source.state_dict())


@pytest.mark.parametrize("how", ["dumps", "state_dict"])
@pytest.mark.parametrize("saved", ["zlib", "zstd"])
def test_a_checkpoint_of_the_other_builtin_codec_loads(saved, how, tmp_path):
    pytest.importorskip("zstandard")
    target = CompressedListStorage(6)
    target.codec = builtin_codec("zstd" if saved == "zlib" else "zlib", 3)
    restore(saved_with(saved), target, how, tmp_path)
    assert torch.equal(target.get(torch.arange(4)), ROWS)
    assert target.codec.name == saved  # it goes on with the rows' codec
    target.set(torch.tensor([4]), torch.tensor([[7, 8, 9]]))
    again = CompressedListStorage(6)
    again.load_state_dict(target.state_dict())
    assert torch.equal(again.get(torch.arange(5)), torch.cat([ROWS, torch.tensor([[7, 8, 9]])]))


@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_zstd_checkpoint_without_zstandard_is_refused_naming_the_package(
        how, tmp_path, monkeypatch):
    pytest.importorskip("zstandard")
    source = saved_with("zstd")
    monkeypatch.setattr(compressed_storage, "_zstd", None)  # (this process without it)
    target = CompressedListStorage(6)
    assert target.codec.name == "zlib"
    target.set(torch.arange(2), ROWS[:2])
    error = CheckpointError if how == "dumps" else ValueError
    with pytest.raises(error, match="zstandard"):
        restore(source, target, how, tmp_path)
    assert len(target) == 2 and torch.equal(target.get(torch.arange(2)), ROWS[:2])
    assert target.codec.name == "zlib"


def test_rows_of_a_custom_codec_are_still_refused(tmp_path):
    import zlib

    custom = CompressedListStorage(6, compression_fn=zlib.compress,
                                   decompression_fn=zlib.decompress)
    target = CompressedListStorage(6)
    with pytest.raises(ValueError, match="compressed with 'custom"):
        target.load_state_dict(custom.state_dict())
    assert len(target) == 0 and target.codec.name in ("zstd", "zlib")
    # and a storage with functions of its own does not take the built-in codecs' rows
    with pytest.raises(ValueError, match="compressed with 'zlib'"):
        custom.load_state_dict(saved_with("zlib").state_dict())


def test_a_decompression_fn_returning_another_shape_is_named_not_the_bytes():
    # the message ended "its bytes are damaged", blaming the stored data for the function
    def compress(t):
        return torch.frombuffer(bytearray(zlib.compress(t.contiguous().numpy().tobytes())),
                                dtype=torch.uint8)

    def flat(blob, meta):  # forgets the reshape to meta["shape"]
        return torch.frombuffer(bytearray(zlib.decompress(bytes(blob.numpy()))),
                                dtype=meta["dtype"])

    storage = CompressedListStorage(10, compression_fn=compress, decompression_fn=flat)
    rows = TensorDict({"p": torch.zeros(2, 2, 3, dtype=torch.uint8)}, [2])
    with pytest.raises(ValueError, match=r"decompression_fn returned torch.uint8 \(6,\) for "
                                         r"entry 'p'.*metadata\['shape'\]") as err:
        storage.set(torch.arange(2), rows)  # (refused at the write: the row would be lost)
    assert "damaged" not in str(err.value)
    assert len(storage) == 0
