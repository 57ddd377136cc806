"""``add`` of an item a write-side transform filters out of a TensorDict (an empty batch where
the item had none: ``td[td["keep"]]``) writes nothing, as ``extend`` of the same item; it was
written as a row of batch size [0], and every later add was refused."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer, Transform


class KeepFlagged(Transform):
    def forward(self, td):
        return td[td["keep"]]


def _item(x: float, keep: bool) -> TensorDict:
    return TensorDict({"x": torch.tensor(x), "keep": torch.tensor(keep)}, [])


def test_an_item_filtered_out_on_write_is_not_added():
    for cls in (ReplayBuffer, TensorDictReplayBuffer):
        rb = cls(storage=ListStorage(10))
        rb.append_transform(KeepFlagged(), invert=True)
        dropped = rb.add(_item(1.0, False))
        assert isinstance(dropped, torch.Tensor) and dropped.shape == (0, 1)
        assert len(rb) == 0 and rb.write_count == 0
        assert rb.add(_item(2.0, True)) == 0
        assert len(rb) == 1 and float(rb.storage.get(0)["x"]) == 2.0


def test_an_item_given_with_an_empty_batch_is_not_taken_for_dropped():
    rb = TensorDictReplayBuffer(storage=ListStorage(10))
    rb.append_transform(lambda td: td, invert=True)
    empty = TensorDict({"x": torch.zeros(0)}, [0])
    with pytest.warns(UserWarning, match="batch"):  # an item with batch dims, as TorchRL's
        slot = rb.add(empty)  # its batch size is the one it was given: written as it is
    assert slot == 0 and rb.storage.get(0).batch_size == (0,)
