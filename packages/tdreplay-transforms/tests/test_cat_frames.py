"""CatFrames against a step-by-step reference, trajectory boundaries, next keys, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.transforms import CatFrames


def reference_stack(obs, done, N, padding, value):
    """obs [T, *feat], done [T] -> [T, N, *feat] frames, oldest first, step by step."""
    T = obs.shape[0]
    out = []
    start = 0
    for t in range(T):
        if t > 0 and done[t - 1]:
            start = t
        frames = []
        for k in range(t - N + 1, t + 1):
            if k >= start:
                frames.append(obs[k])
            elif padding == "same":
                frames.append(obs[start])
            else:
                frames.append(torch.full_like(obs[0], value))
        out.append(torch.stack(frames))
    return torch.stack(out)


def make_td(batch, T, feat, done_p, seed):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(*batch, T, *feat, generator=g)
    done = torch.rand(*batch, T, 1, generator=g) < done_p
    next_obs = torch.randn(*batch, T, *feat, generator=g)
    return TensorDict({"obs": obs, ("next", "obs"): next_obs, ("next", "done"): done},
                      [*batch, T])


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 4), T=st.integers(1, 9), B=st.integers(1, 3),
       padding=st.sampled_from(["same", "constant"]), seed=st.integers(0, 10_000),
       done_p=st.sampled_from([0.0, 0.3, 0.7]))
def test_matches_reference_on_batched_trajectories(N, T, B, padding, seed, done_p):
    td = make_td([B], T, (2,), done_p, seed)
    obs = td["obs"].clone()
    done = td["next", "done"][..., 0].clone()
    out = CatFrames(N, -1, in_keys=["obs"], padding=padding, padding_value=-7.0)(td)["obs"]
    assert out.shape == (B, T, 2 * N)
    for b in range(B):
        ref = reference_stack(obs[b], done[b], N, padding, -7.0)  # [T, N, 2]
        assert torch.equal(out[b], ref.reshape(T, N * 2))


def test_image_frames_stack_on_channels():
    td = make_td([], 6, (3, 4, 5), 0.2, 0)
    obs = td["obs"].clone()
    done = td["next", "done"][..., 0]
    out = CatFrames(4, -3, in_keys=["obs"], out_keys=["stacked"])(td)
    assert out["stacked"].shape == (6, 12, 4, 5)
    ref = reference_stack(obs, done, 4, "same", 0.0)  # [T, 4, 3, 4, 5]
    assert torch.equal(out["stacked"], ref.reshape(6, 12, 4, 5))
    assert torch.equal(out["obs"], obs)  # written to out_keys only


def test_flat_batch_of_slices_respects_slice_ends():
    # two slices of 3 steps from different trajectories, flattened: the first ends "truncated"
    obs = torch.arange(6.0).unsqueeze(-1)
    done = torch.tensor([False, False, True, False, False, True]).unsqueeze(-1)
    td = TensorDict({"obs": obs, ("next", "done"): done}, [6])
    out = CatFrames(2, -1, in_keys=["obs"])(td)["obs"]
    assert out.tolist() == [[0, 0], [0, 1], [1, 2], [3, 3], [3, 4], [4, 5]]


def test_next_stack_is_the_stack_of_the_following_step():
    T, N = 7, 3
    obs = torch.arange(T + 0.0).unsqueeze(-1)
    next_obs = obs + 1
    done = torch.tensor([False, False, True, False, False, False, False]).unsqueeze(-1)
    next_obs[2] = 100.0  # terminal observation of the first trajectory
    td = TensorDict({"obs": obs, ("next", "obs"): next_obs, ("next", "done"): done}, [T])
    for padding in ("same", "constant"):
        out = CatFrames(N, -1, in_keys=["obs", ("next", "obs")], padding=padding)(td.clone())
        for t in range(T - 1):
            if not done[t]:
                assert torch.equal(out["next", "obs"][t], out["obs"][t + 1])
        assert out["next", "obs"][2].tolist()[-1] == 100.0
    out = CatFrames(N, -1, in_keys=["obs", ("next", "obs")])(td.clone())
    assert out["next", "obs"][0].tolist() == [0.0, 0.0, 1.0]
    assert out["next", "obs"][2].tolist() == [1.0, 2.0, 100.0]
    assert out["next", "obs"][3].tolist() == [3.0, 3.0, 4.0]


def test_custom_done_key_and_nested_in_key():
    td = TensorDict({("agent", "obs"): torch.arange(4.0).unsqueeze(-1),
                     ("next", "truncated"): torch.tensor([True, False, False, False])}, [4])
    out = CatFrames(2, -1, in_keys=[("agent", "obs")], done_key=("next", "truncated"))(td)
    assert out["agent", "obs"].tolist() == [[0, 0], [1, 1], [1, 2], [2, 3]]


def test_errors_name_the_key():
    td = make_td([2], 4, (3,), 0.2, 0)
    with pytest.raises(KeyError, match="key .*pixels.* is missing"):
        CatFrames(2, -1)(td)
    with pytest.raises(KeyError, match="done"):
        CatFrames(2, -1, in_keys=["obs"])(td.exclude(("next", "done")))
    with pytest.raises(ValueError, match="not a feature dimension of entry 'obs'"):
        CatFrames(2, -2, in_keys=["obs"])(td)
    with pytest.raises(ValueError, match="negative"):
        CatFrames(2, 0)
    with pytest.raises(ValueError, match="padding"):
        CatFrames(2, -1, padding="reflect")
    with pytest.raises(ValueError, match="same length"):
        CatFrames(2, -1, in_keys=["a", "b"], out_keys=["c"])
    with pytest.raises(ValueError, match="time dimension"):
        CatFrames(2, -1, in_keys=["obs"])(td[0, 0])


class TestMakeRbTransformAndSampler:
    @staticmethod
    def episodes() -> TensorDict:
        obs = torch.arange(20.0).unsqueeze(-1)
        done = (torch.arange(20) % 10 == 9).unsqueeze(-1)
        return TensorDict({"obs": obs, ("next", "obs"): obs + 1, "ep": torch.arange(20) // 10,
                           ("next", "done"): done}, [20])

    def test_samples_stacks_and_stores_frames(self):
        from tdreplay.core import TensorDictReplayBuffer
        from tdreplay.samplers import SliceSampler
        from tdreplay.storages import LazyTensorStorage

        cat = CatFrames(N=3, dim=-1, in_keys=["obs"], out_keys=["stack"])
        transform, sampler = cat.make_rb_transform_and_sampler(batch_size=5, traj_key="ep")
        assert isinstance(sampler, SliceSampler) and sampler.slice_len == 3
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler,
                                    transform=transform, batch_size=5)
        rb.extend(self.episodes().set("stack", torch.zeros(20, 3)))
        assert "stack" not in rb.storage[0].keys()          # stacks never stored
        s = rb.sample()
        assert s.batch_size == (5,)
        stack, nxt = s["stack"], s["next", "stack"]
        assert stack.shape == (5, 3) and stack.dtype == torch.float32
        assert torch.equal(stack[:, -1:], s["obs"])
        assert (stack.diff(dim=-1) == 1).all()              # consecutive frames of one episode
        assert torch.equal(nxt[:, :-1], stack[:, 1:]) and torch.equal(nxt[:, -1:], s["next", "obs"])
        assert torch.equal(s["ep"], s["obs"].squeeze(-1).long() // 10)

    def test_without_replacement_and_bad_kwargs(self):
        from tdreplay.transforms.frame_sampler import (
            FrameStackSliceSampler,
            FrameStackSliceSamplerWithoutReplacement,
        )

        cat = CatFrames(N=2, dim=-1, in_keys=["obs"])
        transform, sampler = cat.make_rb_transform_and_sampler(4, traj_key="ep",
                                                               replacement=False)
        assert isinstance(sampler, FrameStackSliceSamplerWithoutReplacement)
        assert len(transform) == 1                           # in_keys == out_keys: nothing dropped
        with pytest.raises(TypeError, match="slice_len"):
            cat.make_rb_transform_and_sampler(4, slice_len=3)
        with pytest.raises(ValueError, match="frames"):
            FrameStackSliceSampler(0)

    def test_transform_needs_whole_windows(self):
        transform, _ = CatFrames(N=3, dim=-1, in_keys=["obs"]).make_rb_transform_and_sampler(1)
        with pytest.raises(ValueError, match="multiple of N=3"):
            transform(self.episodes()[:4])


@pytest.mark.parametrize("replacement", [True, False])
def test_frame_stack_sampler_refuses_slices_shorter_than_a_stack(replacement):
    # strict_length=False let a short trajectory give a short slice, and a sample then failed
    # at random in the stacking transform (as in TorchRL); it is refused when built
    cat = CatFrames(3, -1, in_keys=["obs"], out_keys=["stack"])
    with pytest.raises(ValueError, match="strict_length=True"):
        cat.make_rb_transform_and_sampler(traj_key="ep", strict_length=False,
                                          replacement=replacement)
    _, sampler = cat.make_rb_transform_and_sampler(traj_key="ep", strict_length=True,
                                                   replacement=replacement)
    assert sampler.frames == 3 and sampler.slice_len == 3


@pytest.mark.parametrize("span", [True, (True, False), (False, True), 1])
@pytest.mark.parametrize("replacement", [True, False])
def test_frame_stack_sampler_refuses_span(span, replacement):
    # (span drew slices cut short at an episode's ends: 67-76% of samples raised in the
    # stacking transform, and the rest held wrong stacks regrouped across slices)
    cat = CatFrames(4, -1, in_keys=["obs"], out_keys=["stack"])
    with pytest.raises(ValueError, match=r"takes no span.*first frames - 1 steps are never"):
        cat.make_rb_transform_and_sampler(traj_key="ep", span=span, replacement=replacement)
    for no_span in (False, (False, False)):
        _, sampler = cat.make_rb_transform_and_sampler(traj_key="ep", span=no_span,
                                                       replacement=replacement)
        assert sampler.slice_len == 4
