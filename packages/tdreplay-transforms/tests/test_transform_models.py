"""Values of the ``tdreplay.transforms`` transforms against plain Python reference models.

Seeded random data (random done / terminated / truncated flags, several trajectories per
batch, 1- and 2-dim batches) goes through ``MultiStep`` and ``CatFrames`` (directly, as a
buffer transform with a ``SliceSampler``, and via ``make_rb_transform_and_sampler``), and
every output entry is compared with a loop written from the docstrings and
docs/guides/writers_transforms.rst / migrating.rst. The element-wise transforms are compared
with their docstring formulas and with TorchRL 0.14.1's outputs on the same inputs, recorded
here as literals (TorchRL is not needed to run these tests).
"""

from __future__ import annotations

import random

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.samplers import SliceSampler
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import (
    BinarizeReward,
    CatFrames,
    CenterCrop,
    DiscreteActionProjection,
    DoubleToFloat,
    FiniteTensorDictCheck,
    FlattenObservation,
    GrayScale,
    MultiStep,
    ObservationNorm,
    RewardClipping,
    RewardScaling,
    SqueezeTransform,
    UnsqueezeTransform,
)

DONE_KEYS = ("done", "terminated", "truncated")


# ------------------------------------------------------------------------------------------
# MultiStep
# ------------------------------------------------------------------------------------------
def _random_traj(g: torch.Generator, batch: tuple[int, ...], trailing: bool, p: float,
                 keys: tuple[str, ...] = DONE_KEYS) -> TensorDict:
    shape = (*batch, 1) if trailing else batch
    obs = torch.randn(*batch, 2, generator=g)
    td = TensorDict({
        "obs": obs,
        "action": torch.randn(*batch, 1, generator=g),
        "next": {
            "obs": torch.randn(*batch, 2, generator=g),
            "reward": torch.randn(*shape, generator=g),
            "info": torch.randint(0, 100, (*batch, 3), generator=g),
        },
    }, list(batch))
    for k in keys:
        td["next", k] = torch.rand(*shape, generator=g) < p
    return td


def _multistep_model(td: TensorDict, gamma: float, n: int) -> dict:
    """Plain loops over the flattened leading batch dims and time."""
    batch = td.batch_size
    T = batch[-1]
    flat = td.reshape(-1, T)
    present = [k for k in DONE_KEYS if ("next", k) in flat.keys(True)]
    out: dict = {"reward": [], "steps": [], "gamma": [], "next": {}}
    next_keys = [k for k in flat["next"].keys(True, True) if k != "reward"]
    for k in next_keys:
        out["next"][k] = []
    for b in range(flat.batch_size[0]):
        last = [any(bool(flat["next", k][b, t].any()) for k in present) or t == T - 1
                for t in range(T)]
        rew, steps, gam = [], [], []
        for k in next_keys:
            out["next"][k].append([])
        for t in range(T):
            end = t
            while not last[end]:
                end += 1
            m = min(n, end - t + 1)
            rew.append(sum(gamma ** j * flat["next", "reward"][b, t + j].double()
                           for j in range(m)))
            steps.append(m)
            gam.append(gamma ** m)
            for k in next_keys:
                out["next"][k][-1].append(flat["next", k][b, t + m - 1])
        out["reward"].append(torch.stack(rew))
        out["steps"].append(steps)
        out["gamma"].append(gam)
    res = {
        "reward": torch.stack(out["reward"]).reshape(td["next", "reward"].shape),
        "steps": torch.tensor(out["steps"]).reshape(batch),
        "gamma": torch.tensor(out["gamma"], dtype=torch.float64).reshape(batch),
        "next": {k: torch.stack([torch.stack(v) for v in vals]).reshape(td["next", k].shape)
                 for k, vals in out["next"].items()},
    }
    return res


def _check_multistep(td: TensorDict, gamma: float, n: int) -> None:
    orig = td.clone()
    expected = _multistep_model(orig, gamma, n)
    out = MultiStep(gamma=gamma, n_steps=n)(td.clone())
    done_shape = orig["next", "done"].shape if ("next", "done") in orig.keys(True) else None
    torch.testing.assert_close(out["next", "reward"].double(), expected["reward"],
                               rtol=1e-5, atol=1e-5)
    assert out["next", "reward"].dtype == orig["next", "reward"].dtype
    assert torch.equal(out["next", "original_reward"], orig["next", "reward"])
    for k, v in expected["next"].items():
        assert torch.equal(out["next", k], v), k
    steps = out["steps_to_next_obs"]
    assert steps.dtype == torch.int64
    if done_shape is not None:  # TorchRL's shape: a trailing singleton of done dropped
        if done_shape == (*orig.batch_size, 1):
            done_shape = orig.batch_size
        assert steps.shape == done_shape and out["gamma"].shape == done_shape
    assert torch.equal(steps.reshape(orig.batch_size), expected["steps"])
    assert out["gamma"].dtype == orig["next", "reward"].dtype
    torch.testing.assert_close(out["gamma"].reshape(orig.batch_size).double(),
                               expected["gamma"], rtol=1e-5, atol=1e-6)
    for k in ("obs", "action"):
        assert torch.equal(out[k], orig[k])


