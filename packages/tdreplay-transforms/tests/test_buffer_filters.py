"""NextStateReconstructor and PolicyAgeFilter, alone and in buffers."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import SliceSampler
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import NextStateReconstructor, PolicyAgeFilter

TRAJ = ("collector", "traj_ids")


def trajectories(n_traj: int = 3, length: int = 4) -> TensorDict:
    n = n_traj * length
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[length - 1::length] = True
    return TensorDict({"observation": torch.arange(n * 2.0).reshape(n, 2),
                       ("next", "done"): done,
                       TRAJ: torch.arange(n_traj).repeat_interleave(length)}, [n])


class TestNextStateReconstructor:
    def test_values_dtype_and_boundaries(self):
        td = trajectories(2, 3)
        out = NextStateReconstructor()(td)
        nxt = out["next", "observation"]
        assert nxt.shape == (6, 2) and nxt.dtype == torch.float32
        for i in (0, 1, 3, 4):
            assert torch.equal(nxt[i], td["observation"][i + 1])
        assert torch.isnan(nxt[[2, 5]]).all()

    def test_slice_sampler_buffer(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(12),
                          sampler=SliceSampler(slice_len=4, traj_key=TRAJ),
                          transform=NextStateReconstructor(fill_value=-1.0), batch_size=8)
        rb.extend(trajectories())
        s = rb.sample()
        nxt, obs = s["next", "observation"], s["observation"]
        for start in (0, 4):
            assert torch.equal(nxt[start:start + 3], obs[start + 1:start + 4])
            assert (nxt[start + 3] == -1).all()

    def test_done_splits_same_trajectory(self):
        td = TensorDict({"observation": torch.arange(4.0).unsqueeze(-1),
                         TRAJ: torch.zeros(4, dtype=torch.long),
                         ("next", "done"): torch.tensor([False, True, False, False])}, [4])
        nxt = NextStateReconstructor()(td)["next", "observation"].squeeze(-1)
        assert nxt[0] == 1 and torch.isnan(nxt[1]) and nxt[2] == 3 and torch.isnan(nxt[3])

    def test_step_count_and_integer_fill(self):
        td = TensorDict({"observation": torch.arange(4).unsqueeze(-1),
                         ("s",): torch.tensor([0, 2, 3, 4])}, [4])
        t = NextStateReconstructor(traj_key=None, done_key=None, step_count_key="s",
                                   fill_value=-7)
        nxt = t(td)["next", "observation"].squeeze(-1)
        assert nxt.dtype == torch.int64 and nxt.tolist() == [-7, 2, 3, -7]
        with pytest.raises(TypeError, match="non-floating"):
            NextStateReconstructor(traj_key=None, done_key=None)(td)

    def test_strictness_and_errors(self):
        td = TensorDict({"observation": torch.zeros(3, 1)}, [3])
        with pytest.raises(KeyError, match="trajectory key"):
            NextStateReconstructor()(td.clone())
        out = NextStateReconstructor(strict=False)(td.clone())
        assert torch.isnan(out["next", "observation"][-1]).all()
        with pytest.raises(ValueError, match="flat"):
            NextStateReconstructor()(TensorDict({"observation": torch.zeros(2, 3)}, [2, 3]))
        with pytest.raises(TypeError, match="fill_value"):
            NextStateReconstructor(fill_value="x")
        with pytest.raises(ValueError, match="keys"):
            NextStateReconstructor(keys=[])
        with pytest.raises(KeyError, match="missing"):
            NextStateReconstructor(keys=["missing"], traj_key=None, done_key=None)(td)

    def test_empty_and_single_row(self):
        t = NextStateReconstructor(traj_key=None, done_key=None)
        assert t(TensorDict({"observation": torch.zeros(0, 2)}, [0])).batch_size == (0,)
        one = t(TensorDict({"observation": torch.zeros(1, 2)}, [1]))
        assert torch.isnan(one["next", "observation"]).all()


def stamped(versions: list[int]) -> TensorDict:
    v = torch.tensor(versions)
    return TensorDict({"obs": torch.arange(len(versions)), "policy_version": v}, [len(v)])


class TestPolicyAgeFilter:
    def test_filters_writes_and_samples(self):
        now = {"v": 3}
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=8,
                                    transform=PolicyAgeFilter(lambda: now["v"], 1))
        rb.extend(stamped([0, 2, 2, 3]))
        assert len(rb) == 3
        now["v"] = 4
        s = rb.sample()
        assert (s["policy_version"] == 3).all() and s["index"].shape == s.batch_size
        now["v"] = 10
        assert rb.sample().batch_size == (0,)

    def test_rows_use_oldest_and_nested_key(self):
        td = TensorDict({("meta", "v"): torch.tensor([[5, 5], [5, 2]])}, [2, 2])
        out = PolicyAgeFilter(5, 2, policy_version_key=("meta", "v"))(td)
        assert out.batch_size == (1, 2)

    def test_all_stale_write_writes_nothing(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=PolicyAgeFilter(9, 0))
        rb.extend(stamped([1, 2]))
        assert len(rb) == 0

    def test_missing_key(self):
        td = TensorDict({"obs": torch.zeros(2)}, [2])
        with pytest.warns(UserWarning, match="policy_version"):
            assert PolicyAgeFilter(0, 0)(td) is td
        with pytest.raises(KeyError, match="PolicyAgeFilter"):
            PolicyAgeFilter(0, 0, strict=True)(td)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="max_policy_lag must be >= 0, got -1"):
            PolicyAgeFilter(3, -1)
        with pytest.raises(TypeError, match="current_version"):
            PolicyAgeFilter("3", 1)
        with pytest.raises(TypeError, match="max_policy_lag"):
            PolicyAgeFilter(3, 1.5)


@pytest.mark.parametrize("buffer_cls", [ReplayBuffer, TensorDictReplayBuffer])
def test_add_of_a_stale_item_writes_nothing(buffer_cls):
    from tdreplay.core import Compose

    version = {"now": 5}
    rb = buffer_cls(storage=LazyTensorStorage(4),
                    transform=Compose(PolicyAgeFilter(lambda: version["now"], max_policy_lag=1),
                                      lambda td: td))
    slots = rb.add(TensorDict({"policy_version": torch.tensor(0), "x": torch.tensor(1.0)}, []))
    assert len(rb) == 0 and rb.write_count == 0
    assert slots.shape == (0, 1) and slots.dtype == torch.long  # as TorchRL's
    assert rb.add(TensorDict({"policy_version": torch.tensor(4), "x": torch.tensor(2.0)}, [])) == 0
    assert rb[:]["x"].tolist() == [2.0]
    version["now"] = 9
    # a read of one item is never dropped (only writes and samples are filtered)
    assert rb.storage[0]["x"].item() == 2.0


def test_policy_age_filter_cannot_be_appended_inverted():
    # (its forward ran on writes and let a stale item that add wrote through; as the
    # buffer's transform its inv filters the writes, items included)
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    with pytest.raises(ValueError, match="invert=True: PolicyAgeFilter already works on the "
                                         "write side"):
        rb.append_transform(PolicyAgeFilter(current_version=10, max_policy_lag=2), invert=True)
    rb.append_transform(PolicyAgeFilter(current_version=10, max_policy_lag=2))
    assert rb.add(TensorDict({"policy_version": torch.tensor(1), "x": torch.tensor(1.0)},
                             [])).shape == (0, 1)
    assert len(rb) == 0


def test_one_stale_row_read_by_index_is_returned():
    # (a read of one item is never filtered: rb[i] returned None while forward was inv)
    version = {"now": 5}
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
                                transform=PolicyAgeFilter(lambda: version["now"], 1))
    rb.add(TensorDict({"policy_version": torch.tensor(5), "x": torch.tensor(1.0)}, []))
    version["now"] = 9
    assert rb[0]["x"].item() == 1.0


def test_next_state_of_a_random_sample_is_rebuilt_only_from_the_following_slot():
    # (index_key: without it, rows of one trajectory drawn back to back pass the checks)
    # one trajectory of 64 steps, observation = step: a random sample draws rows of the same
    # trajectory one after another that are not consecutive steps
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), batch_size=32,
                                transform=NextStateReconstructor(index_key="index"),
                                generator=torch.Generator().manual_seed(0))
    rb.extend(TensorDict({"observation": torch.arange(64.0).unsqueeze(-1),
                          ("collector", "traj_ids"): torch.zeros(64, dtype=torch.long),
                          ("next", "done"): torch.zeros(64, 1, dtype=torch.bool)}, [64]))
    for _ in range(5):
        sample = rb.sample()
        obs, nxt = sample["observation"][:, 0], sample["next", "observation"][:, 0]
        follows = torch.zeros(32, dtype=torch.bool)
        follows[:-1] = sample["index"][1:] == sample["index"][:-1] + 1
        assert torch.equal(nxt[follows], obs[follows] + 1)
        assert nxt[~follows].isnan().all()


def test_next_state_with_the_slot_stride_of_a_two_dim_storage():
    # 2 environments, 10 steps each, stored [T, 2]: the next step is 2 slots on
    obs = torch.arange(20.0).reshape(2, 10, 1)
    done = torch.zeros(2, 10, 1, dtype=torch.bool)
    done[:, -1] = True
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(40, ndim=2), batch_size=8,
        sampler=SliceSampler(num_slices=2, traj_key=("collector", "traj_ids")),
        transform=NextStateReconstructor(index_key="index", slot_stride=2),
        generator=torch.Generator().manual_seed(0))
    rb.extend(TensorDict({"observation": obs, ("next", "done"): done,
                          ("collector", "traj_ids"): torch.arange(2).unsqueeze(-1).expand(2, 10)},
                         [2, 10]))
    sample = rb.sample()
    obs, nxt = sample["observation"][:, 0], sample["next", "observation"][:, 0]
    within = torch.ones(8, dtype=torch.bool)
    within[[3, 7]] = False  # the last step of each slice of 4
    assert torch.equal(nxt[within], obs[within] + 1) and nxt[~within].isnan().all()
    with pytest.raises(ValueError, match="slot_stride"):
        NextStateReconstructor(slot_stride=0)
