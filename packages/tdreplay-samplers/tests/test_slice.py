"""SliceSampler / SliceSamplerWithoutReplacement: arguments, errors, info, layouts, checkpoints."""

from __future__ import annotations

import re
import tempfile

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    Writer,
)
from tdreplay.samplers import SliceSampler, SliceSamplerWithoutReplacement
from tdreplay.storages import LazyStackStorage, LazyTensorStorage, TensorStorage


def episodes(lengths: list[int], start_id: int = 0, key: str = "episode") -> TensorDict:
    """Steps of consecutive episodes: ``key`` id, ``step`` index within the episode, done flag."""
    ids = torch.cat([torch.full((n,), start_id + i) for i, n in enumerate(lengths)])
    step = torch.cat([torch.arange(n) for n in lengths])
    done = torch.cat([torch.arange(n) == n - 1 for n in lengths]).unsqueeze(-1)
    return TensorDict({key: ids, "step": step, "next": {"done": done}}, [len(ids)])


def make_rb(sampler: SliceSampler, size: int = 100, **kwargs) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(size, **kwargs), sampler=sampler)
    rb.set_rng(torch.Generator().manual_seed(0))
    return rb


def assert_slices_valid(batch: TensorDict, num_slices: int, key: str = "episode") -> None:
    sl = batch.reshape(num_slices, -1)
    assert (sl[key] == sl[key][:, :1]).all()
    assert (sl["step"].diff(dim=1) == 1).all()
    assert sl["next", "truncated"][:, -1].all() and not sl["next", "truncated"][:, :-1].any()


# ---- arguments --------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"num_slices": 2, "slice_len": 3}])
def test_exactly_one_of_num_slices_and_slice_len(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="exactly one of num_slices and slice_len"):
        SliceSampler(**kwargs)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_slices": 0}, ValueError, "num_slices must be >= 1, got 0"),
    ({"slice_len": -1}, ValueError, "slice_len must be >= 1, got -1"),
    ({"slice_len": 2.0}, TypeError, "slice_len must be an int or None, got float"),
    ({"num_slices": True}, TypeError, "num_slices must be an int or None, got bool"),
])
def test_sizes_must_be_positive_ints(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SliceSampler(**kwargs)


def test_argument_conflicts() -> None:
    with pytest.raises(ValueError, match="aliases"):
        SliceSampler(num_slices=2, traj_key="a", trajectory_key="b")
    with pytest.raises(ValueError, match="cannot be combined"):
        SliceSampler(num_slices=2, ends=torch.zeros(3, dtype=torch.bool), end_key="done")
    with pytest.raises(ValueError, match="exclusive"):
        SliceSampler(num_slices=2, ends=torch.zeros(3, dtype=torch.bool),
                     trajectories=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="whole-number trajectory ids"):  # (0.0 and 1.0 are)
        SliceSampler(num_slices=2, trajectories=torch.tensor([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="span"):
        SliceSampler(num_slices=2, span=(True, -1))


@pytest.mark.parametrize("ends", [torch.tensor([0.0, float("nan"), 1.0]),
                                  torch.tensor([0.0, 0.5, 1.0]), torch.tensor([-1, 0, 2])])
def test_ends_that_are_not_flags_are_refused(ends) -> None:
    """NaN, 0.5, -1 or 2 were taken as end flags (anything not 0 ended a trajectory)."""
    with pytest.raises(ValueError, match=r"ends must hold end flags"):
        SliceSampler(num_slices=2, ends=ends)


def test_ends_of_zeros_and_ones() -> None:
    sampler = SliceSampler(slice_len=2, ends=torch.tensor([0, 1, 0, 1]))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=sampler)
    rb.extend(TensorDict({"step": torch.arange(4)}, [4]))
    assert {tuple(rb.sample(2)["step"].tolist()) for _ in range(20)} == {(0, 1), (2, 3)}


def test_an_end_key_with_an_empty_name_cuts_as_torchrl_does() -> None:
    """tensordict takes an entry named ``""`` and TorchRL's sampler an ``end_key=""``."""
    done = torch.tensor([0, 0, 1, 1, 1, 0, 0, 1], dtype=torch.bool)[:, None]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=SliceSampler(
        slice_len=2, end_key=""))
    rb.extend(TensorDict({"": done, "obs": torch.arange(8)}, [8]))
    pairs = {tuple(rb.sample(2)["obs"].tolist()) for _ in range(60)}
    assert pairs == {(0, 1), (1, 2), (5, 6), (6, 7)}


def test_trajectory_key_alias() -> None:
    a = make_rb(SliceSampler(num_slices=2, traj_key=("meta", "ep")))
    b = make_rb(SliceSampler(num_slices=2, trajectory_key=("meta", "ep")))
    for rb in (a, b):
        data = episodes([7, 9, 5])
        data["meta", "ep"] = data.pop("episode")
        rb.extend(data)
    assert (a.sample(8)["index"] == b.sample(8)["index"]).all()


# ---- bad input at sampling time -------------------------------------------------------------------
def test_batch_size_must_divide() -> None:
    rb = make_rb(SliceSampler(num_slices=3, traj_key="episode"))
    rb.extend(episodes([20, 20]))
    with pytest.raises(ValueError, match="not divisible by num_slices=3"):
        rb.sample(10)
    rb = make_rb(SliceSampler(slice_len=4, traj_key="episode"))
    rb.extend(episodes([20, 20]))
    with pytest.raises(ValueError, match="not divisible by slice_len=4"):
        rb.sample(10)


def test_empty_buffer() -> None:
    rb = make_rb(SliceSampler(num_slices=2))
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample(4)


def test_missing_keys_are_named() -> None:
    # a trajectory key the data lacks falls back to the end key (TorchRL); with neither stored,
    # the error names what was looked for
    rb = make_rb(SliceSampler(num_slices=2, traj_key=("collector", "traj_ids")))
    rb.extend(TensorDict({"obs": torch.zeros(10)}, [10]))
    with pytest.raises(KeyError, match=re.escape("trajectory key (('collector', 'traj_ids'))")):
        rb.sample(4)
    assert len(rb) == 10
    rb = make_rb(SliceSampler(num_slices=2, end_key="terminal"))
    rb.extend(TensorDict({"obs": torch.zeros(10)}, [10]))
    with pytest.raises(KeyError, match=re.escape("end key ('terminal')")):
        rb.sample(4)
    with pytest.raises(RuntimeError):  # (and TorchRL's RuntimeError: it was a KeyError only)
        rb.sample(4)
    rb = make_rb(SliceSampler(num_slices=2))
    rb.extend(TensorDict({"obs": torch.zeros(10)}, [10]))
    with pytest.raises(KeyError, match=re.escape(
            "neither a trajectory key (('collector', 'traj_ids') or 'episode') nor an end key")):
        rb.sample(4)
    with pytest.raises(RuntimeError):
        rb.sample(4)


def test_plain_tensor_storage_is_rejected() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(num_slices=2))
    rb.extend(torch.zeros(10))
    with pytest.raises(KeyError, match="not TensorDicts"):
        rb.sample(4)


