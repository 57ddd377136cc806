"""MultiStep and CatFrames as a buffer's own transforms see the slice ends of a SliceSampler."""

import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import SliceSampler
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import CatFrames, MultiStep

T = 40  # 4 trajectories of 10 steps


def _data() -> TensorDict:
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[9::10] = True
    return TensorDict({
        "obs": torch.arange(T).float().unsqueeze(-1),
        "traj": torch.arange(T) // 10,
        "next": {"obs": torch.arange(1, T + 1).float().unsqueeze(-1), "reward": torch.ones(T, 1),
                 "done": done, "terminated": done.clone(),
                 "truncated": torch.zeros(T, 1, dtype=torch.bool)},
    }, [T])


def _buffer(transform) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(T),
                                sampler=SliceSampler(slice_len=4, traj_key="traj"),
                                transform=transform, batch_size=12,
                                generator=torch.Generator().manual_seed(0))
    rb.extend(_data())
    return rb


def test_multistep_in_the_sample_path_stops_at_slice_ends():
    rb = _buffer(MultiStep(gamma=1.0, n_steps=3))
    for _ in range(30):
        sample = rb.sample()
        obs = sample["obs"].view(3, 4)
        next_obs = sample["next", "obs"].view(3, 4)
        reward = sample["next", "reward"].view(3, 4)
        # the n-step target never reaches past the slice: the last step's is its own next obs
        assert (next_obs[:, -1] == obs[:, -1] + 1).all()
        assert (next_obs <= obs[:, -1:] + 1).all()
        assert (reward[:, -1] == 1).all()
        assert (reward == torch.clamp(next_obs - obs, max=3)).all()


def test_catframes_in_the_sample_path_pads_at_slice_starts():
    rb = _buffer(CatFrames(N=2, dim=-1, in_keys=["obs"]))
    for _ in range(30):
        sample = rb.sample()
        frames = sample["obs"].view(3, 4, 2)
        # the first step of each slice is padded with itself, never with another slice's frame
        assert (frames[:, 0, 0] == frames[:, 0, 1]).all()
        assert (frames[:, 1:, 0] == frames[:, 1:, 1] - 1).all()
