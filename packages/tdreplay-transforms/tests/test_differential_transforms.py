"""Differential tests of transforms in buffers: a buffer restored at random points of a seeded
history (``state_dict`` into a new buffer, ``dumps`` / ``loads``, pickling, ``deepcopy``) must
draw the same samples (every entry, dtype included) and hold the same transform state
(``rb.transform.state_dict()``), length and write count after every step as one never
restored, going through the same extends, samples, priority updates, empties and
``ObservationNorm.init_stats_from`` calls.

Configurations: ``ObservationNorm`` (initialized mid-history, or never), ``RewardScaling``,
``VecNorm`` (its running statistics change with every sample), ``RewardClipping``,
``ExcludeTransform``, a ``DTypeCastTransform`` inserted with ``invert=True`` (half-precision
storage), an ``ObservationNorm`` appended with ``invert=True``, ``CatFrames`` + ``MultiStep``
behind a ``SliceSampler``; on tensor, memmap and list storages, with random, without-replacement,
slice and prioritized samplers; transforms given at construction, in a ``Compose``, and
added with ``append_transform`` / ``insert_transform``.

The first test is a focused reproduction of a divergence these histories found (fixed: a
buffer holding a ``VecNorm`` pickles and deep-copies); the last ones guard the behaviours that
agree.
"""

from __future__ import annotations

import copy
import pickle
import random

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, SamplerWithoutReplacement, TensorDictReplayBuffer
from tdreplay.core.testing import restored
from tdreplay.samplers import PrioritizedSampler, SliceSampler
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage
from tdreplay.transforms import (
    CatFrames,
    Compose,
    DTypeCastTransform,
    ExcludeTransform,
    MultiStep,
    ObservationNorm,
    RewardClipping,
    RewardScaling,
    VecNorm,
)

_COPIES = {"pickle": lambda obj: pickle.loads(pickle.dumps(obj)), "deepcopy": copy.deepcopy}


# ---- focused reproduction -----------------------------------------------------------------------

@pytest.mark.parametrize("how", sorted(_COPIES))
def test_buffer_with_vecnorm_copies(how):
    # buffers copy with pickle.dumps / deepcopy (a pickled copy is what a worker receives),
    # VecNorm holds a threading.Lock, which does not pickle. TorchRL 0.14.1: the same buffer
    # with its VecNorm pickles and deep-copies, and the copy samples as the original
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4,
                                transform=VecNorm(in_keys=["obs"], decay=0.9))
    rb.extend(TensorDict({"obs": torch.arange(10.0)}, [10]))
    rb.sample()
    copied = _COPIES[how](rb)  # was: TypeError: cannot pickle '_thread.lock' object
    assert copied.transform.state_dict().keys() == rb.transform.state_dict().keys()
    torch.manual_seed(0)
    expected = rb.sample()["obs"]
    torch.manual_seed(0)
    assert torch.equal(copied.sample()["obs"], expected)


# ---- guard: restored buffers with transforms sample alike ---------------------------------------