def test_fractional_trajectory_ids_are_rejected(ids_stored_unchecked: None) -> None:
    # whole-number float ids are ids (test_float_trajectory_ids.py); others are refused
    rb = make_rb(SliceSampler(num_slices=2, traj_key="episode"))
    data = episodes([5, 5])
    data["episode"] = data["episode"].float() + 0.25
    rb.extend(data)
    with pytest.raises(ValueError, match="'episode' must hold whole-number trajectory ids"):
        rb.sample(4)


def test_slice_longer_than_buffer() -> None:
    rb = make_rb(SliceSampler(slice_len=30, traj_key="episode"), size=20)
    rb.extend(episodes([10]))
    with pytest.raises(ValueError, match="longer than the whole buffer"):
        rb.sample(30)
    # strict_length=False: slices are cut to their trajectory, however long they are asked
    rb = make_rb(SliceSampler(slice_len=30, traj_key="episode", strict_length=False), size=20)
    rb.extend(episodes([6, 8]))
    batch = rb.sample(60)
    assert batch.shape[0] < 60
    assert set(batch["episode"].unique().tolist()) <= {0, 1}
    assert ((batch["step"].diff() == 1) | (batch["step"].diff() < 1)).all()
    rb = make_rb(SliceSampler(slice_len=15, traj_key="episode"), size=20)
    rb.extend(episodes([10]))
    with pytest.raises(ValueError, match="longer than the 10 steps in the buffer"):
        rb.sample(15)


def test_no_trajectory_long_enough() -> None:
    rb = make_rb(SliceSampler(slice_len=8, traj_key="episode"))
    rb.extend(episodes([3, 5, 7, 2]))
    with pytest.raises(RuntimeError, match=r"length range: 2 - 7 / required=8"):
        rb.sample(16)


