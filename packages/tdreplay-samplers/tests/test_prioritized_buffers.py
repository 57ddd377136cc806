"""PrioritizedReplayBuffer / TensorDictPrioritizedReplayBuffer, and PrioritizedSampler inside the
core buffers: priorities from data, stale updates, multi-dim storages, checkpoints, threads."""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import (
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    TensorDictPrioritizedReplayBuffer,
)
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage

BACKENDS = ["numba", "torch"]


def priorities(rb) -> torch.Tensor:
    return rb.sampler.state_dict()["priorities"]


def td(n: int, start: int = 0, **entries) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32), **entries}, [n])


# ---- construction ----------------------------------------------------------------------------
def test_buffers_build_their_sampler_for_the_storage():
    rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(123))
    assert isinstance(rb.sampler, PrioritizedSampler)
    assert rb.sampler.max_capacity == 123
    assert (rb.sampler.alpha, rb.sampler.beta) == (0.6, 0.4)
    assert (rb.sampler.backend, rb.sampler.device) == ("numba", torch.device("cpu"))
    default = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4)
    assert isinstance(default.storage, ListStorage) and default.sampler.max_capacity == 1000
    assert default.priority_key == "td_error"


def test_sampler_device_and_backend_are_forwarded():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10),
                                           sampler_device="cpu", sampler_backend="torch")
    assert (rb.sampler.backend, rb.sampler.device) == ("torch", torch.device("cpu"))


# ---- PrioritizedReplayBuffer -----------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_prioritized_buffer_cycle(backend):
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=LazyTensorStorage(16),
                                 sampler_backend=backend, batch_size=32,
                                 generator=torch.Generator().manual_seed(0))
    rb.extend(torch.arange(8.0))
    rb.update_priority(torch.arange(8), torch.tensor([0.0, 0, 0, 0, 0, 0, 0, 1.0]))
    data, info = rb.sample(return_info=True)
    assert bool((data == 7).all()) and bool((info["index"] == 7).all())
    assert info["priority_weight"].device == data.device
    assert bool((info["write_generation"] == 1).all())
    rb.update_priority(info["index"], torch.full((32,), 0.5),
                       write_generation=info["write_generation"])
    assert priorities(rb)[7] == 0.5


def test_prioritized_buffer_with_a_transform():
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=ListStorage(8), batch_size=5,
                                 transform=lambda x: x * 10)
    rb.extend([torch.tensor(float(i)) for i in range(4)])
    data, info = rb.sample(return_info=True)
    assert torch.equal(data, info["index"].float() * 10)
    assert info["priority_weight"].shape == (5,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prioritized_buffer_skips_stale_update(backend):
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=LazyTensorStorage(4),
                                 sampler_backend=backend, batch_size=16)
    rb.extend(torch.arange(4.0))
    _, info = rb.sample(return_info=True)
    rb.extend(torch.arange(2.0))  # slots 0 and 1 hold new rows now
    rb.update_priority(info["index"], torch.full((16,), 3.0),
                       write_generation=info["write_generation"])
    sampled = set(info["index"].tolist())
    for slot in range(4):
        fresh = slot in sampled and slot >= 2
        assert priorities(rb)[slot] == (3.0 if fresh else 1.0), slot