@pytest.mark.parametrize("seed", range(12))
def test_multistep_matches_the_loop_model_on_random_trajectories(seed):
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    batch = rnd.choice([(rnd.randint(1, 12),), (rnd.randint(1, 4), rnd.randint(1, 9))])
    td = _random_traj(g, batch, trailing=rnd.random() < 0.5, p=rnd.choice([0.0, 0.15, 0.5]))
    for n in range(1, 6):
        _check_multistep(td, gamma=rnd.choice([1.0, 0.9, 0.5]), n=n)


@pytest.mark.parametrize("keys", [("done",), ("terminated",), ("truncated",),
                                  ("done", "truncated")])
def test_multistep_with_a_subset_of_done_keys(keys):
    g = torch.Generator().manual_seed(3)
    td = _random_traj(g, (3, 7), trailing=True, p=0.25, keys=keys)
    for n in (1, 2, 4):
        _check_multistep(td, gamma=0.8, n=n)


def test_multistep_migrating_doc_example():
    td = TensorDict({
        "obs": torch.arange(4.0), ("next", "obs"): torch.arange(1.0, 5.0),
        ("next", "reward"): torch.ones(4),
        ("next", "terminated"): torch.tensor([False, True, False, False]),
    }, [4])
    out = MultiStep(gamma=0.9, n_steps=3)(td)
    assert out["next", "terminated"].tolist() == [True, True, False, False]
    assert out["steps_to_next_obs"].tolist() == [2, 1, 2, 1]
    assert out["next", "obs"].tolist() == [2.0, 2.0, 4.0, 4.0]



def test_multistep_step_entries_are_shaped_like_a_per_agent_done_entry():
    done = torch.tensor([[False, False], [True, False], [False, False], [False, False]])
    td = TensorDict({("next", "reward"): torch.ones(4, 2), ("next", "done"): done}, [4])
    out = MultiStep(gamma=0.5, n_steps=3)(td)
    # docstring: "steps_to_next_obs ... and gamma ... the done entry's shape" (per agent)
    assert out["steps_to_next_obs"].shape == done.shape
    assert out["gamma"].shape == done.shape


def _slice_data(g: torch.Generator, T: int) -> TensorDict:
    # random trajectory lengths (>= 6 so that slices of 6 fit), random terminated / truncated
    lengths = []
    while sum(lengths) < T:
        lengths.append(int(torch.randint(6, 15, (1,), generator=g)))
    lengths[-1] -= sum(lengths) - T
    if lengths[-1] < 6:
        tail = lengths.pop()
        lengths[-1] += tail
    traj = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    end = torch.zeros(T, 1, dtype=torch.bool)
    end[torch.tensor(lengths).cumsum(0) - 1] = True
    term = end & (torch.rand(T, 1, generator=g) < 0.5)
    return TensorDict({
        "obs": torch.arange(T).float().unsqueeze(-1), "traj": traj,
        "next": {"obs": torch.arange(1, T + 1).float().unsqueeze(-1),
                 "reward": torch.randn(T, 1, generator=g),
                 "done": end.clone(), "terminated": term, "truncated": end & ~term},
    }, [T])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n", [1, 2, 4])
def test_multistep_in_a_slice_sampler_buffer_stops_at_slice_ends(seed, n):
    g = torch.Generator().manual_seed(seed)
    data = _slice_data(g, 80)

    def buffer(transform):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(80),
                                    sampler=SliceSampler(slice_len=6, traj_key="traj"),
                                    transform=transform, batch_size=24,
                                    generator=torch.Generator().manual_seed(seed))
        rb.extend(data)
        return rb

    rb_t, rb_plain = buffer(MultiStep(gamma=0.7, n_steps=n)), buffer(None)
    for _ in range(5):
        got, raw = rb_t.sample(), rb_plain.sample()
        assert torch.equal(got["index"], raw["index"])
        # model: each slice of 6 is its own time axis, with the stored flags
        stored = data[raw["index"]].reshape(4, 6)
        expected = _multistep_model(stored, 0.7, n)
        torch.testing.assert_close(got["next", "reward"].reshape(4, 6, 1).double(),
                                   expected["reward"], rtol=1e-5, atol=1e-5)
        assert torch.equal(got["next", "obs"].reshape(4, 6, 1), expected["next"]["obs"])
        assert torch.equal(got["next", "terminated"].reshape(4, 6, 1),
                           expected["next"]["terminated"])
        assert torch.equal(got["steps_to_next_obs"].reshape(4, 6), expected["steps"])


