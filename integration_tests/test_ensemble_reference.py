"""The ReplayBufferEnsemble example of the reference page, run as written with tdreplay imports.

It spans tdreplay-ensembles, tdreplay-storages (LazyMemmapStorage), tdreplay-transforms
(ToTensorImage, Resize, RenameTransform) and the tdreplay.data facade.
"""

import torch
from tensordict import TensorDict

from tdreplay.data import LazyMemmapStorage, ReplayBufferEnsemble, TensorDictReplayBuffer
from tdreplay.transforms import Compose, RenameTransform, Resize, ToTensorImage


def _reference_ensemble() -> ReplayBufferEnsemble:
    rb0 = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(10),
        transform=Compose(
            ToTensorImage(in_keys=["pixels", ("next", "pixels")]),
            Resize(32, in_keys=["pixels", ("next", "pixels")]),
            RenameTransform([("some", "key")], ["renamed"]),
        ),
    )
    rb1 = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(10),
        transform=Compose(
            ToTensorImage(in_keys=["pixels", ("next", "pixels")]),
            Resize(32, in_keys=["pixels", ("next", "pixels")]),
            RenameTransform(["another_key"], ["renamed"]),
        ),
    )
    return ReplayBufferEnsemble(
        rb0,
        rb1,
        p=[0.5, 0.5],
        transform=Resize(33, in_keys=["pixels"], out_keys=["pixels33"]),
    )


def _fill(rb: ReplayBufferEnsemble) -> None:
    data0 = TensorDict(
        {
            "pixels": torch.randint(255, (10, 244, 244, 3)),
            ("next", "pixels"): torch.randint(255, (10, 244, 244, 3)),
            ("some", "key"): torch.randn(10),
        },
        batch_size=[10],
    )
    data1 = TensorDict(
        {
            "pixels": torch.randint(255, (10, 64, 64, 3)),
            ("next", "pixels"): torch.randint(255, (10, 64, 64, 3)),
            "another_key": torch.randn(10),
        },
        batch_size=[10],
    )
    rb[0].extend(data0)
    rb[1].extend(data1)


def test_reference_example_shapes():
    torch.manual_seed(0)
    rb = _reference_ensemble()
    _fill(rb)
    for _ in range(2):
        sample = rb.sample(10)
        assert sample["next", "pixels"].shape == torch.Size([2, 5, 3, 32, 32])
        assert sample["pixels"].shape == torch.Size([2, 5, 3, 32, 32])
        assert sample["pixels33"].shape == torch.Size([2, 5, 3, 33, 33])
        assert sample["renamed"].shape == torch.Size([2, 5])


def test_reference_example_parts_come_from_their_buffers():
    torch.manual_seed(1)
    rb = _reference_ensemble()
    _fill(rb)
    seen = set()
    for _ in range(20):
        sample = rb.sample(10)
        buffer_ids = sample["index", "buffer_ids"]
        index = sample["index", "index"]
        assert buffer_ids.shape == index.shape == torch.Size([2, 5])
        for part in range(2):
            ids = buffer_ids[part]
            assert (ids == ids[0]).all()
            buffer_id = int(ids[0])
            seen.add(buffer_id)
            # the part's "renamed" entry is its buffer's renamed key at the sampled slots
            source_key = ("some", "key") if buffer_id == 0 else "another_key"
            stored = rb[buffer_id].storage.get(index[part])[source_key]
            torch.testing.assert_close(sample["renamed"][part], stored)
            # ToTensorImage scaled the uint8-range pixels into [0, 1]
            assert 0.0 <= float(sample["pixels"][part].min())
            assert float(sample["pixels"][part].max()) <= 1.0
    assert seen == {0, 1}


def test_reference_example_repr():
    rb = _reference_ensemble()
    text = repr(rb)
    assert text.startswith("ReplayBufferEnsemble(\n    storages=StorageEnsemble(\n")
    assert text.count("LazyMemmapStorage(") == 2
    assert "RenameTransform(keys=[('some', 'key')])" in text
    assert "RenameTransform(keys=['another_key'])" in text
    assert "samplers=SamplerEnsemble(" in text and "p=[0.5, 0.5]" in text
    assert "writers=WriterEnsemble(" in text
    assert "\nbatch_size=None,\n" in text
    assert "Resize(w=33, h=33" in text
    assert text.endswith("collate_fn=tdreplay.ensembles.collate.stack_parts)")
