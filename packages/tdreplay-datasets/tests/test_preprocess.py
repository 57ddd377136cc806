"""``preprocess``: a function over the whole dataset, in worker processes, into a new storage."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tdreplay.core import ReplayBuffer
from tdreplay.datasets import BaseDatasetExperienceReplay, MinariExperienceReplay
from tdreplay.datasets._parallel_map import chunk_bounds
from tdreplay.storages import TensorStorage


def ted_features(td):
    """Keep a few entries, add the observation's norm and a scaled reward (module level: the
    spawn workers import it)."""
    out = td.select("observation", "episode", ("next", "done"), ("next", "reward"))
    out.set("obs_norm", td["observation"].norm(dim=-1))
    out.set(("next", "reward"), td["next", "reward"] * 10)
    return out


def mutate_and_return(td):
    """A function that scribbles on its input: the dataset must not change."""
    td["observation"].zero_()
    td.set("flag", torch.ones(td.batch_size, dtype=torch.bool))
    return td


def per_step_mean(td):
    """For [episodes, time] data split along time: the mean of the observation per step."""
    return td.empty().set("obs_mean", td["observation"].mean(-1))


def unstable_keys(td):
    """Keys that depend on the data: fails on any chunk that does not start at row 0."""
    out = td.select("episode")
    if int(td["index_in_chunk"][0]) != 0:
        out.set("extra", torch.zeros(td.batch_size))
    return out


def wrong_batch(td):
    return td[:1]


_PARENT = os.getpid()


def dies_in_workers(td):
    """Killed in a worker process (as by the OOM killer); fine in the parent."""
    if os.getpid() != _PARENT:
        os.kill(os.getpid(), signal.SIGKILL)
    return ted_features(td)


@pytest.fixture
def data(cartpole, root) -> MinariExperienceReplay:
    return MinariExperienceReplay(cartpole, 8, root=root, load_from_local_minari=True)


def check_features(storage: TensorStorage, data, frames: int | None = None) -> None:
    source = data[:]
    if frames is not None:
        source = source[:frames]
    want = ted_features(source)
    got = storage[:]
    assert len(storage) == source.batch_size[0]
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        assert torch.equal(got[key], want[key]), key


def test_in_process(data, tmp_path):
    before = data[:].clone()
    storage = data.preprocess(ted_features, num_workers=0, dest=tmp_path / "out")
    assert isinstance(storage, TensorStorage)
    check_features(storage, data)
    assert (tmp_path / "out" / "obs_norm.memmap").is_file()
    assert (data[:] == before).all()
    rb = ReplayBuffer(storage=storage, batch_size=4)
    sample = rb.sample()
    assert torch.allclose(sample["obs_norm"], sample["observation"].norm(dim=-1))


@pytest.mark.parametrize("start_method, workers", [("fork", 2), ("spawn", 1)])
def test_worker_processes(data, tmp_path, start_method, workers):
    # one spawn worker: each one imports torch afresh, slow on a small machine
    storage = data.preprocess(ted_features, num_workers=workers, chunksize=7,
                              mp_start_method=start_method, dest=tmp_path / "out")
    check_features(storage, data)


def test_a_worker_that_dies_fails_the_call_instead_of_hanging(data, tmp_path):
    """A multiprocessing.Pool waited for the dead worker's chunk for good."""
    with pytest.raises(RuntimeError, match="a worker process died"):
        data.preprocess(dies_in_workers, num_workers=2, num_chunks=4, mp_start_method="fork",
                        dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no scratch left


def test_workers_get_copies(data, tmp_path):
    before = data[:].clone()
    storage = data.preprocess(mutate_and_return, num_workers=2, num_chunks=5,
                              mp_start_method="fork", dest=tmp_path / "out")
    assert (storage[:]["observation"] == 0).all() and storage[:]["flag"].all()
    assert (data[:] == before).all()
    assert (MinariExperienceReplay(data.dataset_id, 4, root=data.root, download=False)[:]
            == before).all()


def test_num_frames_limits_to_the_first_rows(data, tmp_path):
    storage = data.preprocess(ted_features, num_workers=0, num_frames=10, dest=tmp_path / "out")
    check_features(storage, data, frames=10)
    larger = data.preprocess(ted_features, num_workers=0, num_frames=10_000,
                             dest=tmp_path / "all")
    check_features(larger, data)


def test_progress_bar(data, tmp_path, capfd):
    capfd.readouterr()
    data.preprocess(ted_features, num_workers=0, pbar=True, dest=tmp_path / "out")
    err = capfd.readouterr().err
    assert "preprocess" in err and f"{len(data)}/{len(data)}" in err
    data.preprocess(ted_features, num_workers=0, dest=tmp_path / "quiet")
    assert "preprocess" not in capfd.readouterr().err


def test_split_data_along_time(cartpole, root, tmp_path):
    data = MinariExperienceReplay(cartpole, 2, root=root, load_from_local_minari=True,
                                  split_trajs=True)
    rows = data[:]
    storage = data.preprocess(per_step_mean, dim=1, num_workers=2, chunksize=4,
                              mp_start_method="fork", dest=tmp_path / "out")
    result = storage[:]
    assert result["obs_mean"].shape == rows.batch_size
    assert torch.equal(result["obs_mean"], rows["observation"].mean(-1))


def test_dest_may_be_an_existing_empty_directory(data, tmp_path):
    (tmp_path / "out").mkdir()
    storage = data.preprocess(ted_features, num_workers=0, dest=tmp_path / "out")
    check_features(storage, data)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith(".")) == []