# ---- sampling semantics ------------------------------------------------------------------------
def test_slices_stay_in_trajectories_and_include_last_step() -> None:
    rb = make_rb(SliceSampler(num_slices=4, traj_key="episode"))
    rb.extend(episodes([6, 9, 4, 12]))
    last_steps = 0
    for _ in range(50):
        batch = rb.sample(16)
        assert_slices_valid(batch, 4)
        last_steps += int(batch["next", "done"].sum())
    assert last_steps > 0


def test_short_trajectories_skipped_in_strict_mode() -> None:
    rb = make_rb(SliceSampler(slice_len=5, traj_key="episode"))
    rb.extend(episodes([3, 10, 2, 8]))
    seen = set()
    for _ in range(40):
        seen |= set(rb.sample(20)["episode"].tolist())
    assert seen == {1, 3}


def test_non_strict_returns_shorter_slices() -> None:
    rb = make_rb(SliceSampler(num_slices=3, traj_key="episode", strict_length=False))
    rb.extend(episodes([2, 2, 2]))
    batch = rb.sample(12)  # slices of 4 asked, every trajectory has 2 steps
    assert batch.shape == torch.Size([6])
    assert batch["step"].tolist() == [0, 1] * 3
    assert batch["next", "truncated"].view(-1).tolist() == [False, True] * 3


def test_trajectories_are_drawn_uniformly() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode"))
    rb.extend(episodes([4, 40]))
    ids = torch.cat([rb.sample(200)["episode"][::2] for _ in range(10)])
    share = (ids == 0).float().mean().item()
    assert 0.45 < share < 0.55  # by trajectory, not by step (4 / 44 otherwise)


def test_starts_cover_every_valid_offset() -> None:
    rb = make_rb(SliceSampler(slice_len=3, traj_key="episode"))
    rb.extend(episodes([10]))
    starts = torch.cat([rb.sample(300)["step"][::3] for _ in range(5)])
    assert set(starts.tolist()) == set(range(8))
    counts = torch.bincount(starts, minlength=8).float()
    assert counts.min() > 0.7 * counts.mean()


def test_span_lets_slices_overhang() -> None:
    rb = make_rb(SliceSampler(slice_len=4, traj_key="episode", span=True))
    rb.extend(episodes([6, 6]))
    sizes_seen = set()
    first_steps_only = False
    for _ in range(30):
        batch = rb.sample(40)
        ends = batch["next", "truncated"].view(-1).nonzero().squeeze(-1)
        sizes = torch.diff(ends, prepend=torch.tensor([-1]))
        sizes_seen |= set(sizes.tolist())
        for b, size in zip(ends.tolist(), sizes.tolist()):
            part = batch[b - size + 1: b + 1]
            assert (part["episode"] == part["episode"][0]).all()
            assert (part["step"].diff() == 1).all()
            first_steps_only |= size < 4 and int(part["step"][0]) == 0
    assert sizes_seen == {1, 2, 3, 4}
    assert first_steps_only  # a slice hanging over the left end keeps only the first steps


def test_span_larger_than_slice_is_rejected() -> None:
    rb = make_rb(SliceSampler(slice_len=2, span=(5, False), traj_key="episode"))
    rb.extend(episodes([5]))
    with pytest.raises(ValueError, match="span on the left"):
        rb.sample(4)


def test_span_int_limits_overhang() -> None:
    rb = make_rb(SliceSampler(slice_len=4, traj_key="episode", span=(False, 1)))
    rb.extend(episodes([8]))
    sizes = set()
    for _ in range(50):
        batch = rb.sample(4)
        sizes.add(batch.shape[0])
        assert int(batch["step"][0]) <= 5
    assert sizes == {3, 4}


def test_info_entries() -> None:
    rb = make_rb(SliceSampler(num_slices=2, traj_key="episode"))
    data = episodes([4, 4])
    data["next", "terminated"] = data["next", "done"].clone()
    rb.extend(data)
    batch, info = rb.sample(8, return_info=True)
    assert batch["next", "truncated"].shape == torch.Size([8, 1])
    assert batch["next", "truncated"].view(2, 4).tolist() == [[False] * 3 + [True]] * 2
    stored = rb.storage.get(batch["index"])
    assert (batch["next", "done"] == (stored["next", "done"] | batch["next", "truncated"])).all()
    assert (batch["next", "terminated"] == stored["next", "terminated"]).all()
    assert set(info) >= {("next", "truncated"), ("next", "done"), ("next", "terminated"), "index"}


