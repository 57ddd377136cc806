"""Model-based (differential) fuzzing of ``MinariExperienceReplay`` against Minari's own API.

Random local Minari datasets (``minari.create_dataset_from_buffers``; episode counts and
lengths drawn at random, length-1 episodes included, episodes ending by termination or by
truncation, Box / nested Dict / Tuple observations, discrete and continuous actions, infos
with per-step values and a ``state`` entry) are converted, and the stored data is checked
against the model: the source episodes read back with ``minari.load_dataset(...).
iterate_episodes()`` and laid out by hand in TorchRL's TED layout
(docs/guides/datasets.rst):

1. every row equals its source step (``observation``, ``action``, ``episode``,
   ``("next", "observation" | "reward" | "terminated" | "truncated" | "done")``, ``info`` /
   ``("next", "info")``, an info ``state`` entry included, kept under ``info`` as TorchRL
   keeps it), rows = total steps, episodes in order;
2. ``split_trajs=True``: one zero-padded row per episode, ``mask`` exactly the real steps;
3. a ``SliceSampler`` never returns a slice crossing two episodes, and slice contents equal
   the source steps (slice ends are marked ``truncated``/``done``, as TorchRL does);
4. a second construction reuses the converted files (same data); a changed local source is
   converted again with ``load_from_local_minari=True`` (and ``download="force"``);
5. batched ``sample``: each returned row equals the row at the returned ``index``.

No divergence from the model was found (see the report of the session that wrote this
file); all tests here are guards.
"""

from __future__ import annotations

import shutil
import warnings

import minari
import numpy as np
import pytest
import torch
from gymnasium import spaces
from minari.data_collector import EpisodeBuffer

from tdreplay.datasets import MinariExperienceReplay
from tdreplay.samplers import SliceSampler


# ---- the model -------------------------------------------------------------------------------
def _sample_space(space, rng, n):
    if isinstance(space, spaces.Dict):
        return {k: _sample_space(s, rng, n) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_sample_space(s, rng, n) for s in space.spaces)
    if isinstance(space, spaces.Discrete):
        return rng.integers(0, space.n, n).astype(np.int64)
    return rng.uniform(-1, 1, (n, *space.shape)).astype(space.dtype)


def _spaces(kind: int):
    if kind == 0:
        return spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(4)
    if kind == 1:
        return spaces.Box(-1, 1, (2, 2), np.float64), spaces.Box(-1, 1, (2,), np.float32)
    if kind == 2:
        return (spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32),
                             "inner": spaces.Dict({"v": spaces.Box(-1, 1, (1,), np.float32),
                                                   "k": spaces.Discrete(3)})}),
                spaces.Discrete(2))
    return (spaces.Tuple((spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3))),
            spaces.Box(-1, 1, (1,), np.float32))


def make_random(dataset_id: str, seed: int, kind: int | None = None,
                lengths: list[int] | None = None) -> None:
    """A random local Minari dataset (see the module docstring)."""
    rng = np.random.default_rng(seed)
    obs_space, act_space = _spaces(int(rng.integers(4)) if kind is None else kind)
    with_info = bool(rng.integers(2))
    if lengths is None:
        lengths = [int(rng.choice([1, 1, 2, 3, 5, 8])) for _ in range(int(rng.integers(1, 7)))]
    episodes = []
    for i, steps in enumerate(lengths):
        terminated, truncated = np.zeros(steps, bool), np.zeros(steps, bool)
        (terminated if rng.integers(2) else truncated)[-1] = True
        infos = {}
        if with_info:
            infos = {"x": rng.normal(size=steps + 1),
                     "flag": rng.integers(0, 2, steps + 1).astype(bool),
                     "state": {"qpos": rng.normal(size=(steps + 1, 2))}}
        episodes.append(EpisodeBuffer(
            id=i, observations=_sample_space(obs_space, rng, steps + 1),
            actions=_sample_space(act_space, rng, steps), rewards=rng.normal(size=steps),
            terminations=terminated, truncations=truncated, infos=infos))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(dataset_id, episodes, observation_space=obs_space,
                                           action_space=act_space, algorithm_name="random")


