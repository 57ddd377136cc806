"""Several buffers on one storage (TorchRL's ``Storage.attach``): they share a lock, and a change
through one reaches the others' samplers (``tdreplay.core.buffer_readers``)."""

from __future__ import annotations

import copy
import gc
import pickle
import threading
from typing import Any

import pytest
import torch

from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer, Storage


class _Recording(RandomSampler):
    """A uniform sampler that records what the buffer tells it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []

    def extend(self, slots: torch.Tensor) -> None:
        self.calls.append(("extend", torch.as_tensor(slots).tolist()))

    def add(self, slot: int) -> None:
        self.calls.append(("add", int(slot)))

    def mark_update(self, slots: torch.Tensor) -> None:
        self.calls.append(("mark_update", slots.tolist()))

    def mark_edited(self, keys: list[Any] | None = None) -> None:
        self.calls.append(("mark_edited", keys))

    def empty(self) -> None:
        self.calls.append(("empty", None))


def _pair(size: int = 8) -> tuple[Storage, ReplayBuffer, ReplayBuffer, _Recording, _Recording]:
    storage = ListStorage(size)
    sa, sb = _Recording(), _Recording()
    return storage, ReplayBuffer(storage=storage, sampler=sa), \
        ReplayBuffer(storage=storage, sampler=sb), sa, sb


def _held_elsewhere(lock: Any) -> bool:
    """Whether another thread finds ``lock`` taken."""
    taken: list[bool] = []

    def probe() -> None:
        got = lock.acquire(blocking=False)
        taken.append(not got)
        if got:
            lock.release()

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return taken[0]


def test_buffers_attach_in_order_and_share_one_lock() -> None:
    storage, a, b, _, _ = _pair()
    assert storage.attached_buffers == [a, b]
    assert storage.readers.shared
    with a.locked():
        assert _held_elsewhere(storage.readers.lock)
        with b.locked():  # the same re-entrant lock: no deadlock in one thread
            pass
    assert not _held_elsewhere(storage.readers.lock)


def test_a_lone_buffer_is_not_shared() -> None:
    storage = ListStorage(4)
    rb = ReplayBuffer(storage=storage)
    assert storage.attached_buffers == [rb]
    assert not storage.readers.shared


def test_extend_tells_the_other_sampler_which_slots_changed() -> None:
    _, a, b, sa, sb = _pair()
    a.extend([10, 11, 12])
    assert sa.calls == [("extend", [0, 1, 2])]
    assert sb.calls == [("extend", [0, 1, 2])]  # as if written through it


def test_add_and_index_assignment_tell_the_other_sampler() -> None:
    _, a, b, sa, sb = _pair()
    a.add(7)
    a.add(8)
    a[0] = 70
    assert sb.calls == [("extend", [0]), ("extend", [1]), ("mark_update", [0])]
    assert sa.calls == [("add", 0), ("add", 1), ("mark_update", [0])]
    b.add(9)  # and the other way round; b's writer appends after the written rows (TorchRL's
    assert sa.calls[-1] == ("extend", [2])  # own cursor would overwrite row 0: a free row left)


def test_empty_empties_the_other_sampler_and_restarts_its_writer() -> None:
    _, a, b, _, sb = _pair()
    a.extend([1, 2])
    b.extend([3, 4, 5])  # b's cursor: 3
    a.empty()
    assert sb.calls[-1] == ("empty", None)
    assert len(b) == 0 and b.writer.cursor == 0 and b.write_count == 0
    # b writes from the first row again: no row from before the empty comes back
    assert b.extend([6]).tolist() == [0]
    assert a[:] == [6] and b[:] == [6]


def test_empty_keeps_the_others_write_counts_when_asked() -> None:
    _, a, b, _, _ = _pair()
    b.extend([3, 4, 5])
    a.empty(empty_write_count=False)
    assert b.writer.cursor == 0 and b.write_count == 3


def test_a_restore_gives_the_other_sampler_every_written_slot() -> None:
    _, a, b, _, sb = _pair()  # (b held: a buffer gone is told nothing)
    a.extend([1, 2, 3])
    state = a.state_dict()
    a.empty()
    sb.calls.clear()
    a.load_state_dict(state)
    assert sb.calls == [("empty", None), ("extend", [0, 1, 2])]


def test_a_restore_from_disk_reaches_the_other_sampler(tmp_path: Any) -> None:
    _, a, b, _, sb = _pair()
    a.extend([1, 2])
    a.dumps(tmp_path / "ckpt")
    a.extend([3])
    sb.calls.clear()
    a.loads(tmp_path / "ckpt")
    assert sb.calls == [("empty", None), ("extend", [0, 1])]


def test_a_refused_restore_tells_no_one() -> None:
    _, a, b, _, sb = _pair()
    a.extend([1, 2])
    sb.calls.clear()
    with pytest.raises(ValueError, match="max_size"):
        a.load_state_dict(ReplayBuffer(storage=ListStorage(3)).state_dict())
    assert sb.calls == []


def test_a_buffer_gone_is_no_longer_told() -> None:
    storage = ListStorage(4)
    a = ReplayBuffer(storage=storage)
    b = ReplayBuffer(storage=storage)
    del b
    gc.collect()
    assert storage.attached_buffers == [a]
    assert a.extend([1, 2]).tolist() == [0, 1]


def test_set_storage_moves_the_buffer_to_the_new_storage() -> None:
    old, a, b, _, sb = _pair()
    new = ListStorage(8)
    b.set_storage(new)
    assert sb.calls == [("empty", None)]  # its sampler takes the new (empty) storage's slots
    sb.calls.clear()
    assert old.attached_buffers == [a]
    assert new.attached_buffers == [b]
    assert not old.readers.shared
    a.extend([1])
    assert sb.calls == []  # b reads another storage now
    with a.locked():
        assert not _held_elsewhere(new.readers.lock)


def test_copies_read_their_own_copy_of_the_storage() -> None:
    storage, a, b, _, _ = _pair()
    a.extend([1, 2])
    for copied in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a)):
        assert copied.storage is not storage
        assert copied.storage.attached_buffers == [copied]
        assert len(copied.sample(4)) == 4
    assert storage.attached_buffers == [a, b]


def test_a_buffer_built_at_first_use_attaches_then() -> None:
    storage = ListStorage(4)
    a = ReplayBuffer(storage=storage)
    late = ReplayBuffer(storage=storage, delayed_init=True)
    assert storage.attached_buffers == [a]
    late.extend([5])
    assert storage.attached_buffers == [a, late]


def test_mark_update_tells_the_sampler_of_a_change_made_past_the_buffer() -> None:
    sampler = _Recording()
    rb = ReplayBuffer(storage=ListStorage(4), sampler=sampler)
    rb.extend([1, 2, 3])
    rb.storage.set(1, 20, set_cursor=False)
    rb.mark_update(1)
    rb.mark_update(torch.tensor([[0], [2]]))
    assert sampler.calls[1:] == [("mark_update", [1]), ("mark_update", [0, 2])]


@pytest.mark.parametrize("index", [3, torch.tensor([0, 5]), -1])
def test_mark_update_of_an_unwritten_slot_tells_nothing(index: Any) -> None:
    sampler = _Recording()
    rb = ReplayBuffer(storage=ListStorage(8), sampler=sampler)
    rb.extend([1, 2, 3])
    with pytest.raises(IndexError, match="index"):
        rb.mark_update(index)
    assert sampler.calls == [("extend", [0, 1, 2])]


def test_mark_update_refuses_a_tuple_for_a_list_storage() -> None:
    rb = ReplayBuffer(storage=ListStorage(4))
    rb.extend([1])
    with pytest.raises(IndexError, match="one tensor per storage dim"):
        rb.mark_update((torch.tensor([0]), torch.tensor([0])))