# ------------------------------------------------------------------------------------------
# CatFrames
# ------------------------------------------------------------------------------------------
def _catframes_model(value, last, N, dim, padding, pad_value, root=None):
    """value [B, T, *feat]; last [B, T] bool. Returns [B, T, *feat with N x dim].

    With ``root`` (value is ("next", key), root is key): the stored next frames of steps
    t-N+1..t, root[start] in the slot before the trajectory's first step, padding before that
    (root[start] with "same"), as TorchRL 0.14.1."""
    B, T = last.shape
    rows = []
    for b in range(B):
        start = 0
        row = []
        for t in range(T):
            if t > 0 and last[b, t - 1]:
                start = t
            frames = []
            first = value[b, start] if root is None else root[b, start]
            for j in range(t - N + 1, t + 1):
                if j >= start:
                    frames.append(value[b, j])
                elif (root is not None and j == start - 1) or padding == "same":
                    frames.append(first)
                else:
                    frames.append(torch.full_like(first, pad_value))
            row.append(torch.cat(frames, dim))
        rows.append(torch.stack(row))
    return torch.stack(rows)


@pytest.mark.parametrize("seed", range(10))
def test_catframes_matches_the_loop_model(seed):
    g = torch.Generator().manual_seed(100 + seed)
    rnd = random.Random(seed)
    batch = rnd.choice([(rnd.randint(1, 12),), (rnd.randint(1, 3), rnd.randint(1, 9))])
    feat = rnd.choice([(3,), (2, 3), (2, 2, 2)])
    T = batch[-1]
    B = batch[0] if len(batch) == 2 else 1
    done = torch.rand(*batch, 1, generator=g) < rnd.choice([0.0, 0.2, 0.5])
    obs = torch.randn(*batch, *feat, generator=g)
    td = TensorDict({"obs": obs, ("next", "obs"): torch.randn(*batch, *feat, generator=g),
                     "other": torch.randint(0, 9, (*batch, *feat), generator=g),
                     ("next", "done"): done}, list(batch))
    for N in range(1, 5):
        for dim in range(-len(feat), 0):
            for padding in ("same", "constant"):
                t = CatFrames(N, dim, in_keys=["obs", ("next", "obs"), "other"],
                              out_keys=["s", ("next", "s"), "o"], padding=padding,
                              padding_value=-7.0)
                out = t(td.clone())
                last = done.reshape(B, T)
                o = obs.reshape(B, T, *feat)
                no = td["next", "obs"].reshape(B, T, *feat)
                ot = td["other"].reshape(B, T, *feat)
                exp = _catframes_model(o, last, N, dim, padding, -7.0)
                exp_n = _catframes_model(no, last, N, dim, padding, -7.0, root=o)
                exp_o = _catframes_model(ot, last, N, dim, padding, -7)
                assert torch.equal(out["s"].reshape(exp.shape), exp)
                assert out["s"].shape == (*batch, *exp.shape[2:])
                assert torch.equal(out["next", "s"].reshape(exp_n.shape), exp_n)
                assert torch.equal(out["o"].reshape(exp_o.shape), exp_o)
                assert out["o"].dtype == torch.int64


def test_catframes_docstring_example():
    done = torch.tensor([False, True, False, False])
    td = TensorDict({"obs": torch.arange(4.).unsqueeze(-1), ("next", "done"): done}, [4])
    out = CatFrames(3, -1, in_keys=["obs"])(td)["obs"]
    assert out.tolist() == [[0, 0, 0], [0, 0, 1], [2, 2, 2], [2, 2, 3]]


@pytest.mark.parametrize("padding", ["same", "constant"])
def test_catframes_in_a_slice_sampler_buffer_pads_at_slice_starts(padding):
    g = torch.Generator().manual_seed(5)
    data = _slice_data(g, 80)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(80),
                                sampler=SliceSampler(slice_len=6, traj_key="traj"),
                                transform=CatFrames(3, -1, in_keys=["obs"], out_keys=["s"],
                                                    padding=padding, padding_value=-1.0),
                                batch_size=24, generator=torch.Generator().manual_seed(1))
    rb.extend(data)
    for _ in range(5):
        s = rb.sample()
        obs = data["obs"][s["index"]].reshape(4, 6, 1)
        last = torch.zeros(4, 6, dtype=torch.bool)  # each slice is its own time axis
        exp = _catframes_model(obs, last, 3, -1, padding, -1.0)
        assert torch.equal(s["s"].reshape(4, 6, 3), exp)


