"""Bad input, round 2: a clear error naming the argument, and the buffer exactly as it was.

Failed reads put back the state of read-side transforms with state (``has_state``), as they
put back a sampler's draws; the setters and constructors check what they are given.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict, is_tensor_collection

from tdreplay.core import (
    Compose,
    ConsumingSampler,
    HERReplayBuffer,
    ListStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    Transform,
    filter_trajectories,
    traj,
)
from tdreplay.core.testing import StackedListStorage


# ---- helpers ----------------------------------------------------------------------------------
def _same(a, b):
    """Deep equality of states (tensors by value, NaN-aware)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape
                and bool(torch.equal(a.nan_to_num(7.5), b.nan_to_num(7.5))
                         if a.is_floating_point() else torch.equal(a, b)))
    if is_tensor_collection(a) or is_tensor_collection(b):
        return (is_tensor_collection(a) and is_tensor_collection(b)
                and _same(a.to_dict(), b.to_dict()))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


class RunningSum(Transform):
    """A read-side transform with state that hands out its live tensor (worst case)."""

    has_state = True

    def __init__(self):
        super().__init__(in_keys=["obs"], out_keys=["obs"])
        self.total = torch.zeros(())
        self.count = 0

    def forward(self, td):
        self.total.add_(td["obs"].sum())
        self.count += td.numel()
        return td

    def state_dict(self):
        return {"total": self.total, "count": self.count}

    def check_state_dict(self, state):
        if not isinstance(state.get("total"), torch.Tensor) or not isinstance(state.get("count"),
                                                                                int):
            raise ValueError("bad RunningSum state")

    def load_state_dict(self, state):
        self.check_state_dict(state)
        self.total.copy_(state["total"])
        self.count = state["count"]


class Refuse(Transform):
    """Refuses every batch while ``on`` (no ``out_keys``: a query runs all before it)."""

    def __init__(self):
        super().__init__()
        self.on = False

    def forward(self, td):
        if self.on:
            raise RuntimeError("batch refused")
        return td


def _data(lengths=(3, 4, 5), episode=None):
    total = sum(lengths)
    if episode is None:
        episode = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    return TensorDict({"obs": torch.arange(total, dtype=torch.float32), "episode": episode,
                       "next": {"done": torch.zeros(total, 1, dtype=torch.bool)}}, [total])


def _pair(sampler=None, refuse_first=False, **kwargs):
    """A buffer with a RunningSum and a refusing transform, and its untouched twin."""
    out = []
    for _ in range(2):
        refuse = Refuse()
        chain = [refuse, RunningSum()] if refuse_first else [RunningSum(), refuse]
        rb = TensorDictReplayBuffer(storage=StackedListStorage(20), batch_size=4,
                                    sampler=copy.deepcopy(sampler) if sampler else None,
                                    transform=Compose(*chain),
                                    generator=torch.Generator().manual_seed(0), **kwargs)
        rb.extend(_data())
        rb[:]  # the statistics hold something already  # noqa: B018
        out.append((rb, refuse))
    return out


def _state(rb):
    """The buffer's state, less the generator's (a failed sample does not give back the random
    numbers it drew: sampling.rst, "When a batch fails")."""
    state = rb.state_dict()
    state.pop("_rng", None)
    return state


def _assert_unchanged(a, b):
    assert _same(_state(a), _state(b))
    assert _same(a.transform.state_dict(), b.transform.state_dict())
    for rb in (a, b):
        rb.sampler.generator.manual_seed(3)
    for _ in range(2):
        torch.manual_seed(5)
        x = a.sample()
        torch.manual_seed(5)
        y = b.sample()
        assert _same(x.to_dict(), y.to_dict())
    assert _same(a.transform.state_dict(), b.transform.state_dict())


# ---- finding 1: failed reads put back transforms with state ------------------------------------
@pytest.mark.parametrize("sampler", [None, SamplerWithoutReplacement(), ConsumingSampler(2)])
def test_a_refused_sample_puts_back_the_transforms_state(sampler):
    (a, refuse), (b, _) = _pair(sampler)
    refuse.on = True
    with pytest.raises(RuntimeError, match="batch refused"):
        a.sample()
    refuse.on = False
    _assert_unchanged(a, b)


def test_a_refused_batch_of_an_iteration_puts_back_the_transforms_state():
    (a, refuse), (b, _) = _pair()
    refuse.on = True
    with pytest.raises(RuntimeError, match="batch refused"):
        next(iter(a))
    with pytest.raises(RuntimeError, match="batch refused"):
        a.next()
    refuse.on = False
    _assert_unchanged(a, b)


def test_a_refused_read_by_index_puts_back_the_transforms_state():
    (a, refuse), (b, _) = _pair()
    refuse.on = True
    for index in (slice(None), torch.tensor([0, 1]), 2):
        with pytest.raises(RuntimeError, match="batch refused"):
            a[index]  # noqa: B018
    refuse.on = False
    _assert_unchanged(a, b)


def test_a_query_whose_predicate_raises_puts_back_the_transforms_state():
    (a, _), (b, _) = _pair()
    with pytest.raises(ZeroDivisionError):
        a.query(lambda t: 1 / 0)
    with pytest.raises(KeyError, match="nokey"):  # a traj predicate, all transforms run
        a.query(traj.nokey.sum() > 1)
    _assert_unchanged(a, b)


def test_a_query_refused_by_a_later_transform_puts_back_the_transforms_state():
    (a, refuse), (b, _) = _pair()
    refuse.on = True
    with pytest.raises(RuntimeError, match="batch refused"):
        a.query()
    refuse.on = False
    _assert_unchanged(a, b)


