"""Reward2GoTransform: the discounted reward-to-go written on extend, as TorchRL's."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import Reward2GoTransform
from tdreplay.transforms.reward_to_go import reward_to_go


def _episodes(reward: list[list[float]], done: list[list[int]]) -> TensorDict:
    r = torch.tensor(reward).unsqueeze(-1)
    d = torch.tensor(done, dtype=torch.bool).unsqueeze(-1)
    return TensorDict({"obs": torch.arange(r.numel()).reshape(r.shape[:2]),
                       "next": {"reward": r, "done": d}}, list(r.shape[:2]))


def _by_hand(reward: list[float], done: list[int], gamma: float) -> list[float]:
    out, running = [], 0.0
    for r, d in zip(reversed(reward), reversed(done)):
        running = r + gamma * running * (1 - d)
        out.append(running)
    return out[::-1]


def test_each_row_is_summed_back_to_its_episode_end_and_cut_at_the_rows_end():
    reward = [[1.0, 2.0, 3.0, 4.0, 5.0], [0.5, -1.0, 2.0, 0.0, 1.0]]
    done = [[0, 1, 0, 0, 1], [1, 0, 0, 1, 0]]  # row 1 ends with an unfinished episode
    rb = ReplayBuffer(storage=LazyTensorStorage(10),
                      transform=Reward2GoTransform(gamma=0.9, out_keys=["r2g"]))
    rb.extend(_episodes(reward, done))
    stored = rb[:]["r2g"].squeeze(-1)
    for row in range(2):
        expected = torch.tensor(_by_hand(reward[row], done[row], 0.9))
        torch.testing.assert_close(stored[row], expected)
    assert stored[1, 4] == 1.0  # the cut tail: its own reward only
    torch.testing.assert_close(rb[:]["next", "reward"].squeeze(-1), torch.tensor(reward))


def test_default_keys_overwrite_the_reward_and_a_1d_batch_is_one_run():
    td = _episodes([[1.0, 1.0, 1.0, 1.0]], [[0, 0, 0, 1]])[0]  # a [4] batch: one episode
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=Reward2GoTransform(gamma=0.5))
    rb.extend(td)
    assert rb[:]["next", "reward"].squeeze(-1).tolist() == [1.875, 1.75, 1.5, 1.0]
    assert td["next", "reward"].squeeze(-1).tolist() == [1.0] * 4  # the caller's data as given


def test_samples_are_left_as_stored():
    r2g = Reward2GoTransform(gamma=1.0, out_keys=["r2g"])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), transform=r2g, batch_size=2)
    rb.extend(_episodes([[1.0, 2.0], [3.0, 4.0]], [[0, 1], [1, 1]]))
    sample = rb.sample()
    stored = {int(i): v for i, v in zip(sample["index"][:, 0], sample["r2g"].squeeze(-1).tolist())}
    expected = {0: [3.0, 2.0], 1: [3.0, 4.0]}
    assert all(stored[i] == expected[i] for i in stored)


def test_add_writes_the_reward_to_go_of_one_episode():
    rb = ReplayBuffer(storage=LazyTensorStorage(4),
                      transform=Reward2GoTransform(gamma=1.0, out_keys=["r2g"]))
    with pytest.warns(UserWarning, match="one item"):
        rb.add(_episodes([[1.0, 2.0, 3.0]], [[0, 0, 1]])[0])
    assert rb[0]["r2g"].squeeze(-1).tolist() == [6.0, 5.0, 3.0]


def test_custom_done_key_and_integer_rewards():
    td = TensorDict({"next": {"agent": {"done": torch.tensor([[False], [True]])},
                              "reward": torch.tensor([[2], [3]])}}, [2])
    out = Reward2GoTransform(gamma=0.5, done_key=("agent", "done")).inv(td)
    assert out["next", "reward"].dtype == torch.get_default_dtype()
    assert out["next", "reward"].squeeze(-1).tolist() == [3.5, 3.0]


def test_gamma_zero_keeps_each_reward_and_a_tensor_gamma_is_taken():
    reward = torch.tensor([[1.0], [2.0], [3.0]])
    done = torch.tensor([[False], [False], [True]])
    assert reward_to_go(reward, done, 0.0).squeeze(-1).tolist() == [1.0, 2.0, 3.0]
    assert Reward2GoTransform(gamma=torch.tensor(0.25)).gamma == 0.25


def test_a_run_without_an_episode_end_is_refused_and_nothing_is_written():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), transform=Reward2GoTransform())
    rb.extend(_episodes([[1.0, 1.0]], [[0, 1]]))
    with pytest.raises(RuntimeError, match="no episode end"):
        rb.extend(_episodes([[1.0, 1.0], [1.0, 1.0]], [[0, 1], [0, 0]]))
    assert len(rb) == 1 and rb.write_count == 1


def test_missing_entries_and_mismatched_shapes_are_refused_naming_them():
    t = Reward2GoTransform(in_keys=["r"])
    td = _episodes([[1.0, 1.0]], [[0, 1]])
    with pytest.raises(KeyError, match="'r'"):
        t.inv(td)
    with pytest.raises(KeyError, match="done"):
        Reward2GoTransform().inv(td.exclude(("next", "done")))
    td.set(("next", "done"), torch.tensor([[True, True]]))  # [1, 2], the reward is [1, 2, 1]
    with pytest.raises(ValueError, match="same shape"):
        Reward2GoTransform().inv(td)
    with pytest.raises(TypeError, match="TensorDict"):
        Reward2GoTransform().inv(torch.ones(3))


@pytest.mark.parametrize("gamma, error", [(-0.1, ValueError), (1.5, ValueError),
                                          (float("nan"), ValueError), ("0.9", TypeError),
                                          (True, TypeError), (torch.ones(2), TypeError)])
def test_gamma_outside_zero_one_is_refused(gamma, error):
    with pytest.raises(error, match="gamma"):
        Reward2GoTransform(gamma=gamma)


def test_an_inverted_reward_to_go_is_refused():
    # (append_transform(r2g, invert=True) was taken: each sample's rewards-to-go were computed
    # over its random rows as if they were one episode; TorchRL refuses it with a ValueError)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), batch_size=4)
    with pytest.raises(ValueError, match="invert=True: Reward2GoTransform already works on "
                                         "the write side"):
        rb.append_transform(Reward2GoTransform(gamma=0.5, out_keys=["r2g"]), invert=True)
    assert len(rb.transform) == 0