def source(dataset_id: str) -> list:
    return list(minari.load_dataset(dataset_id).iterate_episodes())


def _at(tree, t):
    if isinstance(tree, dict):
        return {k: _at(v, t) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return {str(i): _at(v, t) for i, v in enumerate(tree)}
    return np.asarray(tree)[t]


def _assert_tree(actual, expected, where: str) -> None:
    if isinstance(expected, dict):
        assert set(actual.keys()) == set(expected), (where, list(actual.keys()), list(expected))
        for key, value in expected.items():
            _assert_tree(actual[key], value, f"{where}.{key}")
        return
    got = actual.numpy()
    want = np.asarray(expected)
    assert got.size == want.size, (where, got.shape, want.shape)
    np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=where)


def assert_step(row, ep, t: int, slice_end: bool = False) -> None:
    """``row`` is step ``t`` of source episode ``ep`` in the TED layout."""
    _assert_tree(row["observation"], _at(ep.observations, t), "observation")
    _assert_tree(row["next", "observation"], _at(ep.observations, t + 1), "next.observation")
    _assert_tree(row["action"], _at(ep.actions, t), "action")
    assert row["next", "reward"].item() == ep.rewards[t]
    terminated, truncated = bool(ep.terminations[t]), bool(ep.truncations[t])
    assert row["next", "terminated"].item() == terminated
    assert row["next", "truncated"].item() == (truncated or slice_end)
    assert row["next", "done"].item() == (terminated or truncated or slice_end)
    assert row["episode"].item() == ep.id
    if ep.infos:
        _assert_tree(row["info"], _at(ep.infos, t), "info")
        _assert_tree(row["next", "info"], _at(ep.infos, t + 1), "next.info")
        assert "state" not in row.keys() and "state" not in row["next"].keys()


def assert_flat(rows, episodes) -> None:
    assert rows.batch_size == (sum(len(ep.rewards) for ep in episodes),)
    i = 0
    for ep in episodes:
        for t in range(len(ep.rewards)):
            assert_step(rows[i], ep, t)
            i += 1


def load(dataset_id, root, batch_size=4, **kwargs) -> MinariExperienceReplay:
    kwargs.setdefault("load_from_local_minari", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MinariExperienceReplay(dataset_id, batch_size, root=root, **kwargs)


SEEDS = [0, 1, 2, 3, 5, 8]


# ---- 1. rows --------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_rows_equal_the_source_steps(minari_dir, root, seed):
    dataset_id = f"fuzz/flat{seed}-v0"
    make_random(dataset_id, seed)
    episodes = source(dataset_id)
    data = load(dataset_id, root)
    assert len(data) == data.metadata["total_steps"] == sum(len(ep.rewards) for ep in episodes)
    assert data.metadata["total_episodes"] == len(episodes)
    assert_flat(data[:], episodes)


@pytest.mark.parametrize("kind", [0, 1, 2, 3])
def test_every_space_kind_with_length_one_episodes(minari_dir, root, kind):
    dataset_id = f"fuzz/kind{kind}-v0"
    make_random(dataset_id, 100 + kind, kind=kind, lengths=[1, 3, 1, 1, 2])
    assert_flat(load(dataset_id, root)[:], source(dataset_id))


# ---- 2. split_trajs -------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS[:4])
def test_split_rows_are_the_padded_episodes(minari_dir, root, seed):
    dataset_id = f"fuzz/split{seed}-v0"
    make_random(dataset_id, seed)
    episodes = source(dataset_id)
    rows = load(dataset_id, root, split_trajs=True)[:]
    max_len = max(len(ep.rewards) for ep in episodes)
    assert rows.batch_size == (len(episodes), max_len)
    for k, ep in enumerate(episodes):
        steps = len(ep.rewards)
        mask = rows["mask"][k]
        assert mask[:steps].all() and not mask[steps:].any()
        for t in range(steps):
            assert_step(rows[k, t], ep, t)
        for key, value in rows[k, steps:].items(include_nested=True, leaves_only=True):
            if key != "mask":
                assert (value == 0).all(), (k, key)


# ---- 3. slices ------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler_kwargs", [{"traj_key": "episode"},
                                            {"end_key": ("next", "done")}])
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_slices_stay_in_one_episode_and_equal_the_source(minari_dir, root, seed,
                                                          sampler_kwargs):
    dataset_id = f"fuzz/slice{seed}-v0"
    lengths = [1, 3, 1, 2, 5, 1, 4]
    make_random(dataset_id, seed, lengths=lengths)
    episodes = source(dataset_id)
    starts = np.cumsum([0] + lengths[:-1])
    load(dataset_id, root)
    for slice_len in (2, 3):
        data = MinariExperienceReplay(
            dataset_id, 4 * slice_len, root=root, download=False,
            sampler=SliceSampler(slice_len=slice_len, **sampler_kwargs))
        data.set_rng(torch.Generator().manual_seed(seed))
        for _ in range(4):
            batch = data.sample().reshape(4, slice_len)
            for r in range(4):
                ids = batch["episode"][r]
                assert (ids == ids[0]).all(), ids
                ep = episodes[int(ids[0])]
                index = batch["index"][r]
                assert (torch.diff(index) == 1).all(), index
                first = int(index[0]) - int(starts[ep.id])
                for j in range(slice_len):
                    assert_step(batch[r, j], ep, first + j, slice_end=j == slice_len - 1)