def _episodes(steps: int, base: float, episode: int) -> TensorDict:
    """Two episodes (one when ``steps`` < 4) of ``steps`` steps in all."""
    obs = torch.arange(steps * 2, dtype=torch.float32).reshape(steps, 2) + base
    done = torch.zeros(steps, 1, dtype=torch.bool)
    ids = torch.full((steps,), episode)
    if steps > 3:
        done[steps // 2 - 1] = True
        ids[steps // 2:] = episode + 1
    done[-1] = True
    return TensorDict({
        "obs": obs, "obs2": obs[:, :1] * 3 - base, "episode": ids,
        ("next", "obs"): obs + 1,
        ("next", "reward"): (torch.arange(steps, dtype=torch.float32) % 3).unsqueeze(-1),
        ("next", "done"): done, ("next", "terminated"): done.clone(),
    }, [steps])


def _norms():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(20), batch_size=6, generator=torch.Generator().manual_seed(0),
        transform=Compose(ObservationNorm(in_keys=["obs"], standard_normal=True),
                          RewardScaling(loc=0.5, scale=2.0, in_keys=[("next", "reward")]),
                          VecNorm(in_keys=["obs2"], decay=0.9)))
    # stored in half precision, handed back in float32 before the other transforms run
    rb.insert_transform(0, DTypeCastTransform(torch.float32, torch.float16, in_keys=["obs2"],
                                              in_keys_inv=["obs2"]), invert=True)
    rb.append_transform(VecNorm(in_keys=[("next", "obs")], decay=0.8))
    return rb


def _norms_list():
    rb = TensorDictReplayBuffer(
        storage=ListStorage(20), batch_size=6, sampler=SamplerWithoutReplacement(),
        transform=Compose(VecNorm(in_keys=["obs2"], decay=0.9),
                          RewardClipping(0.0, 1.5, in_keys=[("next", "reward")])))
    rb.append_transform(ObservationNorm(loc=1.0, scale=2.0, in_keys=["obs"], in_keys_inv=["obs"]),
                        invert=True)
    return rb


def _slices(with_vecnorm: bool):
    def make():
        rb = TensorDictReplayBuffer(
            storage=LazyMemmapStorage(30), batch_size=8,
            sampler=SliceSampler(num_slices=2, traj_key="episode"),
            transform=Compose(CatFrames(N=3, dim=-1, in_keys=["obs"]),
                              MultiStep(gamma=0.9, n_steps=3)))
        if with_vecnorm:
            rb.append_transform(VecNorm(in_keys=["obs2"], decay=0.95))
        else:
            rb.insert_transform(0, DTypeCastTransform(torch.float32, torch.float16,
                                                      in_keys=["obs2"], in_keys_inv=["obs2"]),
                                invert=True)
            rb.append_transform(ObservationNorm(in_keys=["obs2"], standard_normal=True))
            rb.append_transform(RewardScaling(loc=0.5, scale=2.0, in_keys=[("next", "reward")]))
        return rb
    return make


def _prioritized():
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(16), batch_size=4, sampler=PrioritizedSampler(16, 0.8, 0.6),
        transform=Compose(VecNorm(in_keys=["obs"], decay=0.9), ExcludeTransform("episode")))


_KINDS = {  # name: (make, the position of an ObservationNorm to initialize mid-history)
    "norms": (_norms, 1),
    "norms_list": (_norms_list, None),
    "slices_vecnorm": (_slices(True), None),
    "slices": (_slices(False), 3),
    "prioritized": (_prioritized, None),
}



def _plain(td) -> dict:
    return {k: (v.dtype, v.tolist()) for k, v in td.items(True, True)}


def _transform_state(rb) -> dict:
    return {name: {k: v.tolist() for k, v in state.items()}
            for name, state in rb.transform.state_dict().items()}


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_restored_buffers_with_transforms_sample_alike(kind):
    make, norm_at = _KINDS[kind]
    hows = ["state_dict", "dumps", "pickle", "deepcopy"]
    for seed in range(4):
        rng = random.Random(seed)
        ref, twin = make(), make()
        keep: list = []
        base, episode = 0, 0
        for step in range(25):
            op = rng.choices(["extend", "sample", "priority", "restore", "init", "empty"],
                             [3, 4, 1, 1.5, 1, 0.2])[0]
            op = "extend" if step == 0 else op
            data = _episodes(rng.randint(4, 10), base, episode)
            base, episode = base + 100, episode + 2
            how = rng.choice(hows)
            draw_seed = rng.randrange(2**31)
            results = []
            for which in ("ref", "twin"):
                rb = ref if which == "ref" else twin
                out = None
                if op == "extend":
                    rb.extend(data.clone())
                elif op in ("sample", "priority") and len(rb):
                    torch.manual_seed(draw_seed)
                    np.random.seed(draw_seed % 2**32)
                    try:
                        sample = rb.sample()
                    except RuntimeError as err:  # both alike: not initialized, slices too short
                        out = str(err)
                    else:
                        out = _plain(sample)
                        if op == "priority" and kind == "prioritized":
                            rb.update_priority(sample["index"], (sample["index"] % 4 + 1).float())
                elif op == "restore" and which == "twin":
                    twin = rb = restored(rb, make, how, keep)
                elif op == "init" and norm_at is not None:
                    norm = rb.transform[norm_at]
                    if not norm.initialized:
                        norm.init_stats_from(data)
                elif op == "empty":
                    rb.empty()
                results.append((out, _transform_state(rb), len(rb), rb.write_count))
            assert results[0] == results[1], (kind, seed, step, op, how)
