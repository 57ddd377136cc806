"""``rb.submit_update_if_present``: TorchRL's asynchronous ``update_if_present``.

The update is checked when submitted (a bad one raises there and leaves the buffer as it was),
runs on one worker thread in submission order under the buffer's lock, and every batch drawn
after the submission sees it. ``synchronize`` waits for the updates (raising a failure),
``shutdown`` stops the worker, and copies of the buffer carry no pending update.
"""

from __future__ import annotations

import copy
import pickle
import threading
import time

import pytest
import torch
from tensordict import TensorDict, is_tensorclass

from tdreplay.core import ListStorage, ReplayBuffer, RoundRobinWriter, TensorDictReplayBuffer
from tdreplay.core.buffer_conditional import UpdateQueue

storages = pytest.importorskip("tdreplay.storages")


class SlowStorage(storages.LazyTensorStorage):
    """Patches take ``delay`` seconds (the worker holds the buffer's lock meanwhile), and
    raise while ``fail`` is set."""

    delay = 0.0
    fail = False

    def set_key(self, key, value, index=None):
        if self.fail:
            raise OSError("disk full")
        time.sleep(self.delay)
        super().set_key(key, value, index)


@pytest.fixture
def delayed_jobs(monkeypatch):
    """``delayed_jobs([0.3, 0.1])``: the next submitted updates sleep that long on the worker
    before they start (before they take the buffer's lock)."""
    submit = UpdateQueue.submit

    def install(delays):
        delays = list(delays)

        def delayed(self, job):
            delay = delays.pop(0) if delays else 0.0

            def run():
                time.sleep(delay)
                return job()
            return submit(self, run)
        monkeypatch.setattr(UpdateQueue, "submit", delayed)
    return install


def _rb(size=4, storage=None, **kwargs):
    return TensorDictReplayBuffer(storage=storage if storage is not None else SlowStorage(size),
                                  writer=RoundRobinWriter(track_generations=True), **kwargs)


def _fill(rb, values):
    return rb.extend(TensorDict({"value": torch.as_tensor(values, dtype=torch.float32),
                                 "version": torch.zeros(len(values), dtype=torch.long)},
                                [len(values)]))


def _values(rb):
    return rb[:]["value"].tolist()


# ---- results and values -------------------------------------------------------------------------


def test_torchrl_docstring_example_updates_all_four():
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    future = rb.submit_update_if_present(index=index, generation=rb.writer.generations_of(index),
                                         patch={"value": torch.ones(4)})
    assert future.result(timeout=10).updated_count == 4
    assert _values(rb) == [1.0] * 4
    rb.shutdown()


def test_only_live_rows_change_and_keep_their_generation():
    rb = _rb()
    index = _fill(rb, [0.0, 1.0, 2.0, 3.0])
    handle = rb.writer.generations_of(index)
    _fill(rb, [-1.0])  # row 0 rewritten: its handle is stale
    future = rb.submit_update_if_present(index=index, generation=handle,
                                         patch={"value": torch.tensor([10.0, 11.0, 12.0, 13.0])})
    result = future.result(timeout=10)
    assert result.updated.tolist() == [False, True, True, True]
    assert (result.updated_count, result.stale_count, result.version_rejected) == (3, 1, None)
    assert _values(rb) == [-1.0, 11.0, 12.0, 13.0]
    assert rb.writer.generations_of(index).tolist() == [1, 0, 0, 0]