def test_info_follows_stored_done_shape_and_custom_key() -> None:
    rb = make_rb(SliceSampler(num_slices=2, traj_key="episode", truncated_key=("x", "cut")))
    data = episodes([3, 3])
    data["x", "done"] = data["next", "done"].view(-1)
    rb.extend(data)
    batch = rb.sample(6)
    assert batch["x", "cut"].shape == torch.Size([6])
    assert batch["x", "done"].shape == torch.Size([6])
    assert batch["x", "terminated"].dtype is torch.bool
    rb = make_rb(SliceSampler(num_slices=2, traj_key="episode", truncated_key=None))
    rb.extend(episodes([3, 3]))
    _, info = rb.sample(6, return_info=True)
    assert set(info) == {"index"}


def test_default_keys() -> None:
    # "episode" when present ...
    rb = make_rb(SliceSampler(slice_len=2))
    data = episodes([3, 3])
    data["next", "done"].zero_()
    rb.extend(data)
    for _ in range(20):
        assert_slices_valid(rb.sample(4), 2)
    # ... else ("next", "done")
    rb = make_rb(SliceSampler(slice_len=2))
    rb.extend(episodes([3, 3], key="other"))
    for _ in range(20):
        sl = rb.sample(4).reshape(2, 2)
        assert (sl["other"][:, 0] == sl["other"][:, 1]).all()


def test_end_key_and_trajectory_key_together() -> None:
    rb = make_rb(SliceSampler(slice_len=3, traj_key="episode", end_key=("next", "done")))
    data = episodes([8])
    data["next", "done"][3] = True  # same id, but done at step 3
    rb.extend(data)
    for _ in range(20):
        steps = rb.sample(3)["step"].tolist()
        assert steps in ([0, 1, 2], [1, 2, 3], [4, 5, 6], [5, 6, 7])


# ---- wrap-around and write patterns --------------------------------------------------------------
def test_trajectory_across_the_storage_end() -> None:
    rb = make_rb(SliceSampler(slice_len=6, traj_key="episode"), size=10)
    rb.extend(episodes([7]))
    rb.extend(episodes([8], start_id=1))  # slots 7, 8, 9, 0, ... 4: wraps around
    seen_wrap = False
    for _ in range(30):
        batch = rb.sample(6)
        assert (batch["episode"] == 1).all() and (batch["step"].diff() == 1).all()
        seen_wrap |= batch["index"].tolist() in ([8, 9, 0, 1, 2, 3], [9, 0, 1, 2, 3, 4])
    assert seen_wrap


def test_write_cursor_is_a_boundary() -> None:
    # one endless trajectory (no done, one id): after wrapping, newest and oldest steps are
    # not consecutive, so no slice may go from the newest step to the oldest one
    rb = make_rb(SliceSampler(slice_len=3, traj_key="ep"), size=10)
    for i in range(4):
        rb.extend(TensorDict({"ep": torch.zeros(4, dtype=torch.long),
                              "step": torch.arange(4 * i, 4 * i + 4)}, [4]))
    for _ in range(50):
        assert (rb.sample(3)["step"].diff() == 1).all()


def test_extend_larger_than_capacity() -> None:
    rb = make_rb(SliceSampler(slice_len=3, traj_key="episode"), size=10)
    rb.extend(episodes([5, 20]))  # only the last 10 steps of episode 1 survive
    for _ in range(20):
        batch = rb.sample(6)
        assert (batch["episode"] == 1).all()
        assert (batch["step"].view(2, 3).diff(dim=1) == 1).all() and batch["step"].min() >= 10


def test_add_one_step_at_a_time() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode"), size=6)
    data = episodes([4, 5])
    for i in range(9):
        rb.add(data[i])
        if i >= 1:
            assert_slices_valid(rb.sample(2), 1)


def test_index_assignment_rebuilds() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode"))
    rb.extend(episodes([6]))
    item = rb[2]
    item["episode"] = torch.tensor(9)
    rb[2] = item  # steps 0-1 | 2 | 3-5 are now three trajectories
    for _ in range(30):
        assert rb.sample(2)["step"].tolist() in ([0, 1], [3, 4], [4, 5])


class ReversedWriter(Writer):
    """Fills the storage from its last row backwards (not a round-robin order)."""

    def __init__(self) -> None:
        super().__init__()
        self._next = None

    def add(self, data):  # pragma: no cover - unused
        raise NotImplementedError

    def extend(self, data):
        n = data.shape[0]
        cap = self.storage.rows_capacity_for(data, batched=True)
        if self._next is None:
            self._next = cap - 1
        rows = (self._next - torch.arange(n)) % cap
        self.storage.set(rows, data)
        self._next = int(rows[-1] - 1) % cap
        self.write_count += n
        return rows


