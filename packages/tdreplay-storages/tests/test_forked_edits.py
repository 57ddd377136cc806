"""An in-place edit in a forked child of a buffer it cannot share (a plain LazyTensorStorage
keeps its rows in the parent's memory) raises, as a write does: the edit would stay in the
child's copy, lost to the parent. A LazyMemmapStorage shares it."""

import multiprocessing as mp
import sys

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import NotShareableError, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork start method")


def _edit(rb, how, queue):
    try:
        if how == "setitem":
            rb[0] = TensorDict({"x": torch.tensor(5)}, [])
        elif how == "set_":
            rb.set_("x", torch.tensor(5))
        elif how == "set_at_":
            rb.set_at_("x", torch.tensor(5), 0)
        else:
            rb.update_({"x": torch.full((2,), 5)})
        queue.put("edited")
    except NotShareableError:
        queue.put("refused")


def _run_child(rb, how):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_edit, args=(rb, how, queue))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    return queue.get(timeout=5)


@pytest.mark.parametrize("how", ["setitem", "set_", "set_at_", "update_"])
def test_an_edit_in_a_forked_child_of_an_unshareable_buffer_raises(how):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), shared=True)
    rb.extend(TensorDict({"x": torch.tensor([1, 2])}, [2]))
    assert _run_child(rb, how) == "refused"
    assert rb.storage[:2]["x"].tolist() == [1, 2]
    rb.set_at_("x", torch.tensor(7), 0)  # the parent's own edits go on
    assert rb.storage[:2]["x"].tolist() == [7, 2]


@pytest.mark.parametrize("how", ["setitem", "set_at_"])
def test_an_edit_in_a_forked_child_of_a_memmap_buffer_is_seen(how, tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(4, scratch_dir=tmp_path), shared=True)
    rb.extend(TensorDict({"x": torch.tensor([1, 2])}, [2]))
    assert _run_child(rb, how) == "edited"
    assert rb.storage[:2]["x"].tolist() == [5, 2]
