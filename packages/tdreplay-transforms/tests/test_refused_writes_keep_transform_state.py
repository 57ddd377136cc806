"""A write the storage, the writer or a later transform refuses leaves the state of the
write-side transforms as it was: their inverse ran first, so ``VecNorm`` had folded the refused
batch into its statistics, and ``MultiStepTransform`` had swapped the steps it holds back for
the refused batch's (those steps were lost, and the refused rows stored at the next write; a
refused batch with another dtype made every later write fail)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import MultiStepTransform, VecNorm


def steps(start: int, n: int) -> TensorDict:
    t = torch.arange(start, start + n)
    return TensorDict({"t": t, ("next", "t"): t + 1, ("next", "reward"): torch.ones(n),
                       ("next", "done"): torch.zeros(n, dtype=torch.bool)}, [n])


def at_most_4_rows(td):
    if td.shape[0] > 4:
        raise ValueError("batch too large")
    return td


def test_multistep_keeps_its_held_steps_when_a_later_transform_refuses():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
    rb.append_transform(at_most_4_rows, invert=True)
    rb.append_transform(MultiStepTransform(n_steps=2, gamma=0.5))  # its inverse runs first
    rb.extend(steps(0, 4))  # writes t=0, 1; holds 2, 3
    with pytest.raises(ValueError, match="batch too large"):
        rb.extend(steps(100, 6))
    assert len(rb) == 2
    rb.extend(steps(4, 2))
    assert rb[:]["t"].tolist() == [0, 1, 2, 3]
    assert rb[:]["next", "t"].tolist() == [2, 3, 4, 5]


def test_multistep_is_not_stuck_after_the_storage_refuses_a_batch():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                transform=MultiStepTransform(n_steps=3, gamma=0.9))
    rb.extend(steps(0, 4))
    bad = steps(4, 4)
    bad["t"] = bad["t"].double() + 0.5  # a lossy cast: refused by the storage
    with pytest.raises(TypeError):
        rb.extend(bad)
    assert rb.extend(steps(4, 4)).tolist() == [1, 2, 3, 4]  # every later write failed
    assert rb[:]["t"].tolist() == [0, 1, 2, 3, 4]


def _normalized_buffer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    rb.append_transform(VecNorm(in_keys=["obs"], decay=0.9), invert=True)
    rb.extend(TensorDict({"obs": torch.randn(4, 3), "r": torch.zeros(4, 1)}, [4]))
    return rb


def _flat_state(state) -> torch.Tensor:
    """Every tensor of a (nested) state dict, flattened in key order."""
    if isinstance(state, torch.Tensor):
        return state.reshape(-1).double()
    return torch.cat([_flat_state(state[key]) for key in sorted(state, key=str)])


@pytest.mark.parametrize("how", ["extend", "add", "setitem"])
def test_vecnorm_statistics_do_not_take_a_refused_write(how):
    rb = _normalized_buffer()
    before = _flat_state(rb.state_dict()["_transform"]).clone()
    stored = rb[:]["obs"].clone()
    with pytest.raises(ValueError):  # the entry "r" has another shape: refused
        if how == "extend":
            rb.extend(TensorDict({"obs": torch.randn(4, 3) + 100, "r": torch.zeros(4, 2)}, [4]))
        elif how == "add":
            rb.add(TensorDict({"obs": torch.randn(3) + 100, "r": torch.zeros(2)}, []))
        else:
            rb[0] = TensorDict({"obs": torch.randn(3) + 100, "r": torch.zeros(2)}, [])
    assert torch.equal(_flat_state(rb.state_dict()["_transform"]), before)
    assert torch.equal(rb[:]["obs"], stored) and len(rb) == 4


def test_empty_drops_the_steps_multistep_held_back():
    # they came back after the empty: the first write joined them to the new run (t = 2, 3,
    # 4 stored before 100, with n-step targets taken from the new steps)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                transform=MultiStepTransform(n_steps=3, gamma=0.5))
    rb.extend(steps(0, 5))
    rb.empty()
    assert rb.transform[0].held is None
    rb.extend(steps(100, 4))
    assert rb[:]["t"].tolist() == [100]
    assert rb[:]["next", "t"].tolist() == [103]


def test_a_batch_of_another_width_is_named_by_vecnorm_and_multistep():
    # torch's "The size of tensor a (3) must match the size of tensor b (5)" / "Sizes of
    # tensors must match except in dimension 0", naming neither the entry nor the transform
    rb = _normalized_buffer()
    with pytest.raises(ValueError, match=r"VecNorm: the batch's 'obs' has items of shape "
                                         r"\(5,\), its running statistics \(3,\)"):
        rb.extend(TensorDict({"obs": torch.zeros(4, 5), "r": torch.zeros(4, 1)}, [4]))
    assert len(rb) == 4
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                transform=MultiStepTransform(n_steps=3, gamma=0.9))
    wide = steps(0, 4)
    wide["x"] = torch.zeros(4, 1)
    rb.extend(wide)
    wider = steps(4, 4)
    wider["x"] = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"MultiStepTransform: entry 'x' of the data has steps "
                                         r"of shape \(2,\), the held steps \(1,\)"):
        rb.extend(wider)
    assert len(rb) == 1 and rb.transform[0].held["x"].shape == (3, 1)


def test_a_refused_write_does_not_undo_another_threads_write():
    # the state put back was copied before the refused write began, outside any lock: a
    # write by another thread in between was undone with it (its 4 rows stored, not counted)
    import threading

    started, other_done = threading.Event(), threading.Event()

    def gate(td):
        if threading.current_thread().name == "refused":
            started.set()
            other_done.wait(0.5)  # (the other write waits for this one to end)
            raise ValueError("refused")
        return td

    vecnorm = VecNorm(in_keys=["obs"], decay=1.0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50))
    rb.append_transform(gate, invert=True)
    rb.append_transform(vecnorm, invert=True)
    rb.extend(TensorDict({"obs": torch.zeros(4, 1)}, [4]))

    def refused():
        with pytest.raises(ValueError, match="refused"):
            rb.extend(TensorDict({"obs": torch.full((4, 1), 100.0)}, [4]))

    def written():
        started.wait(5)
        rb.extend(TensorDict({"obs": torch.full((4, 1), 5.0)}, [4]))
        other_done.set()

    threads = [threading.Thread(target=refused, name="refused"), threading.Thread(target=written)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    state = vecnorm.state_dict()
    assert len(rb) == 8
    assert (float(state["obs_count"].sum()), float(state["obs_sum"].sum())) == (8.0, 20.0)


def test_an_empty_through_another_buffer_of_the_storage_drops_the_held_steps():
    # two buffers over one storage: the other buffer's empty() reached this one's sampler
    # and writer but not its MultiStepTransform, whose held steps (t = 2, 3, 4) were joined
    # to the next run as above
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                transform=MultiStepTransform(n_steps=3, gamma=0.5))
    other = TensorDictReplayBuffer(storage=rb.storage)
    rb.extend(steps(0, 5))
    other.empty()
    assert rb.transform[0].held is None
    rb.extend(steps(100, 4))
    assert rb[:]["t"].tolist() == [100]
    assert rb[:]["next", "t"].tolist() == [103]


@pytest.mark.parametrize("reset", ["empty", "load_state_dict"])
def test_a_storage_reset_past_the_buffer_drops_the_held_steps(reset):
    # rb.storage.empty() / rb.storage.load_state_dict(...): the held steps (t = 2, 3, 4) were
    # joined to the next run, as before rb.empty() dropped them
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                transform=MultiStepTransform(n_steps=3, gamma=0.5))
    rb.extend(steps(0, 5))
    if reset == "empty":
        rb.storage.empty()
    else:
        other = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                       transform=MultiStepTransform(n_steps=3, gamma=0.5))
        other.extend(steps(500, 4))  # row t = 500 (the others held)
        rb.storage.load_state_dict(other.storage.state_dict())
    rb.extend(steps(100, 4))
    kept = [] if reset == "empty" else [500]
    assert rb[:]["t"].tolist() == kept + [100]
    assert rb[:]["next", "t"].tolist()[len(kept):] == [103]
