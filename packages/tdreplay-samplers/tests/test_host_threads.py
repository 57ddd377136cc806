"""Large host kernel calls split over torch's intra-op threads: how many parts, their ranges, the
threads they run in and their errors."""

from __future__ import annotations

import threading

import pytest
import torch

from tdreplay.samplers._host_threads import (
    MIN_ITEMS_PER_THREAD,
    run_parts,
    thread_count,
    thread_ranges,
)


@pytest.mark.parametrize(("n", "threads", "expected"), [
    (0, 4, 1),
    (2 * MIN_ITEMS_PER_THREAD - 1, 8, 1),
    (2 * MIN_ITEMS_PER_THREAD, 8, 2),
    (5 * MIN_ITEMS_PER_THREAD + 1, 8, 5),
    (100 * MIN_ITEMS_PER_THREAD, 3, 3),
    (100 * MIN_ITEMS_PER_THREAD, 1, 1),
])
def test_thread_count_is_torchs_threads_with_enough_items_each(torch_threads, n, threads,
                                                               expected):
    torch.set_num_threads(threads)
    assert thread_count(n) == expected


@pytest.mark.parametrize("n", [0, 7, 3 * MIN_ITEMS_PER_THREAD + 5])
@pytest.mark.parametrize("parts", [1, 2, 3, 16])
def test_thread_ranges_cover_every_item_once_with_sizes_one_apart(n, parts):
    ranges = thread_ranges(n, parts)
    assert len(ranges) == parts
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(stop == start for (_, stop), (start, _) in zip(ranges, ranges[1:]))
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_one_part_runs_in_the_callers_thread():
    calls = []
    results = run_parts(lambda start, stop: calls.append((start, stop, threading.get_ident()))
                        or stop, [(0, 10**6)])
    assert calls == [(0, 10**6, threading.get_ident())]
    assert results == [10**6]


def test_several_parts_run_in_other_threads_too():
    calls = []
    everyone = threading.Barrier(3, timeout=60)  # all parts run at once, each in a thread

    def work(part: int, start: int) -> int:
        calls.append((part, threading.get_ident()))
        everyone.wait()
        return start

    parts = [(0, 5), (1, 9), (2, 11)]
    assert run_parts(work, parts) == [5, 9, 11]  # in the parts' order
    assert sorted(part for part, _ in calls) == [0, 1, 2]
    assert dict(calls)[0] == threading.get_ident()  # the caller's thread runs the first part
    assert len({ident for _, ident in calls}) == 3


def test_an_error_in_a_part_is_raised_once_every_part_is_done():
    done = []
    release = threading.Event()

    def work(start: int) -> int:
        if start == 0:
            raise ValueError("part 0 fails")
        release.wait(5)  # still running when the caller's part has failed
        done.append(start)
        return start

    timer = threading.Timer(0.2, release.set)
    timer.start()
    with pytest.raises(ValueError, match="part 0 fails"):
        run_parts(work, [(0,), (1,)])
    timer.join()
    assert done == [1]  # the other part had finished before the raise


def test_an_error_in_another_thread_is_raised_to_the_caller():
    def work(start: int) -> int:
        if start:
            raise IndexError(f"part {start} fails")
        return 0

    with pytest.raises(IndexError, match="part 1 fails"):
        run_parts(work, [(0,), (1,)])


def test_more_parts_than_the_pool_has_threads_get_a_larger_pool():
    for parts in (2, 5):
        # every part waits until all of them run: only a pool with a thread per part gets
        # past the barrier (a smaller one would leave a part queued, and the barrier breaks)
        everyone = threading.Barrier(parts, timeout=60)

        def part(_: int, everyone: threading.Barrier = everyone) -> int:
            everyone.wait()
            return threading.get_ident()

        idents = run_parts(part, [(i,) for i in range(parts)])
        assert len(set(idents)) == parts