def test_non_round_robin_writer_uses_slot_order() -> None:
    sampler = SliceSampler(slice_len=2, traj_key="ep")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6), sampler=sampler,
                                writer=ReversedWriter())
    rb.extend(TensorDict({"ep": torch.tensor([0, 0, 0, 1, 1, 1])}, [6]))
    # slots 5..0 hold ep 0,0,0,1,1,1: in slot order slots 0-2 are ep 1 and 3-5 ep 0
    for _ in range(20):
        index = rb.sample(2)["index"].tolist()
        assert index[1] == index[0] + 1 and index[0] != 2


def test_list_storage() -> None:
    rb = ReplayBuffer(storage=ListStorage(20), sampler=SliceSampler(slice_len=3, traj_key="episode"),
                      collate_fn=lambda items: torch.stack([x["step"] for x in items]))
    rb.extend(list(episodes([5, 4]).unbind(0)))
    steps, info = rb.sample(6, return_info=True)
    assert (steps.view(2, 3).diff(dim=1) == 1).all()
    assert info[("next", "truncated")].view(2, 3)[:, -1].all()


@pytest.mark.parametrize("traj_key", ["episode", None])
@pytest.mark.parametrize("stack_dim", [0, -1])
def test_lazy_stack_storage_of_steps(traj_key: str | None, stack_dim: int) -> None:
    # the storage reads several steps as one lazy stack (TorchRL's LazyStackStorage.get)
    sampler = SliceSampler(slice_len=3, traj_key=traj_key,
                           end_key=None if traj_key else ("next", "done"))
    rb = TensorDictReplayBuffer(storage=LazyStackStorage(20, stack_dim=stack_dim),
                                sampler=sampler)
    rb.set_rng(torch.Generator().manual_seed(0))
    rb.extend(episodes([5, 4, 6]))
    for _ in range(10):
        sample = rb.sample(9)
        steps, ids = sample["step"].view(3, 3), sample["episode"].view(3, 3)
        assert (steps.diff(dim=1) == 1).all() and (ids == ids[:, :1]).all()
        assert (sample["index"].view(3, 3).diff(dim=1) == 1).all()


def test_prefilled_storage_and_static_signals() -> None:
    data = episodes([4, 6])
    storage = TensorStorage(data.clone())
    rb = TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(slice_len=4))
    for _ in range(10):
        assert_slices_valid(rb.sample(8), 2)
    # ends: the last flag is False, so the last trajectory continues at slot 0
    ends = torch.tensor([False, True, False, False, False, False])
    ring = TensorDict({"step": torch.tensor([4, 5, 0, 1, 2, 3])}, [6])
    rb = TensorDictReplayBuffer(storage=TensorStorage(ring), sampler=SliceSampler(
        slice_len=6, ends=ends, cache_values=True))
    assert rb.sample(6)["step"].tolist() == [0, 1, 2, 3, 4, 5]
    trajectories = torch.tensor([7, 7, 8, 8, 8, 7])
    rb = TensorDictReplayBuffer(storage=TensorStorage(ring.clone()), sampler=SliceSampler(
        slice_len=3, trajectories=trajectories))
    seen = {tuple(rb.sample(3)["index"].tolist()) for _ in range(40)}
    assert seen == {(2, 3, 4), (5, 0, 1)}
    rb = TensorDictReplayBuffer(storage=TensorStorage(ring.clone()), sampler=SliceSampler(
        slice_len=3, trajectories=trajectories[:4]))
    with pytest.raises(ValueError, match="describes 4 steps but the storage holds 6"):
        rb.sample(3)


@pytest.mark.parametrize("how", ["extend", "storage.set", "extend, then bump_revision"])
@pytest.mark.parametrize("static", ["ends", "trajectories"])
def test_static_signals_alone_cut_the_ring_however_it_was_written(how, static) -> None:
    """A full ring with static flags saying the last trajectory continues at slot 0: a buffer
    that wrote the rows itself cut them after its newest write too (``(5, 0)`` never drawn),
    one written around it or rebuilt did not, so the slices depended on how the rows came."""
    signals = {"ends": torch.tensor([False, True, False, False, False, False]),
               "trajectories": torch.tensor([7, 7, 8, 8, 8, 7])}
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6), sampler=SliceSampler(
        slice_len=3, **{static: signals[static]}))
    data = TensorDict({"step": torch.arange(6)}, [6])
    if how == "storage.set":
        rb.storage.set(torch.arange(6), data)
    else:
        rb.extend(data)
    if how.endswith("bump_revision"):
        rb.sample(3)
        rb.storage.bump_revision()
    seen = {tuple(rb.sample(3)["step"].tolist()) for _ in range(60)}
    expected = {"ends": {(2, 3, 4), (3, 4, 5), (4, 5, 0), (5, 0, 1)},  # one of 2, 3, 4, 5, 0, 1
                "trajectories": {(2, 3, 4), (5, 0, 1)}}  # 8: 2, 3, 4; 7: 5, 0, 1
    assert seen == expected[static]