def test_prioritized_buffer_bad_update_changes_nothing():
    rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(8))
    rb.extend(torch.arange(4.0))
    before = priorities(rb).clone()
    with pytest.raises(ValueError, match="priority"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(IndexError, match="unwritten"):
        rb.update_priority(torch.tensor([5]), torch.tensor([1.0]))
    assert torch.equal(priorities(rb), before)
    assert len(rb) == 4 and rb.write_count == 4


# ---- TensorDictPrioritizedReplayBuffer -------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_extend_reads_priorities_from_the_data(backend):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0,
                                           storage=ListStorage(10), sampler_backend=backend)
    data = td(4, td_error=torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert rb.extend(data).tolist() == [0, 1, 2, 3]
    rb.extend(td(2, 4))  # no td_error: the max priority so far
    assert priorities(rb)[:6].tolist() == [1.0, 2.0, 3.0, 4.0, 4.0, 4.0]
    assert "index" not in data.keys()  # the caller's batch as it was
    rb.add(TensorDict({"obs": torch.tensor(9.0), "td_error": torch.tensor(0.5)}, []))
    assert priorities(rb)[6] == 0.5
    rb.extend(td(2, 7, td_error=torch.ones(2)), update_priority=False)
    assert priorities(rb)[7:9].tolist() == [4.0, 4.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_and_update_tensordict_priority(backend):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0,
                                           storage=LazyTensorStorage(10), sampler_backend=backend,
                                           batch_size=64)
    rb.extend(td(5, td_error=torch.tensor([1.0, 1.0, 1.0, 1.0, 4.0])))
    sample = rb.sample()
    assert set(sample.keys()) == {"obs", "td_error", "index", "priority_weight",
                                  "write_generation"}
    assert bool((sample["obs"] == sample["index"].float()).all())
    weight = torch.where(sample["index"] == 4, 0.5, 1.0)  # (p / p_min) ** -0.5
    torch.testing.assert_close(sample["priority_weight"], weight)
    sample["td_error"] = sample["index"].float() + 10
    rb.update_tensordict_priority(sample)
    assert priorities(rb)[:5].tolist() == [
        float(i + 10) if i in set(sample["index"].tolist()) else p
        for i, p in enumerate([1.0, 1.0, 1.0, 1.0, 4.0])
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_tensordict_priority_skips_overwritten_rows(backend):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0,
                                           storage=LazyTensorStorage(4), sampler_backend=backend,
                                           batch_size=32)
    rb.extend(td(4, td_error=torch.ones(4)))
    sample = rb.sample()
    rb.extend(td(1, 100, td_error=torch.tensor([7.0])))  # replaces the row in slot 0
    sample["td_error"] = torch.full((32,), 0.25)
    rb.update_tensordict_priority(sample)
    assert priorities(rb)[0] == 7.0  # not the 0.25 computed for the old row
    for slot in set(sample["index"].tolist()) - {0}:
        assert priorities(rb)[slot] == 0.25


@pytest.mark.parametrize("backend", BACKENDS)
def test_re_extending_a_sample_does_not_store_its_bookkeeping(backend):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0,
                                           storage=LazyTensorStorage(8), sampler_backend=backend)
    rb.extend(td(4, td_error=torch.ones(4)))
    sample = rb.sample(3)
    other = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0,
                                              storage=LazyTensorStorage(8),
                                              sampler_backend=backend)
    sample["td_error"] = torch.tensor([2.0, 3.0, 5.0])
    drawn = sample["index"].clone(), sample["write_generation"].clone()
    slots = other.extend(sample)
    assert slots.tolist() == [0, 1, 2]
    assert "write_generation" not in other.storage[:].keys()
    assert "index" not in other.storage[:].keys()
    # the sample is left as it was drawn (as TorchRL's): it still points at its rows in rb
    assert torch.equal(sample["index"], drawn[0])
    assert torch.equal(sample["write_generation"], drawn[1])
    assert priorities(other)[:3].tolist() == [2.0, 3.0, 5.0]
    other.update_priority(slots, torch.tensor([6.0, 6.0, 6.0]))
    assert priorities(other)[:3].tolist() == [6.0, 6.0, 6.0]


def test_writer_keeping_some_rows_gives_them_their_priorities():
    from tdreplay.writers import TensorDictMaxValueWriter

    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=LazyTensorStorage(2),
                                           writer=TensorDictMaxValueWriter(rank_key="obs"))
    rb.extend(td(2, td_error=torch.tensor([2.0, 3.0])))
    assert priorities(rb).tolist() == [2.0, 3.0]
    batch = td(3, 5, td_error=torch.tensor([0.5, 0.75, 1.5]))
    slots = rb.extend(batch)  # keeps the 2 best of 3 rows, with their own priorities
    assert slots[0] == -1 and sorted(slots[1:].tolist()) == [0, 1]  # -1: the row not kept
    assert sorted(priorities(rb).tolist()) == [0.75, 1.5]


