"""A list storage refuses the state of a CompressedListStorage (its items are compressed rows,
and ``rb[0]`` / ``sample()`` served them as they were): ``ValueError`` naming the entries it
never saves, the buffer unchanged. ``loads`` refused it already (the component types)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.storages import CompressedListStorage, LazyStackStorage


def _rows(n, offset=0.0):
    return TensorDict({"obs": torch.arange(n * 3.0).reshape(n, 3) + offset,
                       "episode": torch.arange(n)}, [n])


@pytest.mark.parametrize("kind", [ListStorage, LazyStackStorage])
def test_a_compressed_storage_state_is_refused(kind):
    source = TensorDictReplayBuffer(storage=CompressedListStorage(32), batch_size=4)
    source.extend(_rows(20, 100.0))
    rb = TensorDictReplayBuffer(storage=kind(32), batch_size=4)
    rb.extend(_rows(12))
    before = rb.state_dict()
    with pytest.raises(ValueError, match=r"_storage.*\['blob_crc', 'codec', 'row_crc'\].*another kind of storage"):
        rb.load_state_dict(source.state_dict())
    assert len(rb) == 12 and rb.write_count == 12
    assert torch.equal(rb[:]["obs"], _rows(12)["obs"])
    assert rb.state_dict()["_writer"] == before["_writer"]


def test_list_and_stack_states_still_load_into_each_other():
    # the same entries (TensorDict items): a stack storage's state is a list storage's
    source = TensorDictReplayBuffer(storage=LazyStackStorage(32), batch_size=4)
    source.extend(_rows(6, 7.0))
    rb = TensorDictReplayBuffer(storage=ListStorage(32), batch_size=4)
    rb.load_state_dict(source.state_dict())
    assert torch.equal(torch.stack([rb[i]["obs"] for i in range(6)]), _rows(6, 7.0)["obs"])
