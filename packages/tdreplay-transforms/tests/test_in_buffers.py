"""Transforms inside buffers: on the sample path, inverted on the extend path, and the
ReplayBufferEnsemble reference example's per-buffer transforms."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import tdreplay.storages as storages
from tdreplay.core import Compose as CoreCompose
from tdreplay.core import Sampler, TensorDictReplayBuffer
from tdreplay.transforms import (
    CatFrames,
    CatTensors,
    Compose,
    DTypeCastTransform,
    ExcludeTransform,
    GrayScale,
    MultiStep,
    RenameTransform,
    Resize,
    SelectTransform,
    ToTensorImage,
    UnsqueezeTransform,
)

LazyTensorStorage = storages.LazyTensorStorage
# the reference example uses LazyMemmapStorage; fall back to the in-memory storage without it
ExampleStorage = getattr(storages, "LazyMemmapStorage", LazyTensorStorage)


class WindowSampler(Sampler):
    """Samples ``batch_size`` consecutive slots (a contiguous window of the stored steps)."""

    def sample(self, storage, batch_size):
        start = int(torch.randint(0, len(storage) - batch_size + 1, (), generator=self._rng))
        return torch.arange(start, start + batch_size), {}


def rollout(T: int = 12, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[[3, 8]] = True
    obs = torch.arange(T, dtype=torch.float32).unsqueeze(-1)
    return TensorDict({
        "obs": obs,
        "pixels": torch.randint(0, 256, (T, 10, 12, 3), generator=g, dtype=torch.uint8),
        ("next", "obs"): obs + 1,
        ("next", "reward"): torch.randn(T, 1, generator=g),
        ("next", "done"): done,
        ("next", "terminated"): done.clone(),
    }, [T])


def test_compose_is_cores_and_takes_plain_callables():
    assert Compose is CoreCompose

    def add_flag(td):
        td.set("flag", torch.ones(td.batch_size))
        return td

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), batch_size=4,
                                transform=Compose(ToTensorImage(), add_flag, Resize(5)))
    rb.extend(rollout())
    s = rb.sample()
    assert s["flag"].tolist() == [1.0] * 4 and s["pixels"].shape == (4, 3, 5, 5)


# ---- the ReplayBufferEnsemble reference example ------------------------------------------------
def example_buffers():
    rb0 = TensorDictReplayBuffer(
        storage=ExampleStorage(10),
        transform=Compose(
            ToTensorImage(in_keys=["pixels", ("next", "pixels")]),
            Resize(32, in_keys=["pixels", ("next", "pixels")]),
            RenameTransform([("some", "key")], ["renamed"]),
        ),
    )
    rb1 = TensorDictReplayBuffer(
        storage=ExampleStorage(10),
        transform=Compose(
            ToTensorImage(in_keys=["pixels", ("next", "pixels")]),
            Resize(32, in_keys=["pixels", ("next", "pixels")]),
            RenameTransform(["another_key"], ["renamed"]),
        ),
    )
    data0 = TensorDict({
        "pixels": torch.randint(255, (10, 244, 244, 3)),
        ("next", "pixels"): torch.randint(255, (10, 244, 244, 3)),
        ("some", "key"): torch.randn(10),
    }, batch_size=[10])
    data1 = TensorDict({
        "pixels": torch.randint(255, (10, 64, 64, 3)),
        ("next", "pixels"): torch.randint(255, (10, 64, 64, 3)),
        "another_key": torch.randn(10),
    }, batch_size=[10])
    rb0.extend(data0)
    rb1.extend(data1)
    return rb0, rb1, data0, data1


def test_ensemble_example_per_buffer_shapes():
    rb0, rb1, data0, data1 = example_buffers()
    ensemble_transform = Resize(33, in_keys=["pixels"], out_keys=["pixels33"])
    keys = ["pixels", ("next", "pixels"), "renamed"]
    for _ in range(2):
        s0, s1 = rb0.sample(5), rb1.sample(5)
        for s, data, renamed_from in ((s0, data0, ("some", "key")), (s1, data1, "another_key")):
            assert s["pixels"].shape == torch.Size([5, 3, 32, 32])
            assert s["next", "pixels"].shape == torch.Size([5, 3, 32, 32])
            assert s["pixels"].dtype == torch.float32
            assert 0 <= s["pixels"].min() and s["pixels"].max() <= 1
            assert s["renamed"].shape == torch.Size([5])
            assert torch.equal(s["renamed"], data[renamed_from][s["index"]])
        # the ensemble stacks the two samples, then applies its own transform
        sample = ensemble_transform(torch.stack([s0.select(*keys), s1.select(*keys)]))
        assert sample["next", "pixels"].shape == torch.Size([2, 5, 3, 32, 32])
        assert sample["pixels"].shape == torch.Size([2, 5, 3, 32, 32])
        assert sample["pixels33"].shape == torch.Size([2, 5, 3, 33, 33])
        assert sample["renamed"].shape == torch.Size([2, 5])
    # the storages still hold the raw images: transforms ran on the samples only
    assert rb0.storage.get(torch.arange(2))["pixels"].shape == (2, 244, 244, 3)
    assert torch.equal(rb1[:]["pixels"].flatten(), rb1[:]["pixels"].flatten())


def test_ensemble_example_reprs_match_the_reference():
    rb0, rb1, *_ = example_buffers()
    t0, _, t2 = rb0.transform
    assert repr(t0) == "ToTensorImage(keys=['pixels', ('next', 'pixels')])"
    assert repr(t2) == "RenameTransform(keys=[('some', 'key')])"
    assert repr(rb1.transform[2]) == "RenameTransform(keys=['another_key'])"


def test_resized_values_come_from_the_stored_images():
    rb0, *_ = example_buffers()
    s = rb0.sample(4)
    stored = rb0.storage.get(s["index"])
    expected = Resize(32)(ToTensorImage()(stored.select("pixels")))["pixels"]
    assert torch.allclose(s["pixels"], expected)


# ---- sample path ----------------------------------------------------------------------------------
def test_image_pipeline_and_key_transforms_in_the_sample_path():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), batch_size=6, transform=Compose(
        ToTensorImage(),
        GrayScale(),
        Resize(6, 5),
        CatTensors(["obs", ("next", "obs")], "both", del_keys=False),
        UnsqueezeTransform(-1, in_keys=["both"]),
        SelectTransform("pixels", "both"),
    ))
    rb.extend(rollout())
    s = rb.sample()
    assert s["pixels"].shape == (6, 1, 5, 6) and s["pixels"].dtype == torch.float32
    assert s["both"].shape == (6, 2, 1)
    # sorted keys: ("next", "obs") ("next.obs") comes before "obs"
    assert torch.equal(s["both"][:, 0, 0] - s["both"][:, 1, 0], torch.ones(6))
    assert s["index"].shape == (6,)  # buffer info is attached after the transforms
    # as TorchRL's: only the selected keys (and root "reward"/"done", absent here) are kept
    assert set(s.keys()) == {"pixels", "both", "index"}


def test_cat_frames_and_multistep_in_the_sample_path():
    data = rollout()
    cat = CatFrames(3, -1, in_keys=["obs", ("next", "obs")], out_keys=["obs3", ("next", "obs3")])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=WindowSampler(),
                                transform=Compose(cat, MultiStep(0.9, 3)), batch_size=7,
                                generator=torch.Generator().manual_seed(0))
    rb.extend(data)
    for _ in range(3):
        s = rb.sample()
        window = data[s["index"]]
        expected = MultiStep(0.9, 3)(cat(window.clone()))
        for key in ("obs3", ("next", "obs3"), ("next", "reward"), ("next", "obs"),
                    ("next", "terminated"), "steps_to_next_obs", "gamma"):
            assert torch.equal(s[key], expected[key]), key
        assert s["obs3"].shape == (7, 3)
    # the stored data is untouched (rb[:] would apply the transforms too)
    stored = rb.storage.get(torch.arange(len(rb)))
    assert torch.equal(stored["next", "reward"], data["next", "reward"])
    assert torch.equal(stored["next", "done"], data["next", "done"])


# ---- extend path (inverted) ------------------------------------------------------------------------
def test_inverted_image_transform_stores_converted_images_and_leaves_the_input_alone():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    rb.append_transform(ToTensorImage(), invert=True)
    data = rollout()
    raw = data["pixels"].clone()
    rb.extend(data)
    stored = rb.storage.get(torch.arange(len(rb)))["pixels"]
    assert stored.shape == (12, 3, 10, 12) and stored.dtype == torch.float32
    assert torch.allclose(stored, raw.movedim(-1, -3).float() / 255)
    assert torch.equal(data["pixels"], raw) and data["pixels"].dtype == torch.uint8


def test_inverted_rename_and_dtype_cast_round_trip():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), batch_size=4)
    rb.append_transform(RenameTransform(["obs"], ["observation"]), invert=True)
    rb.append_transform(DTypeCastTransform(torch.float32, torch.float16), invert=True)
    data = rollout()
    rb.extend(data)
    assert "obs" in data.keys() and "observation" not in data.keys()  # caller's data unchanged
    stored = rb.storage.get(torch.arange(len(rb)))
    assert "observation" in stored.keys() and "obs" not in stored.keys()
    assert stored["observation"].dtype == torch.float16
    s = rb.sample()
    # sample side: the inverses (cast back to float32; rename has no inverse keys)
    assert s["observation"].dtype == torch.float32
    assert torch.equal(s["observation"], data["obs"][s["index"]])


def test_inverted_multistep_and_cat_frames_on_a_collected_batch():
    data = rollout()
    # the write side runs the transforms in reverse order: CatFrames first (it reads the
    # trajectory boundaries from ("next", "done"), which MultiStep rewrites), then MultiStep
    expected = MultiStep(0.5, 2)(CatFrames(2, -1, in_keys=["obs"])(data.clone()))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    rb.append_transform(MultiStep(0.5, 2), invert=True)
    rb.append_transform(CatFrames(2, -1, in_keys=["obs"]), invert=True)
    rb.extend(data)
    stored = rb.storage.get(torch.arange(12))
    for key in ("obs", ("next", "reward"), ("next", "obs"), "steps_to_next_obs", "gamma",
                ("next", "original_reward")):
        assert torch.equal(stored[key], expected[key]), key
    assert "steps_to_next_obs" not in data.keys()


def test_write_side_filters_and_squeeze():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), transform=Compose(
        ExcludeTransform("pixels", inverse=True),
        UnsqueezeTransform(-1, in_keys=["obs"], out_keys=["obs"],
                           in_keys_inv=[("next", "reward")]),
    ))
    rb.extend(rollout())
    stored = rb.storage.get(torch.arange(12))
    assert "pixels" not in stored.keys()
    assert stored["next", "reward"].shape == (12,)  # squeezed on the way in
    assert rb.sample(3)["obs"].shape == (3, 1, 1)   # unsqueezed on the way out


def test_failing_write_side_transform_leaves_the_buffer_unchanged():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    rb.append_transform(RenameTransform(["not_there"], ["x"]), invert=True)
    with pytest.raises(KeyError, match="not_there"):
        rb.extend(rollout())
    assert len(rb) == 0 and rb.write_count == 0


def test_failing_sample_side_transform_names_the_key():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                transform=Resize(8, in_keys=["pixels"]))
    rb.extend(rollout())
    with pytest.raises(ValueError, match="'pixels'.*channels-last"):
        rb.sample(2)


def test_slice_samples_get_frames_and_returns_within_each_slice():
    from tdreplay.samplers import SliceSampler

    T = 40
    episode = torch.arange(4).repeat_interleave(10)
    step = torch.arange(T) % 10
    done = (step == 9).unsqueeze(-1)
    data = TensorDict({
        "episode": episode, "step": step.float().unsqueeze(-1),
        ("next", "step"): (step + 1).float().unsqueeze(-1),
        ("next", "reward"): torch.ones(T, 1),
        ("next", "done"): done, ("next", "terminated"): done.clone(),
    }, [T])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(T), batch_size=12,
                                sampler=SliceSampler(num_slices=3, traj_key="episode"),
                                generator=torch.Generator().manual_seed(0))
    rb.extend(data)
    cat = CatFrames(2, -1, in_keys=["step"], out_keys=["step2"])
    multistep = MultiStep(1.0, 3)
    for _ in range(5):
        s = multistep(cat(rb.sample()))  # on the returned sample: slice ends are marked
        slices = s.reshape(3, 4)
        first = slices["step"][:, 0, 0]
        # the first step of every slice is padded with itself, never stacked with another slice
        assert torch.equal(slices["step2"][:, 0], torch.stack([first, first], -1))
        assert torch.equal(slices["step2"][:, 1:, 1], slices["step"][:, 1:, 0])
        assert torch.equal(slices["step2"][:, 1:, 0], slices["step"][:, :-1, 0])
        # n-step windows stop at each slice end: 3, 3, 2, 1 steps
        assert slices["steps_to_next_obs"].tolist() == [[3, 3, 2, 1]] * 3
        assert slices["next", "reward"][..., 0].tolist() == [[3.0, 3.0, 2.0, 1.0]] * 3
        # the next state is the one after the window's last step: steps 2, 3, 3, 3 of the slice
        assert torch.equal(slices["next", "step"][:, :, 0], slices["step"][:, [2, 3, 3, 3], 0] + 1)
