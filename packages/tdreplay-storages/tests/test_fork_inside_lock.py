"""A child forked inside ``with rb.locked()`` over a LazyMemmapStorage does not hold the
storage's process lock (its parent does): the child's exit of the block leaves the parent's
lock held, and a call of the child waits for the parent to leave the block."""

import fcntl
import os
import sys
import time

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork")


def _buffer(tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(8, scratch_dir=tmp_path))
    rb.extend(TensorDict({"x": torch.tensor([1, 2])}, [2]))
    return rb


def _lock_is_free(path: str) -> bool:
    """Whether another open file description can take ``path``'s flock now."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (closing gives back a lock this probe took)
    return True


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _fork_inside_the_block(rb, child_inside, child_after, parent_inside) -> int:
    """Fork inside ``with rb.locked()``: the child runs ``child_inside()``, leaves the block,
    runs ``child_after()`` and exits (0, or 1 if anything raised); the parent runs
    ``parent_inside()``, leaves the block and returns the child's exit code."""
    pid = -1
    try:
        with rb.locked():
            pid = os.fork()
            (child_inside if pid == 0 else parent_inside)()
        if pid == 0:
            child_after()
    except BaseException:
        if pid == 0:
            os._exit(1)
        raise
    if pid == 0:
        os._exit(0)
    return _exit_code(pid)


def test_the_childs_exit_of_the_block_leaves_the_parents_lock_held(tmp_path):
    rb = _buffer(tmp_path)
    lock_path = rb.storage.process_lock.path
    child_left = os.path.join(tmp_path, "child-left-the-block")

    def child_after():
        assert not _lock_is_free(lock_path)  # the parent is still inside
        open(child_left, "w").close()

    def parent_inside():
        deadline = time.monotonic() + 30
        while not os.path.exists(child_left) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.path.exists(child_left), "the child failed or never left the block"
        assert not _lock_is_free(lock_path), "the child's exit gave back the parent's lock"

    assert _fork_inside_the_block(rb, lambda: None, child_after, parent_inside) == 0
    assert _lock_is_free(lock_path)  # the parent's exit gave it back


def test_a_write_of_the_child_waits_for_the_parent_to_leave_the_block(tmp_path):
    rb = _buffer(tmp_path)

    def child_inside():
        rb.extend(TensorDict({"x": torch.tensor([4])}, [1]))  # waits for the parent

    def parent_inside():
        time.sleep(0.3)  # (the child is waiting by now)
        rb.extend(TensorDict({"x": torch.tensor([3])}, [1]))

    assert _fork_inside_the_block(rb, child_inside, lambda: None, parent_inside) == 0
    assert rb.storage[: len(rb)]["x"].tolist() == [1, 2, 3, 4]
    rb.extend(TensorDict({"x": torch.tensor([5])}, [1]))  # the parent's lock works on
    assert rb.storage[: len(rb)]["x"].tolist() == [1, 2, 3, 4, 5]