# ---- multi-dimensional storages ------------------------------------------------------------
def env_batch(B: int, T: int, t0: int, ids: torch.Tensor) -> TensorDict:
    return TensorDict({"ep": ids, "t": (torch.arange(T) + t0).expand(B, T),
                       "env": torch.arange(B)[:, None].expand(B, T)}, [B, T])


def test_ndim2_trajectories_span_writes() -> None:
    rb = make_rb(SliceSampler(slice_len=6, traj_key="ep"), size=60, ndim=2)
    for w in range(3):  # 3 envs, 5 steps per write, one trajectory per env
        rb.extend(env_batch(3, 5, 5 * w, torch.arange(3)[:, None].expand(3, 5)))
    crossing = False
    for _ in range(40):
        sl = rb.sample(12).reshape(2, 6)
        assert (sl["env"] == sl["env"][:, :1]).all() and (sl["t"].diff(dim=1) == 1).all()
        assert (sl["ep"] == sl["env"]).all()
        crossing |= bool(((sl["t"] % 5) == 4)[:, :-1].any())
    assert crossing


def test_ndim2_layout_is_time_major_across_extends() -> None:
    # TorchRL's layout: [B, T] batches are written along T (dim_extend = ndim - 1), one storage
    # row per step, so env b's step t of write w lands at slot (5 * w + t) * 3 + b
    rb = make_rb(SliceSampler(slice_len=4, traj_key="ep"), size=30, ndim=2)
    assert rb.dim_extend == 1
    for w in range(2):
        td = env_batch(3, 5, 5 * w, torch.arange(3)[:, None].expand(3, 5))
        expected = (5 * w + torch.arange(5)) * 3 + torch.arange(3)[:, None]
        assert rb.extend(td).tolist() == expected.tolist()
    assert rb.storage.shape == torch.Size([10, 3])
    assert rb.storage[:]["env"].tolist() == [[0, 1, 2]] * 10
    assert rb[1]["t"].tolist() == list(range(10))  # env 1, time-contiguous across extends
    assert rb[:]["t"].shape == torch.Size([3, 10])
    sl = rb.sample(40).reshape(10, 4)
    assert (sl["env"] == sl["env"][:, :1]).all() and (sl["t"].diff(dim=1) == 1).all()
    assert (sl["index"] == sl["t"] * 3 + sl["env"]).all()
    # another number of envs does not fit the rows: refused, buffer unchanged
    with pytest.raises(ValueError):
        rb.extend(env_batch(2, 5, 0, torch.zeros(2, 5, dtype=torch.long)))
    assert len(rb) == 30


def test_ndim2_ring_wrap_keeps_lanes_apart() -> None:
    rb = make_rb(SliceSampler(slice_len=3, traj_key="ep"), size=12, ndim=2)
    for w in range(3):  # 2 envs, 3 steps per write, 6 rows: the first write is overwritten
        rb.extend(env_batch(2, 3, 3 * w, torch.arange(2)[:, None].expand(2, 3)))
    assert rb[0]["t"].tolist() == [6, 7, 8, 3, 4, 5]  # physical order, wrapped
    seen = set()
    for _ in range(30):
        sl = rb.sample(6).reshape(2, 3)
        assert (sl["env"] == sl["env"][:, :1]).all() and (sl["t"].diff(dim=1) == 1).all()
        seen |= {tuple(r) for r in sl["t"].tolist()}
    assert seen <= {(3, 4, 5), (4, 5, 6), (5, 6, 7), (6, 7, 8)} and (4, 5, 6) in seen


def test_ndim2_dim_extend_0_writes_time_major_batches() -> None:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2), dim_extend=0,
                                sampler=SliceSampler(slice_len=3, traj_key="ep"))
    td = env_batch(2, 4, 0, torch.arange(2)[:, None].expand(2, 4)).transpose(1, 0)  # [T, B]
    rb.extend(td)
    assert rb.storage.shape == torch.Size([6, 2]) and rb[1]["t"].tolist() == [1, 1]
    sl = rb.sample(6).reshape(2, 3)
    assert (sl["env"] == sl["env"][:, :1]).all() and (sl["t"].diff(dim=1) == 1).all()