def test_successful_reads_still_update_the_transforms_state():
    (a, _), _ = _pair()
    before = a.transform.state_dict()["0:RunningSum"]["count"]
    a.sample()
    a.query()
    a[:2]  # noqa: B018
    assert a.transform.state_dict()["0:RunningSum"]["count"] == before + 4 + 12 + 2


# ---- finding 3: free_slots must list every consumed slot ---------------------------------------
def test_consuming_state_missing_a_consumed_slot_is_refused():
    rbs = []
    for _ in range(2):
        rb = TensorDictReplayBuffer(storage=StackedListStorage(8), batch_size=4,
                                    consume_after_n_samples=1,
                                    generator=torch.Generator().manual_seed(0))
        rb.extend(TensorDict({"x": torch.arange(8.0)}, [8]))
        rb.sample()
        rbs.append(rb)
    a, b = rbs
    state = copy.deepcopy(a.state_dict())
    state["_sampler"]["free_slots"] = state["_sampler"]["free_slots"][:-1]
    with pytest.raises(ValueError, match="free_slots"):
        a.load_state_dict(state)
    with pytest.raises(ValueError, match="free_slots"):
        a.sampler.load_state_dict(state["_sampler"])
    assert _same(a.state_dict(), b.state_dict()) and len(a) == len(b) == 4
    a.load_state_dict(b.state_dict())  # a complete one still loads


# ---- finding 6: max_sample_count setter --------------------------------------------------------
@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                        ("a", TypeError), (True, TypeError)])
def test_max_sample_count_setter_is_checked(bad, error):
    rbs = []
    for _ in range(2):
        rb = ReplayBuffer(storage=ListStorage(6), sampler=ConsumingSampler(2), batch_size=2,
                          generator=torch.Generator().manual_seed(0))
        rb.extend(list(range(6)))
        rbs.append(rb)
    a, b = rbs
    with pytest.raises(error, match="max_sample_count"):
        a.sampler.max_sample_count = bad
    assert a.sampler.max_sample_count == 2
    assert _same(a.state_dict(), b.state_dict())
    assert [sorted(a.sample()) for _ in range(3)] == [sorted(b.sample()) for _ in range(3)]
    a.sampler.max_sample_count = 3
    assert a.sampler.max_sample_count == 3


# ---- finding 7: HER key setters ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["goal_key", "achieved_goal_key", "reward_key", "end_key"])
@pytest.mark.parametrize("bad", [5, None, 1.5, ("next", 3), ()])
def test_her_key_setters_are_checked(name, bad):
    rb = HERReplayBuffer(lambda td: td["next", "reward"], storage=StackedListStorage(8))
    before = copy.deepcopy(rb.state_dict())
    with pytest.raises(TypeError, match=name):
        setattr(rb, name, bad)
    assert _same(rb.state_dict(), before)
    rb.load_state_dict(rb.state_dict())  # the checkpoint still loads
    setattr(rb, name, ("next", "flag"))
    assert getattr(rb, name) == ("next", "flag")


# ---- finding 10: checkpointer= at construction -------------------------------------------------
@pytest.mark.parametrize("bad", [5, "flat", object()])
def test_storage_checkpointer_argument_is_checked(bad):
    with pytest.raises(TypeError, match="checkpointer"):
        ListStorage(8, checkpointer=bad)


def test_storage_checkpointer_class_instead_of_instance_is_refused():
    checkpointer_cls = type(ListStorage(8).checkpointer)
    with pytest.raises(TypeError, match=r"checkpointer.*instance"):
        ListStorage(8, checkpointer=checkpointer_cls)
    ListStorage(8, checkpointer=checkpointer_cls())


# ---- finding 11: NaN / fractional trajectory ids ------------------------------------------------
@pytest.mark.parametrize("ids", [
    torch.tensor([0.0] * 5 + [float("nan")] * 3 + [2.0] * 4),
    torch.tensor([0.5] * 5 + [1.5] * 3 + [2.5] * 4),
    torch.tensor([0.0] * 5 + [float("inf")] * 3 + [2.0] * 4),
])
def test_queries_refuse_non_whole_trajectory_ids(ids):
    data = _data((5, 3, 4), episode=ids)
    with pytest.raises(ValueError, match="episode"):
        filter_trajectories(data)
    rbs = []
    for _ in range(2):
        rb = TensorDictReplayBuffer(storage=StackedListStorage(20), batch_size=3,
                                    transform=Compose(RunningSum()),
                                    generator=torch.Generator().manual_seed(0))
        rb.extend(data)
        rbs.append(rb)
    a, b = rbs
    with pytest.raises(ValueError, match="episode"):
        a.query()
    with pytest.raises(ValueError, match="episode"):
        a.query(traj.length > 1)
    _assert_unchanged(a, b)


def test_queries_take_whole_float_ids():
    data = _data((5, 3, 4), episode=torch.tensor([0.0] * 5 + [1.0] * 3 + [2.0] * 4))
    assert [t.length for t in filter_trajectories(data)] == [5, 3, 4]


# ---- finding 13: shared= / share() -------------------------------------------------------------
@pytest.mark.parametrize("bad", ["yes", 1, 1.5, None])
def test_shared_flags_are_checked(bad):
    with pytest.raises(TypeError, match="shared"):
        ReplayBuffer(storage=ListStorage(8), shared=bad)
    rb = ReplayBuffer(storage=ListStorage(8), batch_size=2)
    rb.extend([1, 2, 3])
    before = copy.deepcopy(rb.state_dict())
    with pytest.raises(TypeError, match="shared"):
        rb.share(bad)
    assert rb.shared is False and _same(rb.state_dict(), before)
    rb.share(True)
    with pytest.raises(TypeError, match="shared"):
        rb.share(bad)
    assert rb.shared is True
