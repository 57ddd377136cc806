"""A restore (``loads`` / ``load_state_dict``) installs the checked state as one step: a
Ctrl-C in the middle is held back until every part is restored, and a part that raises while
installing leaves a buffer that refuses to be saved (it mixes the checkpoint with its old
state) until a restore succeeds or it is emptied."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer


class InterruptingSampler(RandomSampler):
    """A uniform sampler whose next ``load_state_dict`` sends this process a SIGINT (as a
    Ctrl-C would) or raises ``error``, once."""

    def __init__(self) -> None:
        super().__init__()
        self.next_load: str | BaseException | None = None

    def load_state_dict(self, state_dict):
        action, self.next_load = self.next_load, None
        if action == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
        elif action is not None:
            raise action
        super().load_state_dict(state_dict)


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """Python's own SIGINT handler (KeyboardInterrupt) during each test: a job started in the
    background (nohup, ``cmd &``) runs with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _saved(tmp_path, how):
    """A 3-item buffer's checkpoint (a directory or a state_dict) and a 5-item buffer to
    restore it into."""
    source = ReplayBuffer(storage=ListStorage(8), sampler=InterruptingSampler())
    source.extend([10, 11, 12])
    target = ReplayBuffer(storage=ListStorage(8), sampler=InterruptingSampler())
    target.extend([0, 1, 2, 3, 4])
    if how == "loads":
        source.dumps(tmp_path / "saved")
        return (lambda: target.loads(tmp_path / "saved")), target
    state = source.state_dict()
    return (lambda: target.load_state_dict(state)), target


@pytest.mark.parametrize("how", ["loads", "load_state_dict"])
def test_a_ctrl_c_while_installing_comes_after_the_whole_restore(tmp_path, how):
    restore, rb = _saved(tmp_path, how)
    rb.sampler.next_load = "sigint"
    with pytest.raises(KeyboardInterrupt):
        restore()
    # the writer (installed after the sampler) was restored too: the next write goes after 12
    assert rb[:] == [10, 11, 12] and rb.write_count == 3
    rb.add(13)
    assert rb[:] == [10, 11, 12, 13]
    rb.dumps(tmp_path / "after")  # a complete restore may be saved


@pytest.mark.parametrize("how", ["loads", "load_state_dict"])
def test_a_part_failing_while_installing_makes_the_buffer_refuse_saves(tmp_path, how):
    restore, rb = _saved(tmp_path, how)
    rb.sampler.next_load = MemoryError("no room for the sampler state")
    with pytest.raises(MemoryError):
        restore()
    assert rb[:] == [10, 11, 12] and rb.write_count == 5  # the rows new, the writer old
    for save in (lambda: rb.dumps(tmp_path / "mixed"), rb.state_dict):
        with pytest.raises(RuntimeError, match="failed while installing.*MemoryError"):
            save()
    assert not (tmp_path / "mixed").exists()
    restore()  # a restore that succeeds makes it saveable again
    assert rb[:] == [10, 11, 12] and rb.write_count == 3
    rb.dumps(tmp_path / "restored")
    assert len(rb.state_dict()["_storage"]["storage"]) == 3


def test_emptying_a_half_restored_buffer_makes_it_saveable(tmp_path):
    restore, rb = _saved(tmp_path, "loads")
    rb.sampler.next_load = OSError(5, "Input/output error")
    with pytest.raises(OSError):
        restore()
    rb.empty()
    rb.extend([7])
    rb.dumps(tmp_path / "fresh")
    fresh = ReplayBuffer(storage=ListStorage(8), sampler=InterruptingSampler())
    fresh.loads(tmp_path / "fresh")
    assert fresh[:] == [7]


def test_an_ignored_sigint_stays_ignored(tmp_path):
    restore, rb = _saved(tmp_path, "loads")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rb.sampler.next_load = "sigint"
    restore()  # nothing raised: the process ignores SIGINT
    assert rb.write_count == 3
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_the_sigint_handler_in_place_is_restored(tmp_path):
    restore, rb = _saved(tmp_path, "loads")
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        rb.sampler.next_load = "sigint"
        restore()  # the user's handler runs once the restore is complete; nothing raised
        assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        assert rb.write_count == 3
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.equal(torch.tensor(rb[:]), torch.tensor([10, 11, 12]))


class FailingStorage(ListStorage):
    """A list storage whose next load raises ``error`` before changing anything, as a
    memory-mapped storage whose files roll back on a full disk."""

    def __init__(self, max_size: int) -> None:
        super().__init__(max_size)
        self.next_load: BaseException | None = None

    def _fail_once(self) -> None:
        error, self.next_load = self.next_load, None
        if error is not None:
            raise error

    def load_state_dict(self, state_dict):
        self._fail_once()
        super().load_state_dict(state_dict)

    def replace_items(self, items):  # (what a checkpoint's load installs)
        self._fail_once()
        super().replace_items(items)


@pytest.mark.parametrize("how", ["loads", "load_state_dict"])
def test_a_first_part_failing_whole_leaves_a_buffer_that_may_be_saved(tmp_path, how):
    """The storage's load (the first part) raised after rolling itself back: nothing was
    installed, yet the buffer refused every save, and the remedy offered (``empty()``)
    would have dropped its intact rows."""
    source = ReplayBuffer(storage=FailingStorage(8))
    source.extend([10, 11, 12])
    rb = ReplayBuffer(storage=FailingStorage(8))
    rb.extend([0, 1, 2, 3, 4])
    rb.storage.next_load = OSError(28, "No space left on device")
    with pytest.raises(OSError, match="No space left"):
        if how == "loads":
            source.dumps(tmp_path / "saved")
            rb.loads(tmp_path / "saved")
        else:
            rb.load_state_dict(source.state_dict())
    assert rb[:] == [0, 1, 2, 3, 4] and rb.write_count == 5
    rb.dumps(tmp_path / "after")
    assert rb.state_dict()["_storage"]["storage"] == [0, 1, 2, 3, 4]
