"""A checkpoint of a compressed storage loads only with the codec that compressed its rows,
even when another codec of your own has the same name (two lambdas, two ``compress``
functions): before, its rows decompressed to other bytes of the same size, silently."""

from __future__ import annotations

import json

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.core.checkpoint import CheckpointError
from tdreplay.storages import CompressedListStorage


def with_codec(reverse: bool) -> CompressedListStorage:
    """Two codecs of one name (``custom:with_codec.<locals>.<lambda>``), as two scripts that
    each define ``compress`` give."""
    return CompressedListStorage(
        10, compression_fn=lambda b: bytes(b)[::-1] if reverse else bytes(b),
        decompression_fn=lambda b: bytes(b)[::-1] if reverse else bytes(b))


def reversing() -> CompressedListStorage:
    return with_codec(reverse=True)


def plain() -> CompressedListStorage:
    return with_codec(reverse=False)


def written(storage: CompressedListStorage) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(TensorDict({"x": torch.arange(4.0) + 0.1}, [4]))
    rb.extend(TensorDict({"y": torch.arange(6).reshape(3, 2)}, [3]))  # a second layout
    return rb


def test_dumps_of_another_codec_with_the_same_name_is_refused(tmp_path):
    written(reversing()).dumps(tmp_path)
    rb = TensorDictReplayBuffer(storage=plain())
    with pytest.raises(CheckpointError, match=r"row 0 decompresses to other bytes than it was "
                                              r"saved from: this storage's codec "
                                              r"'custom:with_codec.<locals>.<lambda>'"):
        rb.loads(tmp_path)
    assert len(rb) == 0


def test_state_dict_of_another_codec_with_the_same_name_is_refused():
    state = written(reversing()).state_dict()
    rb = TensorDictReplayBuffer(storage=plain())
    with pytest.raises(ValueError, match="decompresses to other bytes than it was saved from"):
        rb.load_state_dict(state)
    assert len(rb) == 0


def test_the_same_codec_loads_and_reads_every_layout(tmp_path):
    source = written(reversing())
    source.dumps(tmp_path)
    rb = TensorDictReplayBuffer(storage=reversing())
    rb.loads(tmp_path)
    assert rb[:4]["x"].tolist() == pytest.approx([0.1, 1.1, 2.1, 3.1])
    assert rb[4:]["y"].tolist() == [[0, 1], [2, 3], [4, 5]]
    state = source.storage.state_dict()
    assert [row for row, _ in state["row_crc"]] == [0, 4]  # the first row of each layout


def test_a_checkpoint_without_checksums_is_read_as_before(tmp_path):
    written(reversing()).dumps(tmp_path)
    (meta_file,) = tmp_path.rglob("storage.json")
    meta = json.loads(meta_file.read_text())
    del meta["row_crc"]
    meta_file.write_text(json.dumps(meta))
    storage = reversing()
    storage.loads(meta_file.parent)
    assert len(storage) == 7


def test_damaged_checksums_are_refused_naming_the_entry():
    source = written(reversing()).storage
    state = source.state_dict()
    state["row_crc"] = [[99, 0]]
    with pytest.raises(ValueError, match=r"state_dict\['row_crc'\] must be a list of"):
        reversing().load_state_dict(state)
