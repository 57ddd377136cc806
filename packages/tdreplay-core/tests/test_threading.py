"""One thread extends while others sample: every sampled row is whole and where it belongs."""

from __future__ import annotations

import threading

import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer

CAPACITY = 64
CHUNK = 4
WRITES = 1500


def transitions(first: int, n: int) -> TensorDict:
    """Rows numbered ``first .. first + n - 1``; row ``k`` holds ``obs == k``, ``next.obs == k + 1``."""
    k = torch.arange(first, first + n, dtype=torch.float64)
    return TensorDict(
        {"k": k, "obs": k[:, None].expand(n, 3).clone(), ("next", "obs"): (k + 1)[:, None].expand(n, 3).clone()},
        [n],
    )


def check_rows(sample: TensorDict) -> None:
    k = sample["k"]
    assert torch.equal(sample["obs"], k[:, None].expand_as(sample["obs"]))
    assert torch.equal(sample["next", "obs"], sample["obs"] + 1)
    # round-robin: row k lives at slot k % CAPACITY, so a stale or torn row shows up here
    assert torch.equal(k.long() % CAPACITY, sample["index"])


def run_threads(targets) -> None:
    errors: list[BaseException] = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
                errors.append(err)
        return run

    threads = [threading.Thread(target=guard(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def test_extend_while_sampling_never_shows_a_half_written_row():
    rb = TensorDictReplayBuffer(storage=ListStorage(CAPACITY), batch_size=16)
    rb.extend(transitions(0, CHUNK))
    stop = threading.Event()
    sampled = [0, 0]

    def writer() -> None:
        try:
            for i in range(1, WRITES):
                rb.extend(transitions(i * CHUNK, CHUNK))
        finally:
            stop.set()

    def learner(slot: int) -> None:
        while not stop.is_set():
            check_rows(rb.sample())
            sampled[slot] += 1

    run_threads([writer, lambda: learner(0), lambda: learner(1)])
    assert rb.write_count == WRITES * CHUNK and len(rb) == CAPACITY
    assert sampled[0] > 0 and sampled[1] > 0
    final = rb[:]
    assert final["k"].long().tolist() == sorted(range(WRITES * CHUNK - CAPACITY, WRITES * CHUNK),
                                                key=lambda k: k % CAPACITY)


def test_concurrent_index_assignment_and_sampling():
    rb = TensorDictReplayBuffer(storage=ListStorage(CAPACITY), batch_size=8)
    rb.extend(transitions(0, CAPACITY))
    stop = threading.Event()

    def rewriter() -> None:
        try:
            for i in range(600):
                slots = torch.tensor([i % CAPACITY, (i * 7) % CAPACITY])
                # rewrite with the same row numbers: contents stay consistent with the slots
                rb[slots] = transitions(0, CAPACITY)[slots]
        finally:
            stop.set()

    def learner() -> None:
        while not stop.is_set():
            check_rows(rb.sample())

    run_threads([rewriter, learner, learner])


def test_set_storage_keeps_other_threads_out_until_the_caller_leaves():
    # inside the lock, set_storage moves the buffer to the new storage's lock: a thread that
    # was waiting for the old lock, and one that comes after the move, both wait until the
    # caller leaves (before, the second got in at once through the new lock), and each
    # leaves what it took
    import time

    from tdreplay.core import ReplayBuffer

    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([1, 2])
    entered, errors = [], []

    def enter(name):
        try:
            with rb.locked():
                entered.append((name, len(rb)))
        except BaseException as err:  # (RuntimeError: cannot release un-acquired lock)
            errors.append(err)

    early = threading.Thread(target=enter, args=("early",))
    late = threading.Thread(target=enter, args=("late",))
    with rb.locked():
        early.start()
        time.sleep(0.05)  # it now waits for the old lock
        rb.set_storage(ListStorage(10))
        late.start()
        time.sleep(0.05)
        assert entered == []  # neither got in while the caller is inside
        rb.extend([7])
    early.join(10)
    late.join(10)
    assert not early.is_alive() and not late.is_alive() and errors == []
    assert sorted(entered) == [("early", 1), ("late", 1)]
    rb.extend([8])  # nothing left held
    assert rb[:] == [7, 8]


def test_set_storage_while_threads_write_and_sample():
    import sys

    from tdreplay.core import ReplayBuffer

    rb = ReplayBuffer(storage=ListStorage(64), batch_size=4)
    rb.extend(list(range(8)))
    stop, errors = threading.Event(), []

    def loop(step):
        try:
            while not stop.is_set():
                step()
        except BaseException as err:
            errors.append(err)

    def sample():
        try:
            rb.sample()
        except RuntimeError as err:  # a storage just swapped in holds nothing yet
            assert "empty" in str(err).lower()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=loop, args=(f,), daemon=True)
                   for f in (lambda: rb.extend([1, 2, 3]), sample)]
        for thread in threads:
            thread.start()
        for _ in range(200):
            rb.set_storage(ListStorage(64))
        stop.set()
        for thread in threads:
            thread.join(10)
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    with rb.locked():  # nothing left held by a thread that has gone
        rb.extend([1])


class _SlowToCopy:
    """An item whose copy (deepcopy or pickle) waits until told to go on."""

    def __init__(self, inside: threading.Event, go_on: threading.Event) -> None:
        self.inside, self.go_on = inside, go_on

    def __reduce__(self):
        self.inside.set()
        self.go_on.wait(10)
        return (int, (5,))


def _copy_while_a_thread_extends(copy_fn):
    """Copy a buffer holding a slow item while another thread extends it; the rows and write
    count of the copy, and whether the extend got in while the copy was being made."""
    import time

    from tdreplay.core import ReplayBuffer

    inside, go_on = threading.Event(), threading.Event()
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([1, _SlowToCopy(inside, go_on)])
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("copy", copy_fn(rb)))
    thread.start()
    inside.wait(10)
    writer = threading.Thread(target=lambda: rb.extend([3, 4]))
    writer.start()
    time.sleep(0.05)
    extended_meanwhile = len(rb) == 4
    go_on.set()
    thread.join(10)
    writer.join(10)
    copied = result["copy"]
    return copied[:], copied.write_count, extended_meanwhile


def test_deepcopy_is_one_state_while_another_thread_writes():
    # the lock is held from the start of the copy to its end: the extend waits, and the copy
    # holds the two rows of its write count (before, the extend got in half-way: the copy
    # could hold rows of a write its write count does not count)
    import copy

    rows, write_count, extended_meanwhile = _copy_while_a_thread_extends(copy.deepcopy)
    assert not extended_meanwhile
    assert write_count == 2 and len(rows) == 2 and rows[0] == 1


def test_pickle_inside_locked_is_one_state_while_another_thread_writes():
    import pickle

    def pickled_inside_locked(rb):
        with rb.locked():
            return pickle.loads(pickle.dumps(rb))

    rows, write_count, extended_meanwhile = _copy_while_a_thread_extends(pickled_inside_locked)
    assert not extended_meanwhile
    assert rows == [1, 5] and write_count == 2