def test_index_shape_is_kept_for_the_patch():
    rb = _rb(6)
    index = _fill(rb, [0.0] * 6).reshape(2, 3)
    future = rb.submit_update_if_present(
        index=index, generation=rb.writer.generations_of(index),
        patch=TensorDict({"value": torch.arange(6.0).reshape(2, 3)}, [2, 3]))
    assert future.result(timeout=10).updated.shape == (6,)
    assert _values(rb) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_versions_reject_older_records():
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    rb.update_if_present(index=index[:2], generation=rb.writer.generations_of(index[:2]),
                         patch={"value": torch.ones(2)}, version_key="version",
                         version=torch.tensor([5, 5]))
    future = rb.submit_update_if_present(
        index=index, generation=rb.writer.generations_of(index),
        patch={"value": torch.full((4,), 9.0)}, version_key="version",
        version=torch.tensor([3, 7, 3, 3]), require_newer=True)
    result = future.result(timeout=10)
    assert result.updated.tolist() == [False, True, True, True]
    assert result.version_rejected.tolist() == [True, False, False, False]
    assert _values(rb) == [1.0, 9.0, 9.0, 9.0]
    assert rb[:]["version"].tolist() == [5, 7, 3, 3]


def test_the_result_is_a_tensorclass_over_the_records():  # (as TorchRL's)
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    handle = rb.writer.generations_of(index)
    _fill(rb, [-1.0])  # row 0 rewritten: its handle is stale
    result = rb.update_if_present(index=index, generation=handle, patch={"value": torch.ones(4)},
                                  version_key="version", version=torch.tensor([1, 1, 0, 1]),
                                  require_newer=True)
    assert is_tensorclass(result) and len(result) == 4 and result.batch_size == (4,)
    assert (result[0].updated.item(), result[0].version_rejected.item()) == (False, False)
    assert result[1:].updated.tolist() == [True, False, True]
    assert result[1:].version_rejected.tolist() == [False, True, False]
    assert (result[1:].updated_count, result[1:].version_rejected_count) == (2, 1)


def test_updates_run_in_submission_order(delayed_jobs):
    rb = _rb()
    delayed_jobs([0.25, 0.2, 0.15, 0.1, 0.05])  # run at once, the last would finish first
    index = _fill(rb, [0.0] * 4)
    handle = rb.writer.generations_of(index)
    futures = [rb.submit_update_if_present(index=index[:1], generation=handle[:1],
                                           patch={"value": torch.tensor([float(k)])})
               for k in range(1, 6)]
    assert [f.result(timeout=10).updated_count for f in futures] == [1] * 5
    assert _values(rb) == [5.0, 0.0, 0.0, 0.0]


# ---- ordering with samples ----------------------------------------------------------------------


def test_a_sample_after_the_submission_sees_the_update(delayed_jobs):
    rb = _rb(batch_size=16)
    index = _fill(rb, [0.0] * 4)
    delayed_jobs([0.3])  # the sample is asked for before the update has started
    future = rb.submit_update_if_present(index=index, generation=rb.writer.generations_of(index),
                                         patch={"value": torch.ones(4)})
    sample = rb.sample()
    assert future.done()
    assert sample["value"].tolist() == [1.0] * 16


def test_prefetched_batches_drawn_after_the_submission_see_the_update(delayed_jobs):
    rb = _rb(batch_size=16, prefetch=1)
    index = _fill(rb, [0.0] * 4)
    assert rb.sample()["value"].tolist() == [0.0] * 16  # one more batch drawn ahead now
    delayed_jobs([0.3])
    future = rb.submit_update_if_present(index=index, generation=rb.writer.generations_of(index),
                                         patch={"value": torch.ones(4)})
    rb.sample()  # drawn ahead before the submission: old or new
    assert rb.sample()["value"].tolist() == [1.0] * 16  # queued after it: waited for it
    assert future.done()