@pytest.mark.parametrize("N", [1, 2, 4])
@pytest.mark.parametrize("padding", ["same", "constant"])
def test_catframes_make_rb_transform_and_sampler_stacks_the_stored_frames(N, padding):
    g = torch.Generator().manual_seed(N)
    data = _slice_data(g, 80)
    data["obs"] = torch.randn(80, 2, generator=g)
    data["next", "obs"] = torch.randn(80, 2, generator=g)
    t, sampler = CatFrames(N, -1, in_keys=["obs"], out_keys=["stack"], padding=padding
                           ).make_rb_transform_and_sampler(batch_size=5, traj_key="traj")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(80), sampler=sampler, transform=t,
                                batch_size=5, generator=torch.Generator().manual_seed(N))
    rb.extend(data)
    for _ in range(5):
        s = rb.sample()
        assert s.batch_size == (5,)
        for row, i in enumerate(s["index"].tolist()):
            idx = list(range(i - N + 1, i + 1))
            assert len(set(data["traj"][idx].tolist())) == 1
            exp = torch.cat([data["obs"][j] for j in idx], -1)
            assert torch.equal(s["stack"][row], exp)
            # the stored next frames of the window's steps (TorchRL's layout)
            exp_n = torch.cat([data["next", "obs"][j] for j in idx], -1)
            assert torch.equal(s["next", "stack"][row], exp_n)
            assert torch.equal(s["obs"][row], data["obs"][i])
    assert "stack" not in rb.storage[:].keys()


# ------------------------------------------------------------------------------------------
# element-wise transforms, against formulas and TorchRL 0.14.1's outputs (as literals)
# ------------------------------------------------------------------------------------------
R = torch.tensor([[4.622988224029541], [-0.880286693572998], [-6.536368370056152],
                  [1.7052937746047974], [-3.2535672187805176], [-4.195786476135254]])


def _rtd(r=R):
    return TensorDict({"reward": r.clone()}, [r.shape[0]])


def test_reward_scaling_formula_and_torchrl():
    out = RewardScaling(loc=0.5, scale=2.0)(_rtd())["reward"]
    assert out.dtype == torch.float32 and out.shape == R.shape
    torch.testing.assert_close(out, R * 2 + 0.5)
    out = RewardScaling(loc=0.5, scale=2.0, standard_normal=True)(_rtd())["reward"]
    torch.testing.assert_close(out, (R - 0.5) / 2)
    # scale clamped at 1e-6, as TorchRL (TorchRL 0.14.1 output)
    out = RewardScaling(loc=0.5, scale=0.0)(_rtd())["reward"].squeeze(-1)
    torch.testing.assert_close(out, torch.tensor(
        [0.5000046491622925, 0.49999910593032837, 0.4999934732913971, 0.5000017285346985,
         0.49999675154685974, 0.49999579787254333]))


def test_reward_clipping_and_binarize():
    out = RewardClipping(-1.0, 1.5)(_rtd())["reward"]
    assert torch.equal(out, R.clamp(-1.0, 1.5))
    assert torch.equal(RewardClipping(clamp_max=0.0)(_rtd())["reward"], R.clamp(max=0.0))
    b = BinarizeReward()(_rtd(torch.tensor([[-1.0], [0.0], [1e-9], [3.0]])))["reward"]
    assert b.dtype == torch.int8 and b.squeeze(-1).tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("standard_normal", [False, True])
def test_observation_norm_formula(standard_normal):
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(6, 3, generator=g)
    loc, scale = torch.tensor([1.0, 2, 3]), torch.tensor([0.5, 2, 3])
    t = ObservationNorm(loc=loc, scale=scale, in_keys=["obs"], in_keys_inv=["obs"],
                        standard_normal=standard_normal)
    out = t(TensorDict({"obs": obs.clone()}, [6]))["obs"]
    exp = (obs - loc) / scale if standard_normal else obs * scale + loc
    torch.testing.assert_close(out, exp)
    back = t.inv(TensorDict({"obs": out.clone()}, [6]))["obs"]
    torch.testing.assert_close(back, obs)


