"""MultiStepTransform: n-step transitions on write, n steps late; values of TorchRL 0.14.1;
which steps a buffer writes; state round trips; refused input changes nothing."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import MultiStep, MultiStepTransform


def chunk(a: int, b: int, dones=(), envs: int | None = None) -> TensorDict:
    """Steps ``a`` to ``b - 1``: ``s``, ``("next", "s") = s + 1``, reward ``s + 1``."""
    s = torch.arange(a, b)
    done = torch.zeros(b - a, 1, dtype=torch.bool)
    for i in dones:
        done[i - a] = True
    td = TensorDict({"s": s, ("next", "s"): s + 1, ("next", "reward"): (s + 1.0).unsqueeze(-1),
                     ("next", "done"): done, ("next", "terminated"): done.clone()}, [b - a])
    return td if envs is None else torch.stack([td] * envs, 0)


def test_values_of_torchrl():
    # TorchRL 0.14.1, MultiStepTransform(2, 0.5).inv on three writes
    t = MultiStepTransform(2, 0.5)
    out = [t.inv(c) for c in (chunk(0, 3), chunk(3, 4, [3]), chunk(4, 7))]
    assert [o["s"].tolist() for o in out] == [[0], [1], [2, 3, 4]]
    assert [o["next", "s"].tolist() for o in out] == [[2], [3], [4, 4, 6]]
    assert [o["next", "reward"].squeeze(-1).tolist() for o in out] == [[2.0], [3.5],
                                                                       [5.0, 4.0, 8.0]]
    assert out[2]["steps_to_next_obs"].tolist() == [2, 1, 2]
    assert out[2]["gamma"].tolist() == [0.25, 0.5, 0.25]
    assert out[2]["steps_to_next_obs"].shape == (3,)                # TorchRL's: no trailing 1
    assert out[2]["steps_to_next_obs"].dtype == torch.int64
    assert out[2]["gamma"].dtype == torch.float32
    assert out[2]["next", "original_reward"].squeeze(-1).tolist() == [3.0, 4.0, 5.0]
    # unlike TorchRL ([False, True, False]): step 2's window ends in step 3's termination
    assert out[2]["next", "done"].squeeze(-1).tolist() == [True, True, False]
    assert out[2]["next", "terminated"].squeeze(-1).tolist() == [True, True, False]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 4), sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5),
       envs=st.sampled_from([None, 2]), seed=st.integers(0, 1000))
def test_writes_are_multistep_of_the_whole_stream(n, sizes, envs, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    dones = [i for i in range(total) if torch.rand(1, generator=g).item() < 0.25]
    stream = chunk(0, total, dones, envs)
    t = MultiStepTransform(n, 0.9)
    written, start = [], 0
    for size in sizes:
        part = stream[..., start:start + size]
        before = part.clone()
        out = t.inv(part)
        # (TorchRL's: None until the steps seen so far complete a window)
        assert (out is None) == (start + size <= n or size == 0)
        if out is not None:
            written.append(out)
        assert (part == before).all() and set(part.keys(True, True)) == set(before.keys(True,
                                                                                        True))
        start += size
    if total <= n:
        assert written == []
        return
    assert all(set(w.keys(True, True)) == set(written[0].keys(True, True)) for w in written)
    got = torch.cat(written, -1)
    expected = MultiStep(0.9, n)(stream.clone())[..., : total - n]
    assert got.batch_size[-1] == total - n
    for key in expected.keys(True, True):
        assert torch.allclose(got[key].double(), expected[key].double()), key
    held = t.held
    assert held is None or torch.equal(held["s"], stream["s"][..., max(total - n, 0):])


def test_buffer_writes_each_step_once_n_steps_late():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50),
                                transform=MultiStepTransform(n_steps=3, gamma=0.9))
    nothing = rb.extend(chunk(0, 2))                              # no window complete yet
    assert nothing.shape == (0, 1) and nothing.dtype == torch.long  # TorchRL's [0, ndim]
    assert len(rb) == 0
    assert rb.extend(chunk(2, 6)).tolist() == [0, 1, 2]
    assert rb.extend(chunk(6, 7)).tolist() == [3]
    assert rb[:]["s"].tolist() == [0, 1, 2, 3]
    assert rb[:]["next", "s"].tolist() == [3, 4, 5, 6]
    assert rb.sample(2)["s"].shape == (2,)                        # samples are left as they are


@pytest.mark.parametrize("buffer_class", [ReplayBuffer, TensorDictReplayBuffer])
def test_steps_added_one_at_a_time_as_torchrl(buffer_class):
    # rb.add(step) was refused ("write steps with extend"); TorchRL's ReplayBuffer.add writes
    # the step through the transform with a time dimension of one (its TensorDictReplayBuffer
    # raises)
    rb = buffer_class(storage=LazyTensorStorage(20),
                      transform=MultiStepTransform(n_steps=2, gamma=0.5))
    results = [rb.add(step) for step in chunk(0, 5)]
    assert [r.shape for r in results[:2]] == [(0, 1), (0, 1)]  # no window complete yet
    assert results[2:] == [0, 1, 2]
    assert rb[:]["s"].tolist() == [0, 1, 2]
    assert rb[:]["next", "s"].tolist() == [2, 3, 4]
    assert rb[:]["next", "reward"].flatten().tolist() == [1 + 0.5 * 2, 2 + 0.5 * 3, 3 + 0.5 * 4]
    # the same as the stream written in one extend
    whole = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                   transform=MultiStepTransform(n_steps=2, gamma=0.5))
    whole.extend(chunk(0, 5))
    assert (rb[:] == whole[:]).all()
    assert rb.transform[0].held["s"].tolist() == [3, 4]


def test_a_step_added_after_n_steps_was_lowered_completing_two_windows_is_refused():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                transform=MultiStepTransform(n_steps=3, gamma=0.5))
    rb.extend(chunk(0, 4))  # holds 1, 2, 3
    rb.transform[0].n_steps = 1
    with pytest.raises(ValueError, match="completes 3 windows.*write it with extend"):
        rb.add(chunk(4, 5)[0])
    assert len(rb) == 1 and rb.transform[0].held["s"].tolist() == [1, 2, 3]
    assert rb.extend(chunk(4, 5)).tolist() == [1, 2, 3]


def test_two_dim_storage_of_envs():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20, ndim=2),
                                transform=MultiStepTransform(n_steps=2, gamma=1.0))
    assert rb.extend(chunk(0, 2, envs=2)).shape == (0, 2)        # nothing yet: [0, ndim]
    rb.extend(chunk(2, 3, envs=2))
    rb.extend(chunk(3, 6, envs=2))
    stored = rb[:]
    assert stored.batch_size == (2, 4)
    assert stored["s"].tolist() == [[0, 1, 2, 3]] * 2
    assert stored["next", "s"].tolist() == [[2, 3, 4, 5]] * 2
    assert stored["steps_to_next_obs"].shape == (2, 4)


def test_n_steps_changed_between_writes():
    t = MultiStepTransform(n_steps=2, gamma=1.0)
    first = t.inv(chunk(0, 5))
    t.n_steps = 4
    second = t.inv(chunk(5, 10))
    t.n_steps = 1
    third = t.inv(chunk(10, 12))
    steps = torch.cat([first["s"], second["s"], third["s"]]).tolist()
    assert steps == list(range(11))                               # each step once, in order
    assert second["steps_to_next_obs"].tolist() == [4, 4, 4]
    assert third["steps_to_next_obs"].tolist() == [1] * 5


def make_buffer() -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyTensorStorage(30),
                                  transform=MultiStepTransform(n_steps=3, gamma=0.9))


def test_state_round_trip_resumes_exactly(tmp_path):
    straight = make_buffer()
    for c in (chunk(0, 4), chunk(4, 9, [6]), chunk(9, 14)):
        straight.extend(c)
    saved = make_buffer()
    saved.extend(chunk(0, 4))
    saved.extend(chunk(4, 9, [6]))
    state = saved.state_dict()
    assert state["_transform"]["0:MultiStepTransform"]["batch_size"] == [3]
    saved.dumps(tmp_path)
    from_state, from_dir = make_buffer(), make_buffer()
    from_state.load_state_dict(state)
    from_dir.loads(tmp_path)
    for restored in (from_state, from_dir):
        assert torch.equal(restored.transform[0].held["s"], torch.tensor([6, 7, 8]))
        restored.extend(chunk(9, 14))
        assert (restored[:] == straight[:]).all()


def test_state_before_any_write():
    t = MultiStepTransform(2, 0.9)
    assert t.state_dict() == {"held": None, "batch_size": []}
    other = MultiStepTransform(2, 0.9)
    other.inv(chunk(0, 5))
    other.load_state_dict(t.state_dict())
    assert other.held is None


@pytest.mark.parametrize(("state", "error", "name"), [
    ([], TypeError, "mapping"),
    ({"held": None}, KeyError, "batch_size"),
    ({"held": 3, "batch_size": [2]}, TypeError, "held"),
    ({"held": {"s": torch.zeros(2)}, "batch_size": []}, ValueError, "batch_size"),
    ({"held": {"s": torch.zeros(2)}, "batch_size": [3]}, ValueError, "held"),
    # held steps no write can continue (it loaded, then every extend was refused)
    ({"held": {"s": torch.zeros(3), "next": {"s": torch.ones(3)}}, "batch_size": [3]},
     ValueError, r"lack the reward entries \[\('next', 'reward'\)\]"),
])
def test_bad_state_is_refused_and_changes_nothing(state, error, name):
    t = MultiStepTransform(2, 0.9)
    t.inv(chunk(0, 5))
    with pytest.raises(error, match=name):
        t.load_state_dict(state)
    assert t.held["s"].tolist() == [3, 4]
    rb = make_buffer()
    rb.extend(chunk(0, 5))
    good = rb.state_dict()
    good["_transform"]["0:MultiStepTransform"] = state
    with pytest.raises(ValueError, match="_transform"):
        rb.load_state_dict(good)
    assert rb.transform[0].held["s"].tolist() == [2, 3, 4] and len(rb) == 2


def test_refused_writes_change_nothing():
    rb = make_buffer()
    rb.extend(chunk(0, 5))
    with pytest.raises(ValueError, match="does not continue the held steps"):
        rb.add(chunk(5, 6)[0].exclude(("next", "terminated")))
    with pytest.raises(ValueError, match="does not continue the held steps"):
        rb.extend(chunk(5, 8).exclude(("next", "terminated")))
    with pytest.raises(ValueError, match="does not continue the held steps"):
        rb.extend(chunk(5, 8, envs=2))
    with pytest.raises(KeyError, match="reward"):
        MultiStepTransform(2, 0.9).inv(chunk(0, 4).exclude(("next", "reward")))
    assert len(rb) == 2 and rb.transform[0].held["s"].tolist() == [2, 3, 4]
    assert rb.extend(chunk(5, 6)).tolist() == [2]


def test_a_new_non_tensor_entry_is_refused_naming_the_held_steps():
    # (tensordict's raw KeyError "tensordict 1 has keys [...]": non-tensor entries were not
    # among the keys compared)
    rb = make_buffer()
    rb.extend(chunk(0, 5))
    with_text = chunk(5, 8)
    with_text["note"] = "text"
    with pytest.raises(ValueError, match=r"'note'.*does not continue the held steps"):
        rb.extend(with_text)
    assert len(rb) == 2 and rb.transform[0].held["s"].tolist() == [2, 3, 4]


def test_held_steps_are_copies():
    t = MultiStepTransform(2, 0.9)
    data = chunk(0, 4)
    t.inv(data)
    data["s"].fill_(-1)                                  # a collector reusing its buffers
    assert t.held["s"].tolist() == [2, 3]


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"n_steps": 0, "gamma": 0.9}, ValueError, "n_steps"),
    ({"n_steps": 2.0, "gamma": 0.9}, ValueError, "n_steps"),
    ({"n_steps": 2, "gamma": 1.5}, ValueError, "MultiStepTransform: gamma"),
    ({"n_steps": 2, "gamma": 0.9, "done_key": 3}, TypeError, "done_key"),
    ({"n_steps": 2, "gamma": 0.9, "reward_keys": 3}, TypeError, "reward_keys"),
])
def test_bad_arguments_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        MultiStepTransform(**kwargs)
    t = MultiStepTransform(2, 0.9)
    with pytest.raises(ValueError, match="n_steps"):
        t.n_steps = -1
    assert t.n_steps == 2


def test_torchrl_defaults_and_custom_done_key():
    t = MultiStepTransform(2, 0.9)
    assert (t.reward_keys, t.done_key, t.mask_key) == (["reward"], "done", "mask")
    assert t.done_keys == ["done", "truncated", "terminated"]
    td = chunk(0, 4).exclude(("next", "done"), ("next", "terminated"))
    td["next", "end"] = torch.tensor([False, True, False, False]).unsqueeze(-1)
    out = MultiStepTransform(3, 1.0, done_key="end", done_keys=[]).inv(td)
    assert out["steps_to_next_obs"].tolist() == [2]


def test_copies_and_pickles():
    t = MultiStepTransform(2, 0.9)
    t.inv(chunk(0, 4))
    for other in (copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        assert other.held["s"].tolist() == [2, 3]
        assert other.inv(chunk(4, 5))["s"].tolist() == [2]
    assert t.held["s"].tolist() == [2, 3]
