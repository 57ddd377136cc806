"""A slice sampler's saved trajectory index is checked before it loads: a damaged state (a lanes
table of another size, record ids outside the table, a lane whose chain loops) made the
compiled kernel read and write outside its arrays (a segfault at the next extend or sample);
now it is refused with a ``ValueError`` and the buffer stays as it was. Every state a real
buffer saves still loads (random writes, wraps, several environments, rebuilds)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.core.testing import assert_same
from tdreplay.samplers import PrioritizedSliceSampler, SliceSampler
from tdreplay.samplers._trajectory_index import HEAD, LANE, LEN, NEXT, START, TAIL
from tdreplay.storages import LazyTensorStorage


def steps(n: int, start: int = 0, per_episode: int = 4) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict({"obs": ids.float().unsqueeze(-1), "episode": ids // per_episode,
                       "next": {"done": torch.zeros(n, 1, dtype=torch.bool)}}, [n])


def buffer(prioritized: bool = False) -> TensorDictReplayBuffer:
    kwargs = {"slice_len": 2, "traj_key": "episode"}
    sampler = (PrioritizedSliceSampler(max_capacity=16, alpha=0.7, beta=0.5, **kwargs)
               if prioritized else SliceSampler(**kwargs))
    return TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=sampler)


def saved(prioritized: bool = False) -> dict:
    """The state of a buffer that wrapped (20 steps into 16 slots) and sampled."""
    rb = buffer(prioritized)
    rb.extend(steps(12))
    rb.sample(4)
    rb.extend(steps(8, start=12))
    rb.sample(4)
    return rb.state_dict()


def index_of(state: dict) -> dict:
    return state["_sampler"]["index"]


def set_lane_heads_to_self_loop(index: dict) -> None:
    records = index["records"]
    head = int(index["lanes"][0, HEAD])
    records[head, NEXT] = head  # the lane's chain never ends


def link_backwards(index: dict) -> None:
    records, dense = index["records"], index["dense"]
    a, b = int(dense[0]), int(dense[1])
    records[a, NEXT], records[b, NEXT] = b, a


DAMAGE: dict[str, Callable[[dict], None]] = {
    "lanes table shorter than the lanes": lambda i: i.__setitem__("lanes", i["lanes"][:0]),
    "lanes table longer than the lanes": lambda i: i.__setitem__(
        "lanes", torch.cat([i["lanes"], i["lanes"]])),
    "a record's lane outside the table": lambda i: i["records"][:, LANE].fill_(7),
    "a record's link outside the table": lambda i: i["records"][:, NEXT].fill_(10**6),
    "a record of negative length": lambda i: i["records"][:, LEN].fill_(-3),
    "a record at a negative position": lambda i: i["records"][:, START].fill_(-1),
    "a lane head outside the table": lambda i: i["lanes"][:, HEAD].fill_(10**6),
    "a lane head without a tail": lambda i: i["lanes"][:, TAIL].fill_(-1),
    "a chain that loops": set_lane_heads_to_self_loop,
    "a chain that goes back in time": link_backwards,
    "dense and free lists overlapping": lambda i: i["dense"].fill_(0),
    "slot records outside the table": lambda i: i["slot_rec"].fill_(10**6),
    "slot records of another length": lambda i: i.__setitem__("slot_rec", i["slot_rec"][:3]),
    "a pending write past the storage": lambda i: i.__setitem__(
        "pending", torch.tensor([[14, 8, 8]])),
    "an unknown mode": lambda i: i["meta"].__setitem__(0, 5),
    "chunks without steps": lambda i: i["meta"].__setitem__(1, 0),
}


@pytest.mark.parametrize("prioritized", [False, True], ids=["slice", "prioritized_slice"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_index_is_refused_and_the_buffer_unchanged(prioritized, damage):
    state = copy.deepcopy(saved(prioritized))
    if damage.startswith("slot records") and not prioritized:
        state["_sampler"]["index"]["slot_rec"] = torch.arange(16)  # tracked only when prioritized
    DAMAGE[damage](index_of(state))
    rb = buffer(prioritized)
    rb.extend(steps(6, start=100))
    before = copy.deepcopy(rb.state_dict())
    with pytest.raises(ValueError, match=r"state_dict\['_sampler'\].*trajectory index state"):
        rb.load_state_dict(state)
    assert_same(rb.state_dict(), before)
    sample = rb.sample(4)  # still samples what it held
    assert bool((sample["episode"] >= 25).all())


@pytest.mark.parametrize("prioritized", [False, True], ids=["slice", "prioritized_slice"])
def test_a_saved_index_loads_and_samples_the_saved_trajectories(prioritized):
    state = saved(prioritized)
    rb = buffer(prioritized)
    rb.load_state_dict(state)
    sample = rb.sample(16)
    pairs = sample["episode"].reshape(-1, 2)
    assert bool((pairs[:, 0] == pairs[:, 1]).all())  # slices never cross trajectories
    assert set(sample["episode"].tolist()) <= {1, 2, 3, 4}  # steps 4..19 survive the wrap


def random_run(seed: int) -> list[dict]:
    """The trajectory index states of a buffer written at random: 1 to 3 environments, wraps,
    episode ends, in-place rewrites (the index is rebuilt) and samples in between."""
    rng = random.Random(seed)
    envs, ndim = rng.choice([(1, 1), (2, 2), (3, 2)])
    capacity = rng.choice([8, 12, 20]) * envs
    sampler = SliceSampler(slice_len=2, traj_key="episode", strict_length=False) \
        if rng.random() < 0.5 else \
        PrioritizedSliceSampler(max_capacity=capacity, alpha=0.7, beta=0.5, slice_len=2,
                                traj_key="episode", strict_length=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, ndim=ndim), sampler=sampler)
    states, episode = [], 0
    for _ in range(12):
        length = rng.randint(1, 6)
        shape = [envs, length] if ndim == 2 else [length]
        rb.extend(TensorDict({"episode": torch.randint(0, 3, shape) + episode,
                              "next": {"done": torch.rand(*shape, 1) < 0.2}}, shape))
        episode += 3
        if rng.random() < 0.3:
            row = rng.randrange(len(rb.storage) // (envs if ndim == 2 else 1))
            rb.storage[row] = rb.storage[row].clone()  # unseen by the index: a rebuild
        if rng.random() < 0.6:
            rb.sample(4)
        states.append(copy.deepcopy(rb.sampler.state_dict()["index"]))
    return states


@pytest.mark.parametrize("seed", range(12))
def test_every_state_a_buffer_saves_is_accepted(seed):
    from tdreplay.samplers._index_state import check_index_state

    for state in random_run(seed):
        check_index_state(state)
