"""TED2Nested / Nested2TED / H5Split / H5Combine: one row per trajectory, rows rebuilt bitwise."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import (
    FlatStorageCheckpointer,
    H5Combine,
    H5Split,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    Nested2TED,
    NestedStorageCheckpointer,
    TED2Flat,
    TED2Nested,
)


def _rows(n=9, ends=(2, 6)):
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[list(ends)] = True
    obs = torch.arange(n + 1.0)
    return TensorDict({"obs": obs[:-1].clone(), "action": torch.arange(n) * 10,
                       "done": torch.zeros(n, 1, dtype=torch.bool),
                       "next": {"obs": obs[1:].clone(), "done": done,
                                "reward": torch.arange(n, dtype=torch.float32).unsqueeze(-1)}},
                      [n])


def _parts(nested_tensor):
    return [part.tolist() for part in nested_tensor.unbind(0)]


def _assert_bitwise_same(got, expected):
    assert got.batch_size == expected.batch_size
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        a, b = got.get(key), expected.get(key)
        assert a.dtype is b.dtype and a.shape == b.shape, key
        assert torch.equal(a.contiguous().view(torch.uint8),  # (NaN, -0.0: bitwise)
                           b.contiguous().view(torch.uint8)), key


def _hook(cls, shift=None, is_full=None, **kwargs):
    hook = cls(**kwargs)
    hook.shift, hook.is_full = shift, is_full
    return hook


def _round_trips(rows, shift=None, is_full=None, **kwargs):
    nested = _hook(TED2Nested, shift, is_full, **kwargs)(rows)
    _assert_bitwise_same(Nested2TED(**kwargs)(nested), rows)
    split = H5Split(**kwargs)(nested)
    _assert_bitwise_same(Nested2TED(**kwargs)(H5Combine()(split)), rows)
    return nested


# ---- values ---------------------------------------------------------------------------------
def test_one_row_per_trajectory_with_its_steps():
    nested = TED2Nested()(_rows())
    assert nested.batch_size == (3,)  # steps 0-2, 3-6, 7-8
    assert nested["obs"].is_nested and nested["obs"].layout is torch.strided
    # observations: the root values of the steps, then the last step's ("next", "obs")
    assert _parts(nested["obs"]) == [[0, 1, 2, 3], [3, 4, 5, 6, 7], [7, 8, 9]]
    assert _parts(nested["action"]) == [[0, 10, 20], [30, 40, 50, 60], [70, 80]]
    # end flags and rewards come from "next", one per step
    assert _parts(nested["done"]) == [[[False], [False], [True]],
                                      [[False], [False], [False], [True]], [[False], [False]]]
    assert _parts(nested["reward"]) == [[[0], [1], [2]], [[3], [4], [5], [6]], [[7], [8]]]
    assert _parts(nested["root", "done"]) == [[[False]] * 3, [[False]] * 4, [[False]] * 2]
    assert _parts(nested["traj_ends"]) == [[False, False, True], [False, False, False, True],
                                           [False, True]]
    assert "next" not in nested.keys()  # every "next" entry is TED or kept from "next"
    assert (nested["shift"], nested["is_full"], nested["storage_rows"]) == (9, False, 9)


def test_the_trajectories_are_those_of_ted2flat():
    rows = _rows()
    flat, nested = TED2Flat()(rows), TED2Nested()(rows)
    for key in ("obs", "action", "done", "reward", "traj_ends", ("root", "done")):
        assert torch.equal(torch.cat(nested[key].unbind(0)), flat[key]), key


def test_full_ring_is_saved_oldest_first_and_a_wrapping_trajectory_is_one_row():
    # steps 3..8 of _rows() in a 6-slot ring: slots 0-2 hold steps 6-8, the next write is slot 3
    ring = _rows()[torch.tensor([6, 7, 8, 3, 4, 5])]
    nested = _round_trips(ring, shift=3, is_full=True)
    assert _parts(nested["obs"]) == [[3, 4, 5, 6, 7], [7, 8, 9]]
    assert _parts(nested["action"]) == [[30, 40, 50, 60], [70, 80]]
    assert (nested["shift"], nested["is_full"], nested["storage_rows"]) == (3, True, 6)
    # a trajectory over the wrap point: steps 0-5 written from slot 2 on, so that steps 2-5
    # (one trajectory) sit in slots 4, 5, 0, 1
    ring = _rows(n=6, ends=(1, 5))[torch.tensor([4, 5, 0, 1, 2, 3])]
    nested = _round_trips(ring, shift=2, is_full=True)
    assert _parts(nested["action"]) == [[0, 10], [20, 30, 40, 50]]
    assert _parts(nested["obs"]) == [[0, 1, 2], [2, 3, 4, 5, 6]]
    # saved in storage order instead (no shift), the wrapping trajectory would be cut in two
    assert _hook(TED2Nested, 0, True)(ring).batch_size == (3,)


def test_a_trajectory_cut_by_the_cursor_is_closed():
    # not full: the newest row closes the last trajectory even without done
    nested = _round_trips(_rows(n=5, ends=(1,)), shift=5, is_full=False)
    assert _parts(nested["obs"]) == [[0, 1, 2], [2, 3, 4, 5]]
    assert _parts(nested["traj_ends"])[-1] == [False, False, True]


@pytest.mark.parametrize("shift", [0, 1, 4, 6])
@pytest.mark.parametrize("is_full", [False, True])
def test_round_trip_bitwise_for_any_ring(shift, is_full):
    gen = torch.Generator().manual_seed(shift * 2 + is_full)
    rows = _rows(n=7, ends=())
    rows["next", "done"] = torch.rand(7, 1, generator=gen) < 0.4
    nested = _round_trips(rows, shift=shift if is_full else 7, is_full=is_full)
    assert sum(n.numel() for n in nested["traj_ends"].unbind(0)) == 7
    assert int(sum(p.sum() for p in nested["traj_ends"].unbind(0))) == nested.batch_size[0]


def test_single_step_trajectories():
    rows = _rows(n=4, ends=(0, 1, 2, 3))
    nested = _round_trips(rows)
    assert nested.batch_size == (4,)
    assert _parts(nested["obs"]) == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert _parts(nested["action"]) == [[0], [10], [20], [30]]
    nested = _round_trips(rows[:1])  # one row: one trajectory of one step
    assert _parts(nested["obs"]) == [[0, 1]]


def test_nested_keys_and_next_entries_kept_whole():
    rows = _rows()
    rows["pixels", "left"] = torch.arange(9 * 4, dtype=torch.uint8).reshape(9, 2, 2)
    rows["next", "pixels", "left"] = torch.cat([rows["pixels", "left"][1:],
                                                 torch.full((1, 2, 2), 255, dtype=torch.uint8)])
    rows["next", "target"] = torch.randn(9, 3, dtype=torch.float64)  # no root twin
    rows["next", "obs"] = rows["next", "obs"] + 0.5  # not TED: a multi-step target, say
    rows["next", "obs"][4] = float("nan")
    nested = _round_trips(rows)
    left = nested["pixels", "left"].unbind(0)
    assert [t.shape[0] for t in left] == [4, 5, 3]  # stored with its "next" twin: L + 1
    assert torch.equal(left[2][-1], torch.full((2, 2), 255, dtype=torch.uint8))
    assert [t.shape for t in nested["next", "target"].unbind(0)] == [(3, 3), (4, 3), (2, 3)]
    assert _parts(nested["obs"]) == [[0, 1, 2], [3, 4, 5, 6], [7, 8]]  # kept whole, L values
    assert [t.shape[0] for t in nested["next", "obs"].unbind(0)] == [3, 4, 2]


def test_custom_metadata_keys():
    kwargs = {"shift_key": ("meta", "shift"), "is_full_key": "full"}
    ring = _rows()[torch.tensor([6, 7, 8, 3, 4, 5])]
    nested = _round_trips(ring, shift=3, is_full=True, **kwargs)
    assert nested["meta", "shift"] == 3 and nested["full"] is True
    with pytest.raises(KeyError, match="'shift'"):
        Nested2TED()(nested)  # saved under other names


def test_out_gets_the_rows():
    rows = _rows()
    out = rows.clone().zero_()
    assert Nested2TED()(TED2Nested()(rows), out=out) is out
    _assert_bitwise_same(out, rows)
    with pytest.raises(ValueError, match="batch size"):
        Nested2TED()(TED2Nested()(rows), out=rows[:3].clone())


# ---- H5Split / H5Combine ----------------------------------------------------------------------
def test_split_holds_one_sub_tensordict_per_trajectory():
    nested = TED2Nested()(_rows())
    split = H5Split()(nested)
    assert split.batch_size == ()
    assert sorted(split.keys()) == ["is_full", "shift", "storage_rows",
                                    "traj_0", "traj_1", "traj_2"]
    assert split["traj_1", "obs"].tolist() == [3, 4, 5, 6, 7]
    assert split["traj_2", "action"].tolist() == [70, 80]
    assert split["traj_0", "root", "done"].shape == (3, 1)
    assert (split["shift"], split["is_full"], split["storage_rows"]) == (9, False, 9)
    combined = H5Combine()(split)
    assert combined.batch_size == (3,)
    for key in nested.keys(True, True):
        assert _parts(combined[key]) == _parts(nested[key]), key
    assert (combined["shift"], combined["is_full"], combined["storage_rows"]) == (9, False, 9)


def test_split_names_are_zero_padded_as_torchrl():
    rows = _rows(n=11, ends=range(11))  # 11 single-step trajectories
    split = H5Split()(TED2Nested()(rows))
    names = sorted(k for k in split.keys() if k.startswith("traj_"))
    assert names == [f"traj_{i:02d}" for i in range(11)]
    _assert_bitwise_same(Nested2TED()(H5Combine()(split)), rows)


def test_combine_takes_metadata_saved_as_tensors():
    split = H5Split()(TED2Nested()(_rows()))
    for key in ("shift", "is_full", "storage_rows"):  # as a file format without JSON gives it
        split[key] = torch.tensor(split[key])
    _assert_bitwise_same(Nested2TED()(H5Combine()(split)), _rows())


# ---- through a buffer -------------------------------------------------------------------------
def _buffer(storage_cls=LazyTensorStorage, checkpointer=None, split=True):
    storage = storage_cls(6) if checkpointer is None else storage_cls(6,
                                                                      checkpointer=checkpointer())
    rb = TensorDictReplayBuffer(storage=storage)
    rb.register_save_hook(TED2Nested())
    if split:
        rb.register_save_hook(H5Split())
        rb.register_load_hook(H5Combine())
    rb.register_load_hook(Nested2TED())
    return rb


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
@pytest.mark.parametrize("count", [4, 9])  # not full; full and wrapped
@pytest.mark.parametrize("split", [True, False])  # nested tensors written as they are, too
def test_dumps_and_loads_with_the_hooks(tmp_path, storage_cls, count, split):
    rb = _buffer(storage_cls, split=split)
    rb.extend(_rows()[:count])
    rb.dumps(tmp_path)
    saved = TensorDict.load_memmap(next(tmp_path.glob("snap*")) / "storage" / "data")
    first = saved["traj_0", "obs"] if split else saved["obs"][0]
    assert first.tolist() == ([0, 1, 2, 3] if count == 4 else [3, 4, 5, 6, 7])
    restored = _buffer(storage_cls, split=split)
    restored.loads(tmp_path)
    assert len(restored) == len(rb) and restored.writer.cursor == rb.writer.cursor
    _assert_bitwise_same(restored.storage[:], rb.storage[:])
    restored.extend(_rows()[:2])  # writes continue at the same slots
    rb.extend(_rows()[:2])
    _assert_bitwise_same(restored.storage[:], rb.storage[:])


@pytest.mark.parametrize("checkpointer", [FlatStorageCheckpointer, NestedStorageCheckpointer,
                                          H5StorageCheckpointer])
@pytest.mark.parametrize("split", [False, True])
def test_ted_checkpointers_refuse_the_hooks(tmp_path, checkpointer, split):
    if checkpointer is H5StorageCheckpointer:
        pytest.importorskip("h5py")
    with pytest.raises(ValueError, match=f"{checkpointer.__name__} compacts TED data itself.*"
                                         "TED2Nested.*nothing was registered"):
        _buffer(checkpointer=checkpointer, split=split)  # (at the first hook it registers)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6, checkpointer=checkpointer()))
    for register, hook in [(rb.register_save_hook, H5Split()),
                           (rb.register_load_hook, H5Combine()),
                           (rb.register_load_hook, Nested2TED())]:
        with pytest.raises(ValueError, match=f"the hook {type(hook).__name__} would hand"):
            register(hook)
    rb.extend(_rows())
    rb.dumps(tmp_path)  # the rows, compacted by the checkpointer itself
    restored = TensorDictReplayBuffer(storage=LazyTensorStorage(6, checkpointer=checkpointer()))
    restored.loads(tmp_path)
    assert (restored[:] == rb[:]).all()


# ---- bad input --------------------------------------------------------------------------------
def test_ted2nested_bad_input():
    with pytest.raises(ValueError, match="ndim=1"):
        TED2Nested()(_rows().reshape(3, 3))
    with pytest.raises(KeyError, match="done_key"):
        TED2Nested(done_key="nope")(_rows())
    with pytest.raises(ValueError, match="no rows"):
        TED2Nested()(_rows()[:0])


@pytest.mark.parametrize("missing", ["shift", "is_full", "storage_rows", "traj_ends"])
def test_nested2ted_names_the_missing_metadata(missing):
    nested = TED2Nested()(_rows())
    with pytest.raises(KeyError, match=f"'{missing}' is missing.*TED2Nested"):
        Nested2TED()(nested.exclude(missing))
    with pytest.raises(KeyError, match=f"'{missing}' is missing.*TED2Nested"):
        H5Split()(nested.exclude(missing))


def test_nested2ted_refuses_what_is_not_ted2nested_output():
    with pytest.raises(ValueError, match="Nested2TED takes"):
        Nested2TED()(TED2Flat()(_rows()))  # the flat format: batch []
    nested = TED2Nested()(_rows())
    plain = nested.clone()
    plain["action"] = torch.zeros(3)  # a tensor entry that is not nested
    with pytest.raises(ValueError, match="'action' is a Tensor, not a nested tensor"):
        Nested2TED()(plain)
    with pytest.raises(ValueError, match="'action' is a Tensor, not a nested tensor"):
        H5Split()(plain)
    short = nested.clone()
    short["action"] = torch.nested.nested_tensor([torch.arange(3), torch.arange(4),
                                                  torch.arange(1)])
    with pytest.raises(ValueError, match=r"'action' has trajectories of \[3, 4, 1\]"):
        Nested2TED()(short)
    ends = nested.clone()
    ends["traj_ends"] = torch.nested.nested_tensor([torch.tensor([False, True, False]),
                                                   torch.tensor([False] * 3 + [True]),
                                                   torch.tensor([False, True])])
    with pytest.raises(ValueError, match="'traj_ends' of trajectory 0"):
        Nested2TED()(ends)
    rows = nested.clone()
    rows.set_non_tensor("storage_rows", 8)
    with pytest.raises(ValueError, match="9 steps but 'storage_rows' says 8"):
        Nested2TED()(rows)


def test_h5combine_bad_input():
    split = H5Split()(TED2Nested()(_rows()))
    with pytest.raises(KeyError, match="no trajectory entries"):
        H5Combine()(split.exclude("traj_0", "traj_1", "traj_2"))
    with pytest.raises(ValueError, match=r"numbered \[0, 2\]"):
        H5Combine()(split.exclude("traj_1"))
    odd = split.clone()
    del odd["traj_1", "action"]
    with pytest.raises(ValueError, match="trajectory 1 holds the entries"):
        H5Combine()(odd)
    odd = split.clone()
    odd["traj_2", "action"] = odd["traj_2", "action"].float()
    with pytest.raises(ValueError, match="'action' of trajectory 2 is torch.float32"):
        H5Combine()(odd)
    with pytest.raises(ValueError, match="H5Combine takes"):
        H5Combine()([1, 2])