def test_update_tensordict_priority_errors():
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=LazyTensorStorage(4))
    rb.extend(td(2, td_error=torch.ones(2)))
    with pytest.raises(KeyError, match="index"):
        rb.update_tensordict_priority(TensorDict({"td_error": torch.ones(2)}, [2]))
    with pytest.raises(KeyError, match="td_error"):
        rb.update_tensordict_priority(TensorDict({"index": torch.arange(2)}, [2]))
    with pytest.raises(TypeError):
        rb.update_tensordict_priority({"index": torch.arange(2)})
    before = priorities(rb).clone()
    for bad in (-1.0, float("nan"), float("inf")):  # refused before anything is written
        with pytest.raises(ValueError, match="priority"):
            rb.extend(td(2, td_error=torch.tensor([1.0, bad])))
        with pytest.raises(ValueError, match="priority"):
            rb.add(TensorDict({"obs": torch.tensor(1.0), "td_error": torch.tensor(bad)}, []))
    assert len(rb) == 2 and rb.write_count == 2 and torch.equal(priorities(rb), before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_dim_priorities_are_reduced(backend):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, reduction="mean",
                                           storage=LazyTensorStorage(8), sampler_backend=backend)
    rb.extend(td(2, td_error=torch.tensor([[1.0, 3.0], [2.0, 6.0]])))
    assert priorities(rb)[:2].tolist() == [2.0, 4.0]


# ---- multi-dimensional storages: one priority per slot ------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_ndim2_storage_priorities_per_slot(backend):
    storage = LazyTensorStorage(12, ndim=2)  # time-major: rows of 2 envs, 6 rows
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, storage=storage,
                                           sampler_backend=backend, batch_size=500,
                                           generator=torch.Generator().manual_seed(0))
    error = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    slots = torch.tensor([[0, 2, 4], [1, 3, 5]])  # env b, step t at slot t * 2 + b
    data = TensorDict({"obs": slots.float(), "td_error": error}, [2, 3])
    assert rb.extend(data).tolist() == slots.tolist()
    assert priorities(rb)[:6].tolist() == [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    sample = rb.sample()
    assert sample.batch_size == torch.Size([500])
    assert bool((sample["obs"] == sample["index"].float()).all())
    counts = torch.bincount(sample["index"], minlength=12)
    assert counts[6:].sum() == 0 and counts[5] > counts[0]
    sample["td_error"] = torch.full((500,), 0.5)
    rb.update_tensordict_priority(sample)
    for slot in set(sample["index"].tolist()):
        assert priorities(rb)[slot] == 0.5
    # per-step priorities with a trailing dim are reduced (max) per slot
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0,
                                           storage=LazyTensorStorage(12, ndim=2),
                                           sampler_backend=backend)
    error = torch.tensor([[[1.0, 9.0], [2.0, 0.0], [3.0, 3.0]]])
    assert rb.extend(TensorDict({"td_error": error}, [1, 3])).tolist() == [[0, 1, 2]]
    assert priorities(rb)[:3].tolist() == [9.0, 2.0, 3.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_extra_batch_dims_of_a_flat_storage_are_reduced(backend):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, eps=0.0, reduction="sum",
                                           storage=LazyTensorStorage(8), sampler_backend=backend)
    data = TensorDict({"obs": torch.zeros(2, 3), "td_error": torch.ones(2, 3)}, [2, 3])
    slots = rb.extend(data)  # two items of 3 steps each: one slot and one priority per item
    assert priorities(rb)[:2].tolist() == [3.0, 3.0]
    data["index"] = slots[:, None].expand(2, 3)  # each step carries its item's slot
    data["td_error"] = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    rb.update_tensordict_priority(data)
    assert priorities(rb)[:2].tolist() == [3.0, 6.0]


# ---- core buffers with a PrioritizedSampler --------------------------------------------------
def test_core_tensordict_buffer_with_prioritized_sampler():
    sampler = PrioritizedSampler(10, alpha=1.0, beta=1.0, eps=0.0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=4)
    rb.extend(td(3, td_error=torch.tensor([1.0, 2.0, 3.0])))
    assert priorities(rb)[:3].tolist() == [1.0, 2.0, 3.0]
    sample = rb.sample()
    assert "priority_weight" in sample.keys()
    sample["td_error"] = torch.full((4,), 5.0)
    rb.update_tensordict_priority(sample)
    assert sampler.max_priority == 5.0


def test_quick_example_of_the_reference():
    buffer = ReplayBuffer(storage=LazyMemmapStorage(max_size=1000),
                          sampler=PrioritizedSampler(max_capacity=1000, alpha=0.7, beta=0.5),
                          batch_size=256)
    data = TensorDict({"observation": torch.randn(32, 4), "action": torch.randn(32, 2),
                       "reward": torch.randn(32, 1)}, batch_size=[32])
    buffer.extend(data)
    sample = buffer.sample()
    assert sample.batch_size == torch.Size([256])
    assert buffer.sampler.backend == "numba"


