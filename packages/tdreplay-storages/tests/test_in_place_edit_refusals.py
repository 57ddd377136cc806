"""In-place edits of a tensor storage check every key and index before writing any: a refused
``set_at_`` or ``update_`` leaves the buffer exactly as it was (before, the rows in range or
the keys before the bad one were written, then the call raised)."""

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


@pytest.fixture(params=[LazyTensorStorage, LazyMemmapStorage])
def rb(request):
    buffer = TensorDictReplayBuffer(storage=request.param(10))
    buffer.extend(TensorDict({"obs": torch.ones(6, 3), "act": torch.arange(6),
                              ("next", "r"): torch.zeros(6)}, [6]))
    return buffer


def snapshot(rb):
    return rb[:].clone()


@pytest.mark.parametrize("index", [[0, 50], [0, 8], [0, -11]])
def test_set_at_with_an_index_out_of_the_written_rows_writes_nothing(rb, index):
    before = snapshot(rb)
    with pytest.raises(ValueError, match="not within the 6 written rows"):
        rb.set_at_("obs", torch.full((2, 3), 7.0), torch.tensor(index))
    assert (rb[:] == before).all()


def test_set_at_checks_shape_and_cast_first(rb):
    before = snapshot(rb)
    with pytest.raises(ValueError, match="does not fit"):
        rb.set_at_("obs", torch.full((2, 4), 7.0), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="act"):
        rb.set_at_("act", torch.tensor([0.5, 1.5]), torch.tensor([0, 1]))
    assert (rb[:] == before).all()
    rb.set_at_("obs", torch.full((2, 3), 7.0), torch.tensor([0, 5]))
    assert rb[:]["obs"][:, 0].tolist() == [7.0, 1.0, 1.0, 1.0, 1.0, 7.0]


@pytest.mark.parametrize("bad", [
    {"act": torch.full((6,), 9), "obs": torch.zeros(6, 7)},              # a shape, second key
    {"act": torch.full((6,), 9), ("next", "r"): torch.zeros(6, 2)},      # a nested shape
    {"obs": torch.zeros(6, 3), "act": torch.full((6,), 0.5)},           # a lossy cast
])
def test_update_checks_every_key_before_writing_any(rb, bad):
    before = snapshot(rb)
    with pytest.raises((ValueError, TypeError)):
        rb.storage.update_(TensorDict(bad, [6]))
    assert (rb[:] == before).all()


def test_update_writes_the_keys_asked_for_and_skips_unknown_ones(rb):
    rb.storage.update_(TensorDict({"act": torch.full((6,), 9), "obs": torch.zeros(6, 3),
                                   "unknown": torch.ones(6)}, [6]), keys_to_update=["act"])
    assert rb[:]["act"].tolist() == [9] * 6 and rb[:]["obs"].sum() == 18.0
    rb.storage.update_({("next", "r"): torch.full((6,), 2.0)})
    assert rb[:]["next", "r"].tolist() == [2.0] * 6
    rb.storage.update_(TensorDict({"next": {"r": torch.ones(6)}}, [6]), keys_to_update=["next"])
    assert rb[:]["next", "r"].tolist() == [1.0] * 6


@pytest.mark.parametrize("extra", [{"unknown": torch.ones(6)},
                                   {("next", "unknown"): torch.ones(6)},
                                   {"unknown": NonTensorStack(*map(NonTensorData, "abcdef"))}])
@pytest.mark.parametrize("through", ["buffer", "storage"])
def test_update_refuses_an_entry_the_storage_lacks_and_writes_nothing(rb, extra, through):
    # it was skipped without a word: its values were lost (TorchRL raises KeyError for one
    # such entry)
    before = snapshot(rb)
    target = rb if through == "buffer" else rb.storage
    with pytest.raises(KeyError, match="input_dict_or_td has entries .*unknown.* does not hold"):
        target.update_(TensorDict({"act": torch.full((6,), 9), **extra}, [6]))
    assert (rb[:] == before).all()
    target.update_(TensorDict({"act": torch.full((6,), 9), **extra}, [6]),
                   keys_to_update=["act"])  # left out: the entries asked for are written
    assert rb[:]["act"].tolist() == [9] * 6
