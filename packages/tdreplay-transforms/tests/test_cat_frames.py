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


def test_next_stack_holds_the_stored_next_frames_as_torchrl():
    # ("next", "obs") differs from the following "obs" (obs + 0.5); episodes [0..2], [3..7].
    # Expected values are TorchRL 0.14.1's outputs for the same data.
    obs = torch.arange(100.0, 108.0).unsqueeze(-1)
    done = torch.tensor([0, 0, 1, 0, 0, 0, 0, 1], dtype=torch.bool).unsqueeze(-1)
    td = TensorDict({"obs": obs, ("next", "obs"): obs + 0.5, ("next", "done"): done}, [8])
    expected = {
        "same": [[100.0, 100.0, 100.5], [100.0, 100.5, 101.5], [100.5, 101.5, 102.5],
                 [103.0, 103.0, 103.5], [103.0, 103.5, 104.5], [103.5, 104.5, 105.5],
                 [104.5, 105.5, 106.5], [105.5, 106.5, 107.5]],
        "constant": [[-1.0, 100.0, 100.5], [100.0, 100.5, 101.5], [100.5, 101.5, 102.5],
                     [-1.0, 103.0, 103.5], [103.0, 103.5, 104.5], [103.5, 104.5, 105.5],
                     [104.5, 105.5, 106.5], [105.5, 106.5, 107.5]],
    }
    for padding, exp in expected.items():
        out = CatFrames(3, -1, in_keys=["obs", ("next", "obs")], out_keys=["s", ("next", "s")],
                        padding=padding, padding_value=-1.0)(td.clone())
        assert out["next", "s"].tolist() == exp
    out = CatFrames(4, -1, in_keys=["obs", ("next", "obs")], out_keys=["s", ("next", "s")],
                    padding="constant", padding_value=-1.0)(td.clone())
    assert out["next", "s"][:3].tolist() == [[-1.0, -1.0, 100.0, 100.5],
                                             [-1.0, 100.0, 100.5, 101.5],
                                             [100.0, 100.5, 101.5, 102.5]]


def test_unfolding_with_given_ends():
    td = TensorDict({"obs": torch.arange(4.0).unsqueeze(-1),
                     ("next", "done"): torch.ones(4, 1, dtype=torch.bool)}, [4])
    cat = CatFrames(2, -1, in_keys=["obs"], out_keys=["s"])
    ends = torch.tensor([False, False, True, False])  # overrides the stored done flags
    assert cat.unfolding(td, ends)["s"].tolist() == [[0, 0], [0, 1], [1, 2], [3, 3]]
    assert cat.unfolding(td)["s"].tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    for bad in (ends.float(), ends[:3], ends.tolist()):
        with pytest.raises(ValueError, match="ends must be a bool tensor"):
            cat.unfolding(td, bad)
    with pytest.raises(ValueError, match="time dimension"):
        cat.unfolding(td[0], torch.tensor(False))


def _flag_episodes(T: int = 4, E: int = 6) -> TensorDict:
    # E episodes of T steps: each ends done, alternately terminated and truncated
    step = torch.arange(E * T) % T
    ep = torch.arange(E * T) // T
    end = (step == T - 1).unsqueeze(-1)
    term = end & (ep % 2 == 0).unsqueeze(-1)
    obs = torch.arange(E * T, dtype=torch.float32).unsqueeze(-1)
    return TensorDict({"obs": obs, ("next", "obs"): obs + 0.5, "ep": ep,
                       "is_init": (step == 0).unsqueeze(-1), ("next", "done"): end,
                       ("next", "terminated"): term, ("next", "truncated"): end & ~term},
                      [E * T])


