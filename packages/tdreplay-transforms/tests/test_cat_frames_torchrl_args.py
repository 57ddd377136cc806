"""CatFrames' TorchRL 0.14 arguments: future windows, mask_key, as_inverse, reset_key,
done_key under "next"; against a step-by-step reference and values from TorchRL 0.14.1."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import CatFrames


def reference_future(obs, done, N, padding, value):
    """obs [T, *feat], done [T] -> ([T, N, *feat] upcoming frames, [T, N] padded mask)."""
    T = obs.shape[0]
    frames, pads = [], []
    for t in range(T):
        end = t
        while end < T - 1 and not done[end]:
            end += 1
        row, pad = [], []
        for k in range(t, t + N):
            if k <= end:
                row.append(obs[k])
            elif padding == "same":
                row.append(obs[end])
            else:
                row.append(torch.full_like(obs[0], value))
            pad.append(k > end)
        frames.append(torch.stack(row))
        pads.append(pad)
    return torch.stack(frames), torch.tensor(pads)


def six_steps() -> TensorDict:
    done = torch.tensor([False, True, False, False, False, False]).unsqueeze(-1)
    return TensorDict({"obs": torch.arange(6.0).unsqueeze(-1), ("next", "done"): done}, [6])


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 4), T=st.integers(1, 9), B=st.integers(1, 3),
       padding=st.sampled_from(["same", "constant"]), seed=st.integers(0, 10_000),
       done_p=st.sampled_from([0.0, 0.3, 0.7]))
def test_future_windows_match_reference(N, T, B, padding, seed, done_p):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, T, 2, generator=g)
    done = torch.rand(B, T, 1, generator=g) < done_p
    td = TensorDict({"obs": obs, ("next", "done"): done}, [B, T])
    out = CatFrames(N, -1, in_keys=["obs"], out_keys=["chunk"], padding=padding,
                    padding_value=-7.0, future=True, mask_key="is_pad")(td)
    assert out["chunk"].shape == (B, T, 2 * N) and out["chunk"].dtype == torch.float32
    assert out["is_pad"].shape == (B, T, N) and out["is_pad"].dtype == torch.bool
    assert torch.equal(out["obs"], obs)
    for b in range(B):
        frames, pads = reference_future(obs[b], done[b, :, 0], N, padding, -7.0)
        assert torch.equal(out["chunk"][b], frames.reshape(T, 2 * N))
        assert torch.equal(out["is_pad"][b], pads)


# TorchRL 0.14.1, CatFrames(3, -1, in_keys=["obs"], out_keys=["s"], padding=...,
# padding_value=-1.0, [future=True,] mask_key="m") on six_steps()
TORCHRL = {
    ("same", True): ([[0, 1, 1], [1, 1, 1], [2, 3, 4], [3, 4, 5], [4, 5, 5], [5, 5, 5]],
                     [[0, 0, 1], [0, 1, 1], [0, 0, 0], [0, 0, 0], [0, 0, 1], [0, 1, 1]]),
    ("constant", True): ([[0, 1, -1], [1, -1, -1], [2, 3, 4], [3, 4, 5], [4, 5, -1],
                          [5, -1, -1]],
                         [[0, 0, 1], [0, 1, 1], [0, 0, 0], [0, 0, 0], [0, 0, 1], [0, 1, 1]]),
    ("same", False): ([[0, 0, 0], [0, 0, 1], [2, 2, 2], [2, 2, 3], [2, 3, 4], [3, 4, 5]],
                      [[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]]),
    ("constant", False): ([[-1, -1, 0], [-1, 0, 1], [-1, -1, 2], [-1, 2, 3], [2, 3, 4],
                           [3, 4, 5]],
                          [[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]]),
}


@pytest.mark.parametrize(("padding", "future"), list(TORCHRL))
def test_values_of_torchrl(padding, future):
    out = CatFrames(3, -1, in_keys=["obs"], out_keys=["s"], padding=padding, padding_value=-1.0,
                    future=future, mask_key="m")(six_steps())
    stacks, mask = TORCHRL[padding, future]
    assert out["s"].tolist() == stacks
    assert out["m"].int().tolist() == mask


def test_future_without_done_takes_each_row_as_one_trajectory():
    td = TensorDict({"obs": torch.arange(8.0).reshape(2, 4, 1)}, [2, 4])
    out = CatFrames(2, -1, in_keys=["obs"], future=True, mask_key="pad")(td)
    assert out["obs"][0].tolist() == [[0, 1], [1, 2], [2, 3], [3, 3]]
    assert out["pad"][1, :, 1].tolist() == [False, False, False, True]
    with pytest.raises(KeyError, match="done"):  # past windows need the boundaries
        CatFrames(2, -1, in_keys=["obs"])(td)


def test_future_stacks_next_entries_on_their_own():
    td = six_steps()
    td["next", "obs"] = td["obs"] + 1
    out = CatFrames(2, -1, in_keys=["obs", ("next", "obs")], future=True)(td)
    assert out["next", "obs"].tolist() == [[1, 2], [2, 2], [3, 4], [4, 5], [5, 6], [6, 6]]


def test_as_inverse_stacks_on_write_and_leaves_samples():
    cat = CatFrames(3, -1, in_keys=["obs"], out_keys=["stack"], as_inverse=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), transform=cat, batch_size=4)
    data = six_steps()
    rb.extend(data)
    assert "stack" not in data.keys()                       # the caller's data is left
    stored = rb.storage[:6]
    assert stored["stack"].tolist() == TORCHRL["same", False][0]
    sample = rb.sample()
    assert torch.equal(sample["stack"], stored["stack"][sample["index"]])  # not restacked
    plain = six_steps()
    assert cat(plain) is plain and "stack" not in plain.keys()
    assert CatFrames(3, -1, in_keys=["obs"]).inv(plain) is plain  # as_inverse=False: no write


def test_reset_key_has_no_effect_in_a_buffer():
    base = CatFrames(3, -1, in_keys=["obs"], out_keys=["s"])(six_steps())
    reset = CatFrames(3, -1, in_keys=["obs"], out_keys=["s"], reset_key="_reset")
    assert reset.reset_key == "_reset"
    assert torch.equal(reset(six_steps())["s"], base["s"])


@pytest.mark.parametrize("done_key", [None, "done", ("next", "done")])
def test_done_key_is_read_under_next(done_key):
    t = CatFrames(3, -1, in_keys=["obs"], out_keys=["s"], done_key=done_key)
    assert t.done_key == ("next", "done")
    assert t(six_steps())["s"].tolist() == TORCHRL["same", False][0]


def test_other_done_key():
    td = six_steps().set(("next", "stop"), torch.zeros(6, 1, dtype=torch.bool))
    out = CatFrames(2, -1, in_keys=["obs"], out_keys=["s"], done_key="stop")(td)
    assert out["s"][2].tolist() == [1.0, 2.0]                # no boundary in ("next", "stop")


def test_positional_arguments_follow_torchrl():
    t = CatFrames(2, -1, ["obs"], ["s"], "constant", -1.0, True, "_reset", "done", True, "m")
    assert (t.as_inverse, t.reset_key, t.done_key, t.future, t.mask_key) == (
        True, "_reset", ("next", "done"), True, "m")


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"future": "yes"}, TypeError, "future"),
    ({"as_inverse": 1}, TypeError, "as_inverse"),
    ({"mask_key": 3}, TypeError, "mask_key"),
    ({"reset_key": 3.0}, TypeError, "reset_key"),
    ({"done_key": ["a", "b"]}, TypeError, "done_key"),
])
def test_bad_arguments_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        CatFrames(2, -1, in_keys=["obs"], **kwargs)


def test_refused_data_is_left_unchanged():
    td = six_steps()
    before = td.clone()
    with pytest.raises(ValueError, match="dim=-2"):
        CatFrames(2, -2, in_keys=["obs"], future=True, mask_key="m", as_inverse=True).inv(td)
    assert set(td.keys(True, True)) == set(before.keys(True, True))
    assert torch.equal(td["obs"], before["obs"])


def test_rb_transform_and_sampler_with_future_windows():
    cat = CatFrames(N=3, dim=-1, in_keys=["obs"], out_keys=["chunk"], future=True,
                    mask_key="pad")
    transform, sampler = cat.make_rb_transform_and_sampler(batch_size=6, traj_key="ep")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler,
                                transform=transform, batch_size=6)
    obs = torch.arange(20.0).unsqueeze(-1)
    done = (torch.arange(20) % 10 == 9).unsqueeze(-1)
    rb.extend(TensorDict({"obs": obs, ("next", "obs"): obs + 1, "ep": torch.arange(20) // 10,
                          ("next", "done"): done}, [20]))
    s = rb.sample()
    assert s["chunk"].shape == (6, 3) and s["pad"].shape == (6, 3)
    assert torch.equal(s["chunk"][:, 0:1], s["obs"])           # the step's upcoming frames
    assert bool((s["chunk"].diff(dim=-1) == 1).all()) and not bool(s["pad"].any())
    assert torch.equal(s["next", "chunk"], s["chunk"] + 1)