def test_ndim3() -> None:
    rb = make_rb(SliceSampler(slice_len=4, traj_key="ep"), size=2 * 2 * 3 * 4, ndim=3)
    for w in range(5):
        ep = torch.arange(4).view(2, 2, 1).expand(2, 2, 3)
        t = (torch.arange(3) + 3 * w).expand(2, 2, 3)
        rb.extend(TensorDict({"ep": ep, "t": t}, [2, 2, 3]))
    for _ in range(30):
        sl = rb.sample(8).reshape(2, 4)
        assert (sl["ep"] == sl["ep"][:, :1]).all() and (sl["t"].diff(dim=1) == 1).all()
        # 48 slots = 16 chunks of 3 steps, 4 chunks per write: the first write is overwritten
        assert sl["t"].min() >= 3


# ---- lifecycle, reproducibility, checkpoints ---------------------------------------------------
def test_generator_reproducibility() -> None:
    out = []
    for _ in range(2):
        rb = make_rb(SliceSampler(num_slices=4, traj_key="episode", strict_length=False))
        rb.extend(episodes([3, 9, 14, 6]))
        rb.set_rng(torch.Generator().manual_seed(5))
        out.append(torch.cat([rb.sample(16)["index"] for _ in range(5)]))
    assert (out[0] == out[1]).all()


def test_empty_then_refill() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode"), size=10)
    rb.extend(episodes([6, 6]))
    rb.sample(4)
    rb.empty()
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample(4)
    rb.extend(episodes([3], start_id=5))
    assert set(rb.sample(4)["episode"].tolist()) == {5}


def _filled(sampler: SliceSampler) -> TensorDictReplayBuffer:
    rb = make_rb(sampler, size=40)
    for i in range(6):
        rb.extend(episodes([3, 7, 5], start_id=3 * i))
        rb.sample(8)
    return rb


@pytest.mark.parametrize("factory", [
    lambda: SliceSampler(slice_len=4, traj_key="episode"),
    lambda: SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode"),
])
def test_state_dict_roundtrip_samples_identically(factory) -> None:
    rb = _filled(factory())
    rb.sample(8)
    restored = make_rb(factory(), size=40)
    restored.load_state_dict(rb.state_dict())
    rb.set_rng(torch.Generator().manual_seed(3))
    restored.set_rng(torch.Generator().manual_seed(3))
    for _ in range(5):
        assert (rb.sample(8)["index"] == restored.sample(8)["index"]).all()
    # and both keep tracking new writes the same way
    rb.extend(episodes([9], start_id=100))
    restored.extend(episodes([9], start_id=100))
    assert (rb.sample(8)["index"] == restored.sample(8)["index"]).all()


def test_dumps_loads() -> None:
    rb = _filled(SliceSampler(slice_len=4, traj_key="episode"))
    with tempfile.TemporaryDirectory() as d:
        rb.dumps(d)
        restored = make_rb(SliceSampler(slice_len=4, traj_key="episode"), size=40)
        restored.loads(d)
    rb.set_rng(torch.Generator().manual_seed(1))
    restored.set_rng(torch.Generator().manual_seed(1))
    assert (rb.sample(8)["index"] == restored.sample(8)["index"]).all()


def test_bad_state_dict_changes_nothing() -> None:
    rb = _filled(SliceSampler(slice_len=4, traj_key="episode"))
    state = rb.sampler.state_dict()
    bad = {"index": dict(state["index"], dense=state["index"]["dense"][:-1])}
    before = rb.sampler.state_dict()
    with pytest.raises(ValueError, match="do not match its counters"):
        rb.sampler.load_state_dict(bad)
    after = rb.sampler.state_dict()
    assert before["index"]["signals"] == after["index"]["signals"]
    assert all((before["index"][k] == after["index"][k]).all() for k in before["index"]
               if k != "signals")
    with pytest.raises(ValueError, match="keys differ"):
        rb.sampler.load_state_dict({"nope": 1})


def test_set_storage_rebuilds() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode"))
    rb.extend(episodes([5, 5]))
    rb.sample(4)
    rb.set_storage(TensorStorage(episodes([3, 3], start_id=7)))
    assert set(rb.sample(4)["episode"].tolist()) <= {7, 8}


