"""ConsumingSampler (served by tdreplay.samplers) over tensor storages: reuse of consumed
slots, storage length, prefilled storages, TensorDict buffers, memmap checkpoints."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import tdreplay.core
from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import ConsumingSampler, PrioritizedSampler, SliceSampler
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage, TensorStorage
from tdreplay.writers import TensorDictMaxValueWriter, TensorDictRoundRobinWriter


def test_same_class_as_core():
    assert ConsumingSampler is tdreplay.core.ConsumingSampler


def test_reuse_then_cursor_on_a_full_lazy_tensor_storage():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), consume_after_n_samples=1,
                      generator=torch.Generator().manual_seed(4))
    rb.extend(torch.arange(10))
    rb.extend(torch.arange(10, 17))  # wraps: cursor at 7
    assert rb.writer.cursor == 7
    consumed = rb.sample(3, return_info=True)[1]["index"].tolist()
    written = rb.extend(torch.arange(100, 106)).tolist()
    fresh = [r % 10 for r in range(7, 17) if r % 10 not in consumed][:3]
    assert written == consumed + fresh
    assert rb.writer.cursor == (fresh[-1] + 1) % 10
    assert rb.storage.get(torch.tensor(written)).tolist() == list(range(100, 106))
    assert len(rb.storage) == 10 and len(rb) == 10


def test_reuse_and_append_grow_the_storage_as_written():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), consume_after_n_samples=1, batch_size=2)
    rb.extend(torch.arange(5))
    consumed = rb.sample(return_info=True)[1]["index"].tolist()
    written = rb.extend(torch.arange(100, 104)).tolist()
    assert written == [*consumed, 5, 6]
    assert len(rb.storage) == 7 and len(rb) == 7
    assert rb.storage.get(torch.tensor(written)).tolist() == [100, 101, 102, 103]


def test_prefilled_tensor_storage_is_sampleable():
    rb = ReplayBuffer(storage=TensorStorage(torch.arange(5)), batch_size=3,
                      consume_after_n_samples=1)
    assert len(rb) == 5
    first = rb.sample().tolist()
    assert len(first) == 3 and len(rb) == 2
    second = rb.sample().tolist()
    assert sorted(first + second) == [0, 1, 2, 3, 4] and len(rb) == 0


def test_tensordict_buffer_writes_index_of_reused_slots():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), consume_after_n_samples=1,
                                writer=TensorDictRoundRobinWriter())
    rb.extend(TensorDict({"a": torch.arange(4)}, [4]))
    sample = rb.sample(2)
    assert sample["index"].unique().numel() == 2 and len(rb) == 2
    td = TensorDict({"a": torch.tensor([40, 41])}, [2])
    rows = rb.extend(td)
    assert rows.tolist() == sample["index"].tolist()
    assert sorted(td.keys()) == ["a"]  # the caller's batch as it was
    assert rb[:]["index"].tolist() == [0, 1, 2, 3]  # each row records its own slot
    assert rb.storage.get(rows)["a"].tolist() == [40, 41]
    assert rb.sample(10)["index"].numel() == 4 and len(rb) == 0


def test_memmap_buffer_dumps_and_loads_consumption(tmp_path):
    def make(scratch):
        return TensorDictReplayBuffer(
            storage=LazyMemmapStorage(5, scratch_dir=tmp_path / scratch), batch_size=5,
            consume_after_n_samples=2, generator=torch.Generator().manual_seed(1))

    rb = make("a")
    rb.extend(TensorDict({"a": torch.arange(5)}, [5]))
    assert sorted(rb.sample()["a"].tolist()) == [0, 1, 2, 3, 4] and len(rb) == 5
    rb.sample(2)  # two items consumed
    rb.dumps(tmp_path / "ckpt")
    restored = make("b")
    restored.loads(tmp_path / "ckpt")
    assert len(restored) == len(rb) == 3
    assert restored.sampler.reusable_slots(restored.storage, 5).tolist() == \
        rb.sampler.reusable_slots(rb.storage, 5).tolist()
    assert restored.sample()["a"].tolist() == rb.sample()["a"].tolist()
    assert len(restored) == 0


def test_refusals():
    with pytest.raises(ValueError, match="1-dimensional storages"):
        ReplayBuffer(storage=LazyTensorStorage(10, ndim=2), sampler=ConsumingSampler())
    with pytest.raises(ValueError, match="only supports the default RandomSampler"):
        ReplayBuffer(storage=LazyTensorStorage(10), consume_after_n_samples=1,
                     sampler=PrioritizedSampler(10, 1.0, 1.0))
    with pytest.raises(ValueError, match="only supports the default RandomSampler"):
        ReplayBuffer(storage=LazyTensorStorage(10), consume_after_n_samples=1,
                     sampler=SliceSampler(num_slices=2))
    with pytest.raises(TypeError, match="write_at"):
        TensorDictReplayBuffer(storage=LazyTensorStorage(10), consume_after_n_samples=1,
                               writer=TensorDictMaxValueWriter(rank_key="r"))
    rb = ReplayBuffer(storage=LazyTensorStorage(10), consume_after_n_samples=1)
    with pytest.raises(ValueError, match="1-dimensional storages"):
        rb.set_storage(LazyTensorStorage(10, ndim=2))
    assert rb.storage.ndim == 1


def test_a_consuming_buffer_is_not_shared_between_processes(tmp_path):
    # the counts and consumed slots live in this process: copies would hand out items twice
    with pytest.raises(RuntimeError, match="ConsumingSampler"):
        ReplayBuffer(storage=LazyMemmapStorage(5, scratch_dir=tmp_path), shared=True,
                     consume_after_n_samples=1)
    assert ConsumingSampler.shareable is False