@pytest.mark.parametrize("buffer", ["ReplayBuffer", "TensorDictReplayBuffer"])
@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("N", [1, 3])
def test_rb_samples_carry_the_stored_flags(buffer, replacement, N):
    # the sampler's slices are windows of frames: their last step is no truncation and their
    # first no reset, so the kept steps keep their stored done / terminated / truncated /
    # is_init (TensorDictReplayBuffer marked every kept step done and truncated)
    import tdreplay.core as core
    from tdreplay.storages import LazyTensorStorage

    data = _flag_episodes()
    transform, sampler = CatFrames(N, -1, in_keys=["obs"], out_keys=["stack"]
                                   ).make_rb_transform_and_sampler(8, traj_key="ep",
                                                                   replacement=replacement)
    assert sampler.truncated_key is None and sampler.init_key is None
    rb = getattr(core, buffer)(storage=LazyTensorStorage(24), sampler=sampler,
                               transform=transform, batch_size=8)
    rb.extend(data)
    seen = set()
    for _ in range(6):
        s = rb.sample()
        i = s["obs"].squeeze(-1).long()                      # obs is the storage slot
        assert torch.equal(s["stack"][:, -1], data["obs"][i, 0])
        for key in ("is_init", ("next", "done"), ("next", "terminated"), ("next", "truncated")):
            assert torch.equal(s[key], data[key][i]), key
        seen.update(zip(s["next", "done"].flatten().tolist(), s["is_init"].flatten().tolist()))
    # both stored values were drawn: kept steps that end an episode and (N=1) that start one
    assert {d for d, _ in seen} == {False, True}
    assert {r for _, r in seen} == ({False, True} if N == 1 else {False})


def test_frame_stack_sampler_refuses_truncation_and_reset_marks():
    from tdreplay.transforms.frame_sampler import FrameStackSliceSampler

    cat = CatFrames(2, -1, in_keys=["obs"])
    for name in ("truncated_key", "init_key"):
        with pytest.raises(ValueError, match=f"takes no {name}.*windows of frames"):
            cat.make_rb_transform_and_sampler(traj_key="ep", **{name: ("next", "truncated")})
        _, sampler = cat.make_rb_transform_and_sampler(traj_key="ep", **{name: None})
        assert getattr(sampler, name) is None
    with pytest.raises(ValueError, match="takes no truncated_key"):
        FrameStackSliceSampler(2, truncated_key="truncated")


@pytest.mark.parametrize("buffer", ["ReplayBuffer", "TensorDictReplayBuffer"])
def test_rb_transform_and_sampler_without_stored_done(buffer):
    # the sampler's windows lie in one trajectory each: no done entry is needed to stack them
    import tdreplay.core as core
    from tdreplay.storages import LazyTensorStorage

    data = _flag_episodes().exclude(("next", "done"), ("next", "terminated"),
                                    ("next", "truncated"), "is_init")
    transform, sampler = CatFrames(3, -1, in_keys=["obs"], out_keys=["stack"]
                                   ).make_rb_transform_and_sampler(6, traj_key="ep")
    rb = getattr(core, buffer)(storage=LazyTensorStorage(24), sampler=sampler,
                               transform=transform, batch_size=6)
    rb.extend(data)
    s = rb.sample()
    assert ("next", "done") not in s.keys(True)
    last = s["obs"]
    assert torch.equal(s["stack"], torch.cat([last - 2, last - 1, last], -1))
    assert torch.equal(s["next", "stack"], torch.cat([last - 1.5, last - 0.5, last + 0.5], -1))


def test_rb_next_stack_holds_the_stored_next_frames():
    # TorchRL 0.14.1 gives [[100.5, 101.5, 102.5]] for this sample (tdreplay gave
    # [[101.0, 102.0, 102.5]]: obs[t-1], obs[t], next_obs[t])
    from tdreplay.core import ReplayBuffer
    from tdreplay.storages import LazyTensorStorage

    obs = torch.arange(100.0, 106.0).unsqueeze(-1)
    data = TensorDict({"obs": obs, ("next", "obs"): obs + 0.5,
                       ("next", "done"): torch.zeros(6, 1, dtype=torch.bool),
                       "episode": torch.zeros(6, dtype=torch.long)}, [6])
    cat = CatFrames(N=3, dim=-1, in_keys=["obs"], out_keys=["st"], reset_key="_reset")
    t, s = cat.make_rb_transform_and_sampler(batch_size=3, traj_key="episode")
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=s, transform=t, batch_size=3)
    rb.extend(data)
    r = rb[0:3]
    assert r["st"].tolist() == [[100.0, 101.0, 102.0]]
    assert r["next", "st"].tolist() == [[100.5, 101.5, 102.5]]


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
