"""TED2Flat / Flat2TED: each observation once, rows rebuilt exactly, through dumps / loads."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import DEFAULT_DONE_KEYS, TensorDictReplayBuffer
from tdreplay.storages import Flat2TED, LazyTensorStorage, TED2Flat


def _rows(n=9, ends=(2, 6)):
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[list(ends)] = True
    obs = torch.arange(n + 1.0)
    return TensorDict({"obs": obs[:-1], "action": torch.arange(n),
                       "done": torch.zeros(n, 1, dtype=torch.bool),
                       "next": {"obs": obs[1:], "done": done, "reward": torch.ones(n, 1),
                                "info": torch.zeros(n, 2)}}, [n])


def test_defaults_as_torchrl():
    hook = TED2Flat()
    assert hook.done_keys == set(DEFAULT_DONE_KEYS)
    assert hook.reward_keys == {"reward"}
    assert hook.shift is None and hook.is_full is None


def test_flat_keeps_each_observation_once_and_rebuilds_rows():
    rows = _rows()
    flat = TED2Flat()(rows)
    # 9 steps, 3 trajectories: 12 observations instead of 18
    assert flat["obs"].tolist() == [0, 1, 2, 3, 3, 4, 5, 6, 7, 7, 8, 9]
    assert flat["done"].shape == (9, 1) and flat["action"].shape == (9,)
    assert bool((Flat2TED()(flat) == rows).all())


def test_full_ring_saved_oldest_first():
    # steps 3..8 of _rows() in a 6-slot ring: slots 0-2 hold steps 6-8, the next write is slot 3
    ring = _rows()[torch.tensor([6, 7, 8, 3, 4, 5])]
    hook = TED2Flat()
    hook.shift, hook.is_full = 3, True
    flat = hook(ring)
    # trajectories (time order): steps 3-6 (done at 6), then 7-8 (cut at the newest step)
    assert flat["obs"].tolist() == [3, 4, 5, 6, 7, 7, 8, 9]
    assert bool((Flat2TED()(flat) == ring).all())


def test_dumps_and_loads_through_the_hooks(tmp_path):
    def make():
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6))
        rb.register_save_hook(TED2Flat())
        rb.register_load_hook(Flat2TED())
        return rb

    rb = make()
    rb.extend(_rows())  # 9 rows in 6 slots: the ring wrapped
    rb.dumps(tmp_path)
    restored = make()
    restored.loads(tmp_path)
    assert bool((restored.storage[:] == rb.storage[:]).all())


def _hooked_buffer() -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6))
    rb.register_save_hook(TED2Flat())
    rb.register_load_hook(Flat2TED())
    return rb


def test_an_emptied_buffer_saves_and_loads_empty(tmp_path):
    # it raised "cannot reshape tensor of 0 elements" at dumps: an emptied buffer never saved
    rb = _hooked_buffer()
    rb.extend(_rows())
    rb.empty()
    rb.dumps(tmp_path)
    restored = _hooked_buffer()
    restored.extend(_rows(4, ends=(1,)))
    restored.loads(tmp_path)
    assert len(restored) == 0
    restored.extend(_rows(3, ends=(2,)))
    assert restored.storage[:]["obs"].tolist() == [0.0, 1.0, 2.0]
    flat = TED2Flat()(_rows()[:0])
    assert flat["storage_rows"].item() == 0 and flat["obs"].shape == (0,)
    back = Flat2TED()(flat)
    assert back.batch_size == (0,) and ("next", "obs") in back.keys(True, True)
    assert "action" in back.keys() and ("next", "action") not in back.keys(True, True)


@pytest.mark.parametrize("entry", ["root", ("root", "x"), "traj_ends", "storage_rows", "shift",
                                   "is_full", ("shift", "y")])
def test_an_entry_named_as_the_format_own_is_refused_at_dumps(entry, tmp_path):
    # saved, it came back renamed (("root", "x") -> "x"), overwritten or missing, no error
    rb = _hooked_buffer()
    rows = _rows(4, ends=(1,))
    rows.set(entry, torch.arange(4))
    rb.extend(rows)
    with pytest.raises(ValueError, match="the flat format keeps its own") as refused:
        rb.dumps(tmp_path)
    assert repr(entry if isinstance(entry, str) else entry) in str(refused.value)
    hook = TED2Flat(shift_key="ring_shift", is_full_key="ring_full")
    if entry in ("shift", "is_full", ("shift", "y")):  # other names for the format's own: saved
        flat = hook(rows)
        assert bool((Flat2TED(shift_key="ring_shift", is_full_key="ring_full")(flat)
                     == rows).all())


def test_bad_input():
    with pytest.raises(ValueError, match="ndim=1"):
        TED2Flat()(_rows().reshape(3, 3))
    with pytest.raises(KeyError, match="done_key"):
        TED2Flat(done_key="nope")(_rows())
    with pytest.raises(KeyError, match="TED2Flat"):
        Flat2TED()(TensorDict({"obs": torch.zeros(3)}, []))


def _unaliased_rows():
    # _rows() takes "obs" and ("next", "obs") from one tensor: an edit of one is not an edit
    # of the other only once they are copies
    rows = _rows()
    rows["obs"], rows["next", "obs"] = rows["obs"].clone(), rows["next", "obs"].clone()
    return rows


def _assert_bitwise_same(got, expected):
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        assert got[key].dtype is expected[key].dtype and got[key].shape == expected[key].shape
        assert torch.equal(got[key].contiguous().view(torch.uint8),  # (NaN, -0.0: bitwise)
                           expected[key].contiguous().view(torch.uint8)), key


def test_a_next_entry_that_is_not_ted_is_kept_whole():
    # multi-step targets: ("next", "obs") of a step is not the root "obs" of the step after it.
    # Saving it as the following root values (TorchRL's TED2Flat) would rebuild other values
    rows = _unaliased_rows()
    rows["next", "obs"] = rows["next", "obs"] + 10.0
    flat = TED2Flat()(rows)
    assert flat["obs"].tolist() == rows["obs"].tolist()  # not merged with its twin
    assert flat["next", "obs"].tolist() == rows["next", "obs"].tolist()
    _assert_bitwise_same(Flat2TED()(flat), rows)


def test_a_single_step_that_differs_keeps_the_entry_whole():
    rows = _unaliased_rows()
    rows["next", "obs"][4] = -1.0  # one step inside the second trajectory
    _assert_bitwise_same(Flat2TED()(TED2Flat()(rows)), rows)
    rows = _unaliased_rows()
    rows["next", "obs"][2] = -1.0  # the last step of a trajectory: its own value is saved
    flat = TED2Flat()(rows)
    assert ("next", "obs") not in flat.keys(True, True)  # still TED: merged with "obs"
    _assert_bitwise_same(Flat2TED()(flat), rows)


def test_a_next_entry_of_another_dtype_or_shape_is_kept_whole():
    rows = _unaliased_rows()
    rows["next", "obs"] = rows["next", "obs"].double() + 1e-12  # a cast to float32 loses it
    rows["state"] = torch.arange(9.0)
    rows["next", "state"] = torch.arange(1.0, 10.0).unsqueeze(-1)
    _assert_bitwise_same(Flat2TED()(TED2Flat()(rows)), rows)


def test_ted_comparison_is_bitwise():
    # NaN observations repeat bitwise (still TED, merged); -0.0 is not bitwise 0.0 (kept whole)
    rows = _unaliased_rows()
    rows["obs"][3] = float("nan")
    rows["next", "obs"][2] = float("nan")  # step 2 ends a trajectory: any value
    rows["obs"][5] = float("nan")
    rows["next", "obs"][4] = float("nan")
    flat = TED2Flat()(rows)
    assert ("next", "obs") not in flat.keys(True, True)
    _assert_bitwise_same(Flat2TED()(flat), rows)
    rows = _unaliased_rows()
    rows["next", "obs"][0] = -0.0
    rows["obs"][1] = 0.0
    flat = TED2Flat()(rows)
    assert ("next", "obs") in flat.keys(True, True)
    rebuilt = Flat2TED()(flat)
    assert torch.signbit(rebuilt["next", "obs"][0]) and not torch.signbit(rebuilt["obs"][1])


@pytest.mark.parametrize("hook", [TED2Flat, Flat2TED])
@pytest.mark.parametrize("argument, value, message", [
    ("done_key", 5, "done_key must be a str or a tuple of str"),
    ("shift_key", ("a", 3), "shift_key must be a str or a tuple of str"),
    ("done_keys", "done", "done_keys must be a sequence of keys"),
    ("reward_keys", ["reward", 4], "reward_keys must be a str or a tuple of str"),
])
def test_a_key_argument_that_is_no_key_is_a_type_error_naming_it(hook, argument, value,
                                                                  message):
    # (tensordict's RuntimeError "key should be a Sequence<NestedKey>"; done_keys="done" was
    # taken as the keys "d", "o", "n", "e")
    with pytest.raises(TypeError, match=message):
        hook(**{argument: value})