# ---- bad input: raised at submission, nothing queued, buffer unchanged --------------------------


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"patch": {"missing": torch.ones(4)}}, KeyError, "not an entry"),
    ({"patch": {"value": torch.ones(3)}}, ValueError, "shape"),
    ({"patch": {"value": torch.ones(4, dtype=torch.float64)}}, ValueError, "dtype"),
    ({"patch": {"value": [1.0] * 4}}, ValueError, "must be a tensor"),
    ({"patch": 3}, TypeError, "patch"),
    ({"generation": torch.zeros(3, dtype=torch.long)}, ValueError, "same records"),
    ({"version_key": "version"}, ValueError, "together"),
    ({"version_key": "version", "version": torch.tensor(1.5)}, ValueError, "dtype"),
    ({"version_key": "nope", "version": 1}, KeyError, "version_key"),
    ({"require_newer": 1}, TypeError, "require_newer"),
])
def test_bad_input_raises_at_submission_and_changes_nothing(kwargs, error, match, unchanged):
    rb = _rb()
    index = _fill(rb, [0.0, 1.0, 2.0, 3.0])
    args = {"index": index, "generation": rb.writer.generations_of(index),
            "patch": {"value": torch.ones(4)}, **kwargs}
    with unchanged(rb), pytest.raises(error, match=match):
        rb.submit_update_if_present(**args)
    rb.synchronize()  # nothing was queued, nothing failed
    assert _values(rb) == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("rb", [
    ReplayBuffer(storage=ListStorage(4), writer=RoundRobinWriter(track_generations=True)),
    TensorDictReplayBuffer(storage=storages.LazyTensorStorage(4)),  # no generations
], ids=["list-storage", "untracked-writer"])
def test_unsupported_buffers_are_refused_at_submission(rb):
    with pytest.raises(RuntimeError, match="not supported"):
        rb.submit_update_if_present(index=torch.arange(2), generation=torch.zeros(2),
                                    patch={"value": torch.ones(2)})


def test_an_empty_buffer_accepts_the_update_and_patches_nothing():
    rb = _rb()
    future = rb.submit_update_if_present(index=torch.arange(2),
                                         generation=torch.zeros(2, dtype=torch.long),
                                         patch={"anything": torch.ones(2)})
    assert future.result(timeout=10).updated.tolist() == [False, False]
    assert len(rb) == 0


# ---- failures at run time -----------------------------------------------------------------------


def test_a_failure_at_run_time_reaches_the_future_and_synchronize_once():
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    rb.storage.fail = True
    future = rb.submit_update_if_present(index=index, generation=rb.writer.generations_of(index),
                                         patch={"value": torch.ones(4)})
    with pytest.raises(OSError, match="disk full"):
        future.result(timeout=10)
    with pytest.raises(OSError, match="disk full"):
        rb.synchronize()
    rb.synchronize()  # reported once
    rb.storage.fail = False
    assert _values(rb) == [0.0] * 4
    again = rb.submit_update_if_present(index=index, generation=rb.writer.generations_of(index),
                                        patch={"value": torch.ones(4)})
    assert again.result(timeout=10).updated_count == 4  # the worker goes on


# ---- lifecycle: synchronize, shutdown, copies ---------------------------------------------------


def test_synchronize_waits_and_a_checkpoint_then_holds_the_update():
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    rb.storage.delay = 0.2
    rb.submit_update_if_present(index=index, generation=rb.writer.generations_of(index),
                                patch={"value": torch.ones(4)})
    rb.synchronize()
    restored = _rb()
    restored.load_state_dict(rb.state_dict())
    assert _values(restored) == [1.0] * 4


def test_shutdown_waits_for_pending_updates_then_refuses_new_ones(unchanged):
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    handle = rb.writer.generations_of(index)
    rb.storage.delay = 0.2
    future = rb.submit_update_if_present(index=index, generation=handle,
                                         patch={"value": torch.ones(4)})
    rb.shutdown()
    assert future.done() and _values(rb) == [1.0] * 4
    assert not rb.is_alive
    with unchanged(rb), pytest.raises(RuntimeError, match="shut down"):
        rb.submit_update_if_present(index=index, generation=handle,
                                    patch={"value": torch.full((4,), 2.0)})
    rb.shutdown()  # twice is fine


@pytest.mark.parametrize("duplicate", [None, pickle.loads, copy.deepcopy],
                         ids=["same", "pickle", "deepcopy"])