@pytest.mark.parametrize("standard_normal", [False, True])
def test_observation_norm_init_stats_standardises(standard_normal):
    g = torch.Generator().manual_seed(1)
    data = TensorDict({"obs": torch.randn(500, 3, generator=g) * 4 + 2}, [500])
    t = ObservationNorm(in_keys=["obs"], standard_normal=standard_normal)
    t.init_stats_from(data)
    out = t(data.clone())["obs"]
    torch.testing.assert_close(out.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.std(0), torch.ones(3), atol=1e-4, rtol=0)


def test_double_to_float_and_discrete_action_projection():
    td = TensorDict({"x": torch.randn(3, dtype=torch.float64),
                     "y": torch.ones(3, dtype=torch.float64)}, [3])
    out = DoubleToFloat(in_keys=["x"])(td.clone())
    assert out["x"].dtype == torch.float32 and out["y"].dtype == torch.float64
    assert torch.equal(out["x"], td["x"].float())
    out = DoubleToFloat()(td.clone())
    assert out["y"].dtype == torch.float32
    a = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 0]), 2)
    wide = DiscreteActionProjection(2, 4)(TensorDict({"action": a}, [4]))["action"]
    # TorchRL 0.14.1 output
    assert wide.dtype == torch.int64
    assert wide.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0]]
    torch.manual_seed(0)
    narrow = DiscreteActionProjection(2, 4).inv(TensorDict(
        {"action": torch.nn.functional.one_hot(torch.tensor([0, 3, 2, 1]), 4)}, [4]))["action"]
    assert narrow.shape == (4, 2) and narrow[[0, 3]].tolist() == [[1, 0], [0, 1]]
    assert (narrow.sum(-1) == 1).all()


def test_finite_check_squeeze_unsqueeze_flatten():
    td = TensorDict({"x": torch.randn(4, 1, 3), "i": torch.arange(4)}, [4])
    assert FiniteTensorDictCheck()(td.clone())["x"].equal(td["x"])
    with pytest.raises(ValueError):
        FiniteTensorDictCheck()(td.clone().set("x", td["x"].clone().index_fill_(0, torch.tensor([2]), float("inf"))))
    sq = SqueezeTransform(-2, in_keys=["x"])(td.clone())["x"]
    assert torch.equal(sq, td["x"].squeeze(-2))
    un = UnsqueezeTransform(-1, in_keys=["x"])(td.clone())["x"]
    assert torch.equal(un, td["x"].unsqueeze(-1))
    img = torch.arange(2 * 3 * 5 * 7, dtype=torch.float32).reshape(2, 3, 5, 7)
    flat = FlattenObservation(-3, -1, in_keys=["pixels"])(TensorDict({"pixels": img}, [2]))
    assert torch.equal(flat["pixels"], img.reshape(2, 105))


def _center_crop_model(img, h, w):
    H, W = img.shape[-2:]
    if H < h or W < w:
        ph, pw = max(h - H, 0), max(w - W, 0)
        img = torch.nn.functional.pad(img, [pw // 2, (pw + 1) // 2, ph // 2, (ph + 1) // 2])
        H, W = img.shape[-2:]
    top, left = int(round((H - h) / 2.0)), int(round((W - w) / 2.0))
    return img[..., top:top + h, left:left + w]


def test_center_crop_model():
    g = torch.Generator().manual_seed(0)
    for H, W in [(5, 7), (6, 6), (4, 9), (2, 3)]:
        img = torch.randn(2, 3, H, W, generator=g)
        for w in range(1, 10):
            for h in range(1, 9):
                out = CenterCrop(w, h)(TensorDict({"pixels": img}, [2]))["pixels"]
                assert out.shape == (2, 3, h, w)
                assert torch.equal(out, _center_crop_model(img, h, w))


def test_grayscale_formula():
    g = torch.Generator().manual_seed(0)
    img = torch.rand(2, 4, 3, 5, 6, generator=g)
    out = GrayScale()(TensorDict({"pixels": img}, [2]))["pixels"]
    exp = (0.2989 * img[..., 0, :, :] + 0.587 * img[..., 1, :, :]
           + 0.114 * img[..., 2, :, :]).unsqueeze(-3)
    assert out.shape == (2, 4, 1, 5, 6)
    torch.testing.assert_close(out, exp)
    u8 = (img * 255).to(torch.uint8)
    out = GrayScale()(TensorDict({"pixels": u8}, [2]))["pixels"]
    f = u8.float()
    exp = (0.2989 * f[..., 0, :, :] + 0.587 * f[..., 1, :, :] + 0.114 * f[..., 2, :, :])
    assert out.dtype == torch.uint8
    assert torch.equal(out.squeeze(-3), exp.to(torch.uint8))