# ---- checkpoints -----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_dumps_example_of_the_reference(tmp_path, backend):
    size = 1_000

    def build(seed: int):
        sampler = PrioritizedSampler(size, 1.1, 1.0, backend=backend)
        return TensorDictReplayBuffer(storage=LazyMemmapStorage(size), sampler=sampler,
                                      generator=torch.Generator().manual_seed(seed))

    rb = build(0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        data = TensorDict({"obs": torch.randn(100, 3, 4, generator=gen),
                           "next": {"obs": torch.randn(100, 3, 4, generator=gen)},
                           "td_error": torch.rand(100, generator=gen)}, [100])
        rb.extend(data)
        sample = rb.sample(32)
        rb.update_tensordict_priority(sample)
    rb.dumps(tmp_path / "rb")
    rb_load = build(1)
    rb_load.loads(tmp_path / "rb")
    assert len(rb) == len(rb_load) == 1000
    assert torch.equal(priorities(rb), priorities(rb_load))
    for _ in range(3):  # same generator state restored: the same indices and weights
        a, b = rb.sample(64), rb_load.sample(64)
        assert torch.equal(a["index"], b["index"])
        assert torch.equal(a["priority_weight"], b["priority_weight"])
        assert torch.equal(a["obs"], b["obs"])


def test_prioritized_buffer_checkpoint_round_trip(tmp_path):
    def build():
        return TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(50),
                                                 batch_size=16,
                                                 generator=torch.Generator().manual_seed(2))

    rb = build()
    rb.extend(td(40, td_error=torch.rand(40) * 3))
    rb.update_tensordict_priority(rb.sample())
    rb.sampler.beta = 0.9
    rb.dumps(tmp_path)
    restored = build()
    restored.loads(tmp_path)
    assert restored.sampler.beta == 0.9 and restored.sampler.max_priority == rb.sampler.max_priority
    a, b = rb.sample(), restored.sample()
    assert torch.equal(a["index"], b["index"])
    assert torch.equal(a["write_generation"], b["write_generation"])
    # a restored buffer still detects stale updates of samples taken before the checkpoint
    rb.extend(td(10, td_error=torch.ones(10)))
    restored.extend(td(10, td_error=torch.ones(10)))
    a["td_error"] = torch.zeros(16)
    b["td_error"] = torch.zeros(16)
    rb.update_tensordict_priority(a)
    restored.update_tensordict_priority(b)
    assert torch.equal(priorities(rb), priorities(restored))


def test_loading_a_mismatched_checkpoint_changes_nothing(tmp_path):
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(20))
    rb.extend(torch.arange(5.0))
    rb.dumps(tmp_path)
    other = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(20),
                                    max_priority_within_buffer=True)
    other.extend(torch.arange(3.0))
    before = priorities(other).clone()
    with pytest.raises(CheckpointError):
        other.loads(tmp_path)
    assert len(other) == 3 and torch.equal(priorities(other), before)


# ---- threads ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_thread_extends_while_another_samples_and_updates(backend):
    capacity = 64
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(capacity),
                                           sampler_backend=backend, batch_size=16)
    rb.extend(td(8, td_error=torch.ones(8)))
    errors: list[BaseException] = []
    stop = threading.Event()

    def collector() -> None:
        try:
            for i in range(150):
                rb.extend(td(5, 8 + 5 * i, td_error=torch.rand(5) + 0.1))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
        finally:
            stop.set()

    def learner() -> None:
        try:
            while not stop.is_set():
                sample = rb.sample()
                assert bool((sample["index"] < len(rb)).all())
                sample["td_error"] = torch.rand(16) + 0.1
                rb.update_tensordict_priority(sample)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=collector), threading.Thread(target=learner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(rb) == capacity and rb.write_count == 8 + 150 * 5
    state = rb.sampler.state_dict()
    assert bool((state["priorities"] > 0).all())
    assert int(state["write_generation"].max()) == state["write_clock"]


def test_a_bad_priority_entry_is_named_in_the_error():
    # ("priority must be finite and >= 0" did not say which entry of the data it read)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=4,
                                sampler=PrioritizedSampler(8, alpha=0.7, beta=0.5),
                                priority_key="td_error")
    rb.extend(TensorDict({"x": torch.arange(8.0)}, [8]))
    sample = rb.sample()
    total = rb.sampler.total_priority
    sample["td_error"] = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    with pytest.raises(ValueError, match=r"data\['td_error'\]: priority must be finite"):
        rb.update_tensordict_priority(sample)
    assert rb.sampler.total_priority == total  # nothing updated