def test_a_buffer_shut_down_before_any_submission_refuses_updates(duplicate):
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    handle = rb.writer.generations_of(index)
    rb.shutdown()
    if duplicate is pickle.loads:
        rb = pickle.loads(pickle.dumps(rb))
    elif duplicate is not None:
        rb = duplicate(rb)
    ran = []
    with pytest.raises(RuntimeError, match="shut down"):
        rb.submit_update(lambda: ran.append(1))
    with pytest.raises(RuntimeError, match="shut down"):
        rb.submit_update_if_present(index=index, generation=handle,
                                    patch={"value": torch.ones(4)})
    rb.synchronize()
    assert ran == [] and _values(rb) == [0.0] * 4


@pytest.mark.parametrize("duplicate", [pickle.loads, copy.deepcopy], ids=["pickle", "deepcopy"])
def test_copies_have_no_pending_updates_and_update_on_their_own(duplicate):
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    handle = rb.writer.generations_of(index)
    rb.storage.delay = 0.1
    first = rb.submit_update_if_present(index=index, generation=handle,
                                        patch={"value": torch.ones(4)})
    copied = duplicate(pickle.dumps(rb)) if duplicate is pickle.loads else duplicate(rb)
    first.result(timeout=10)
    assert _values(rb) == [1.0] * 4
    copied.storage.delay = 0.0
    copied.synchronize()  # nothing pending in the copy
    future = copied.submit_update_if_present(index=index[:1], generation=handle[:1],
                                             patch={"value": torch.tensor([5.0])})
    assert future.result(timeout=10).updated_count == 1
    assert _values(copied)[0] == 5.0 and _values(rb)[0] == 1.0


# ---- thread safety ------------------------------------------------------------------------------


def test_concurrent_writes_never_receive_a_patch_meant_for_an_older_record():
    """A collector thread overwrites rows while updates are submitted with the handles of
    earlier rows: a patch value ends up in a row only if that submission reported the row
    live, and the row still holds the record the handle named."""
    rb = _rb(8)
    _fill(rb, [0.0] * 8)
    stop = threading.Event()

    def collect():
        while not stop.is_set():
            _fill(rb, [-1.0, -1.0, -1.0])

    collector = threading.Thread(target=collect)
    collector.start()
    submitted = []
    try:
        for k in range(40):
            with rb.locked():
                index = torch.arange(8)
                handle = rb.writer.generations_of(index)
            value = torch.full((8,), 1000.0 + k)
            submitted.append((handle, rb.submit_update_if_present(
                index=index, generation=handle, patch={"value": value})))
        rb.synchronize()
    finally:
        stop.set()
        collector.join()
    results = [(handle, future.result().updated) for handle, future in submitted]
    generations = rb.writer.generations_of(torch.arange(8))
    for row, value in enumerate(_values(rb)):
        if value >= 1000.0:
            handle, updated = results[int(value) - 1000]
            assert bool(updated[row]) and int(handle[row]) == int(generations[row])


@pytest.mark.parametrize("restore", ["load_state_dict", "loads"])
def test_a_restore_waits_for_the_updates_submitted_before_it(restore, tmp_path):
    # the update is slow to take the lock (its job sleeps first): a restore that did not wait
    # for it was patched by it afterwards (the restored generations still match the handle)
    rb = _rb()
    index = _fill(rb, [0.0] * 4)
    handle = rb.writer.generations_of(index)
    saved = rb.state_dict()
    rb.dumps(tmp_path / "ckpt")
    apply = rb._apply

    def slow_apply(request):
        time.sleep(0.3)
        return apply(request)

    rb._apply = slow_apply
    future = rb.submit_update_if_present(index=index, generation=handle,
                                         patch={"value": torch.ones(4)})
    if restore == "load_state_dict":
        rb.load_state_dict(saved)
    else:
        rb.loads(tmp_path / "ckpt")
    assert future.done() and future.result().updated_count == 4  # done before the restore
    assert _values(rb) == [0.0] * 4  # the restored data, not patched after it