# ---- without replacement ----------------------------------------------------------------------
def test_without_replacement_epochs() -> None:
    sampler = SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=6)
    rb.extend(episodes([4, 5, 6, 7, 2]))  # the 2-step episode is too short for slices of 3
    epoch = [b["episode"].view(-1, 3)[:, 0].tolist() for b in rb]
    assert [len(e) for e in epoch] == [2, 2]
    assert sorted(sum(epoch, [])) == [0, 1, 2, 3]
    assert sampler.ran_out
    assert len(rb.sample()) == 6 and not sampler.ran_out  # a new epoch starts


def test_without_replacement_drop_last_and_order() -> None:
    sampler = SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode", drop_last=True,
                                             shuffle=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=4)
    rb.extend(episodes([3, 3, 3, 3, 3], start_id=10))
    batches = [b["episode"].view(-1, 2)[:, 0].tolist() for b in rb]
    assert batches == [[10, 11], [12, 13]]  # storage order; the fifth trajectory is dropped


def test_without_replacement_extend_restarts_epoch() -> None:
    sampler = SliceSamplerWithoutReplacement(slice_len=2, traj_key="episode", shuffle=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=2)
    rb.extend(episodes([3, 3, 3]))
    assert rb.sample()["episode"].tolist() == [0, 0]
    rb.extend(episodes([3], start_id=3))
    assert [b["episode"][0].item() for b in rb] == [0, 1, 2, 3]


def test_without_replacement_rejects_span() -> None:
    with pytest.raises(TypeError):
        SliceSamplerWithoutReplacement(slice_len=2, span=True)


def test_repr() -> None:
    assert "num_slices=2" in repr(SliceSampler(num_slices=2))
    assert "drop_last=True" in repr(SliceSamplerWithoutReplacement(slice_len=2, drop_last=True))


def test_in_place_edits_of_signals_are_seen() -> None:
    rb = make_rb(SliceSampler(slice_len=2, traj_key="episode"))
    rb.extend(episodes([6]))
    rb.sample(2)
    rb.set_at_("episode", 7, torch.tensor([2]))  # steps 0-1 | 2 | 3-5
    for _ in range(30):
        assert rb.sample(2)["step"].tolist() in ([0, 1], [3, 4], [4, 5])
    rb.update_(TensorDict({"episode": torch.zeros(6, dtype=torch.long)}, [6]))
    assert {tuple(rb.sample(2)["step"].tolist()) for _ in range(40)} == {
        (0, 1), (1, 2), (2, 3), (3, 4), (4, 5)}
    index = rb.sampler._index
    rb.set_("step", torch.tensor(0))  # not a trajectory signal: no rebuild
    assert not index.needs_rebuild


def test_pickled_buffer_samples_like_the_original() -> None:
    import pickle

    rb = make_rb(SliceSampler(slice_len=3, traj_key="episode"), size=30)
    rb.extend(episodes([8, 9, 7, 10]))
    rb.sample(6)
    copy = pickle.loads(pickle.dumps(rb))
    rb.set_rng(torch.Generator().manual_seed(2))
    copy.set_rng(torch.Generator().manual_seed(2))
    assert (rb.sample(6)["index"] == copy.sample(6)["index"]).all()
    for buffer in (rb, copy):
        buffer.extend(episodes([12], start_id=9))
    assert (rb.sample(6)["index"] == copy.sample(6)["index"]).all()


@pytest.mark.parametrize("argument", ["traj_key", "trajectory_key", "end_key", "truncated_key"])
@pytest.mark.parametrize("value", [5, ["episode"], ("next", 7)])
def test_a_key_argument_that_is_no_key_is_a_type_error_naming_it(argument, value):
    # (tensordict's RuntimeError "key should be a Sequence<NestedKey>", naming no argument)
    with pytest.raises(TypeError, match=f"{argument} must be a str or a tuple of str"):
        SliceSampler(slice_len=2, **{argument: value})
    with pytest.raises(TypeError, match="end_keys must be a str or a tuple of str"):
        SliceSampler(slice_len=2, end_keys=[("next", "done"), 5])


def test_slices_longer_than_a_one_dim_storage_of_env_rows_hint_at_ndim_2():
    # [envs, T] batches into a storage of ndim=1: each environment's row is one item, and
    # the error said only that slices of 8 are longer than the 4 steps in the buffer
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                sampler=SliceSampler(slice_len=8, end_key=("next", "done")))
    rb.extend(TensorDict({"obs": torch.zeros(4, 25),
                          ("next", "done"): torch.zeros(4, 25, dtype=torch.bool)}, [4, 25]))
    with pytest.raises(ValueError, match="longer than the 4 steps in the buffer.*ndim=2"):
        rb.sample(16)