# ---- 4. reuse and force ---------------------------------------------------------------------
def test_reuse_gives_identical_data_and_force_takes_the_new_source(minari_dir, root):
    dataset_id = "fuzz/force-v0"
    make_random(dataset_id, 11, kind=2, lengths=[2, 1, 3])
    old = source(dataset_id)
    first = load(dataset_id, root, split_trajs=True)
    flat_old, split_old = load(dataset_id, root)[:], first[:]
    again = load(dataset_id, root, download=False, load_from_local_minari=False)
    assert (again[:] == flat_old).all()
    assert (load(dataset_id, root, split_trajs=True, download=False)[:] == split_old).all()

    shutil.rmtree(minari_dir / dataset_id)
    make_random(dataset_id, 12, kind=2, lengths=[1, 4])
    new = source(dataset_id)
    # not reading the local source: the converted copy is reused
    assert_flat(load(dataset_id, root, download=False, load_from_local_minari=False)[:], old)
    # reading it: its change is seen, the flat data and its split are converted again
    assert_flat(load(dataset_id, root)[:], new)
    resplit = load(dataset_id, root, split_trajs=True)[:]
    assert resplit.batch_size == (2, 4)
    for k, ep in enumerate(new):
        for t in range(len(ep.rewards)):
            assert_step(resplit[k, t], ep, t)
    forced = load(dataset_id, root, download="force", split_trajs=True)
    assert forced[:].batch_size == (2, 4)
    for k, ep in enumerate(new):
        for t in range(len(ep.rewards)):
            assert_step(forced[:][k, t], ep, t)
    assert_flat(load(dataset_id, root, download=False)[:], new)


# ---- 5. batched sample ----------------------------------------------------------------------
@pytest.mark.parametrize("split_trajs", [False, True])
def test_sampled_rows_equal_the_rows_at_their_index(minari_dir, root, split_trajs):
    dataset_id = "fuzz/sample-v0"
    make_random(dataset_id, 21, kind=2, lengths=[1, 3, 2, 5, 1])
    data = load(dataset_id, root, batch_size=7, split_trajs=split_trajs)
    data.set_rng(torch.Generator().manual_seed(0))
    rows = data[:]
    for _ in range(3):
        sample = data.sample()
        assert sample.batch_size[0] == 7
        index = sample["index"]
        if split_trajs:  # one index per episode row, repeated along its steps
            assert index.shape == sample.batch_size and (index == index[:, :1]).all()
            index = index[:, 0]
        expected = rows[index]
        for key, value in expected.items(include_nested=True, leaves_only=True):
            assert (sample[key] == value).all(), key