def test_non_empty_dest_is_refused(data, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not empty"):
        data.preprocess(ted_features, num_workers=0, dest=tmp_path / "out")
    assert os.listdir(tmp_path / "out") == ["keep.txt"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_failing_fn_leaves_nothing(data, tmp_path, num_workers):
    dest = tmp_path / "deep" / "out"

    def bad(td):
        raise RuntimeError("bad transform")

    with pytest.raises(RuntimeError, match="bad transform"):
        data.preprocess(bad, num_workers=num_workers, mp_start_method="fork", dest=dest)
    assert not (tmp_path / "deep").exists()


def test_fn_must_keep_the_batch(data, tmp_path):
    with pytest.raises(ValueError, match="keep the batch size"):
        data.preprocess(wrong_batch, num_workers=0, dest=tmp_path / "out")
    with pytest.raises(TypeError, match="must return a TensorDict"):
        data.preprocess(lambda td: td["observation"], num_workers=0, dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_fn_must_return_the_same_entries_for_every_chunk(data, tmp_path, num_workers):
    def index_chunks(td):
        return td.set("index_in_chunk", torch.arange(td.batch_size[0]))

    staged = data.preprocess(index_chunks, num_workers=0, chunksize=5, dest=tmp_path / "staged")
    dataset = BaseDatasetExperienceReplay(staged[:])
    with pytest.raises(ValueError, match="same entries"):
        dataset.preprocess(unstable_keys, num_workers=num_workers, chunksize=3,
                      mp_start_method="fork", dest=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dim": 1}, ValueError, "dim must be an int in"),
    ({"dim": "0"}, ValueError, "dim must be an int in"),
    ({"num_workers": -1}, ValueError, "num_workers must be >= 0, got -1"),
    ({"chunksize": 0}, ValueError, "chunksize must be >= 1, got 0"),
    ({"num_chunks": 2.5}, TypeError, "num_chunks must be an int or None, got float"),
    ({"chunksize": 2, "num_chunks": 2}, ValueError, "not both"),
    ({"mp_start_method": "threads"}, ValueError, "mp_start_method must be one of"),
    ({"num_frames": 0}, ValueError, "num_frames must be >= 1, got 0"),
])
def test_bad_arguments(data, tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        data.preprocess(ted_features, dest=tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_fn_must_be_callable(data, tmp_path):
    with pytest.raises(TypeError, match="fn must be callable"):
        data.preprocess("not a function", num_workers=0, dest=tmp_path / "out")


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 200), chunksize=st.none() | st.integers(1, 50),
       num_chunks=st.none() | st.integers(1, 50), workers=st.integers(0, 8))
def test_chunk_bounds_cover_the_range_once(size, chunksize, num_chunks, workers):
    if chunksize is not None and num_chunks is not None:
        num_chunks = None
    bounds = chunk_bounds(size, chunksize=chunksize, num_chunks=num_chunks, num_workers=workers)
    assert bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    lengths = [stop - start for start, stop in bounds]
    assert min(lengths) >= 1
    if chunksize is not None:
        assert all(length == chunksize for length in lengths[:-1]) and lengths[-1] <= chunksize
    elif num_chunks is not None:
        assert len(bounds) == min(num_chunks, size) and max(lengths) - min(lengths) <= 1
    else:
        assert len(bounds) == min(4 * max(workers, 1), size)

