"""The actor-side BufferServer, run in this process: building, forwarding, sampling mass."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.distributed._server import BufferServer, build_component, seeded_generator
from tdreplay.distributed._wire import pack, unpack
from tdreplay.samplers import PrioritizedSampler, TensorDictPrioritizedReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter


def test_components_are_built_from_classes_partials_and_factories():
    assert isinstance(build_component(RandomSampler, "sampler"), RandomSampler)
    storage = build_component(partial(ListStorage, 7), "storage")
    assert isinstance(storage, ListStorage) and storage.max_size == 7
    assert build_component(lambda: ListStorage(3), "storage").max_size == 3
    ready = ListStorage(2)
    assert build_component(ready, "storage") is ready
    assert build_component(None, "writer") is None
    assert isinstance(build_component(partial(seeded_generator, 3), "generator"), torch.Generator)


def test_a_factory_returning_the_wrong_type_is_named_in_the_error():
    with pytest.raises(TypeError, match="storage factory .* returned a int, expected a Storage"):
        build_component(lambda: 42, "storage")
    with pytest.raises(TypeError, match="sampler must be a Sampler, a Sampler class or a factory"):
        build_component(3.5, "sampler")


def test_construction_errors_are_raised_by_describe():
    server = BufferServer(ReplayBuffer, {"storage": lambda: "not a storage"}, {})
    with pytest.raises(TypeError, match="returned a str"):
        server.describe()
    server = BufferServer(ReplayBuffer, {"batch_size": 0}, {})
    with pytest.raises(ValueError, match="batch_size"):
        server.describe()


def test_describe_reports_the_buffer():
    server = BufferServer(TensorDictReplayBuffer,
                          {"storage": partial(LazyTensorStorage, 12), "batch_size": 4},
                          {"shard": 1, "num_shards": 2})
    info = server.describe()
    assert info["buffer_cls"] == "TensorDictReplayBuffer"
    assert info["batch_size"] == 4 and info["max_size"] == 12
    assert info["priority_key"] == "td_error" and info["is_prioritized"] is False
    assert info["update_keys"] == ()
    assert info["meta"] == {"shard": 1, "num_shards": 2}


def test_extend_and_add_return_only_the_slots_and_the_mass():
    server = BufferServer(TensorDictReplayBuffer, {"storage": partial(LazyTensorStorage, 10)}, {})
    td = TensorDict({"obs": torch.arange(4.0)}, [4])
    reply = unpack(server.extend(pack(td), {}))
    assert len(reply) == 2  # no bookkeeping entries travel back (TorchRL 0.14.1)
    slots, mass = reply
    assert mass == (4.0, 1.0, 4, None)  # (sum, min, len, max priority): 4 uniform slots
    assert slots.tolist() == [0, 1, 2, 3]
    assert "index" not in td.keys()  # the caller's data is left as it is
    reply = unpack(server.add(pack(TensorDict({"obs": torch.tensor(4.0)}, []))))
    assert len(reply) == 2
    index, mass = reply
    assert int(index) == 4 and mass == (5.0, 1.0, 5, None)
    data, info = unpack(server.sample(6, False))
    assert torch.equal(data["obs"], info["index"].float())


def test_rows_a_max_value_writer_does_not_keep_are_minus_one_and_get_no_lifted_priority():
    server = BufferServer(TensorDictPrioritizedReplayBuffer, {
        "storage": partial(LazyTensorStorage, 3), "alpha": 1.0, "beta": 0.4,
        "writer": partial(TensorDictMaxValueWriter, rank_key="rank"),
        "sampler_backend": "torch"}, {})
    ranked = lambda ranks: TensorDict({"rank": torch.tensor(ranks)}, [len(ranks)])  # noqa: E731
    slots, mass = unpack(server.extend(pack(ranked([5.0, 1.0, 3.0])), {}, None, 2.0))
    assert slots.tolist() == [0, 1, 2] and mass == pytest.approx((6.0, 2.0, 3, 2.0))
    # full: only rank 4 is kept (it replaces rank 1, slot 1); the global max lifts only it
    td = ranked([0.5, 4.0, 0.2])
    slots, mass = unpack(server.extend(pack(td), {}, None, 6.0))
    assert slots.tolist() == [-1, 1, -1]  # one entry per batch row, -1: not kept
    assert mass == pytest.approx((10.0, 2.0, 3, 6.0))  # slot 2 (the -1 rows' wrap) kept its 2
    assert "index" not in td.keys()
    index, mass = unpack(server.add(pack(TensorDict({"rank": torch.tensor(0.1)}, [])), None, 9.0))
    assert index is None and mass == pytest.approx((10.0, 2.0, 3, 6.0))  # not kept: unchanged
    index, mass = unpack(server.add(pack(TensorDict({"rank": torch.tensor(7.0)}, [])), None, 9.0))
    assert int(index) == 2 and mass == pytest.approx((17.0, 2.0, 3, 9.0))  # replaced rank 3


def test_a_list_storage_keeps_private_copies_of_received_items():
    server = BufferServer(ReplayBuffer, {"storage": partial(ListStorage, 10)}, {})
    items = [torch.tensor(1.0), torch.tensor(2.0)]
    packed = pack(items)
    server.extend(packed, {})
    stored = server.buffer.storage.get(torch.tensor([0, 1]))
    message = {b.ctypes.data for b in packed.buffers}
    assert all(t.data_ptr() not in message for t in stored)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_sampling_mass_of_a_prioritized_buffer_is_its_priority_sum(backend):
    alpha, eps = 0.7, 1e-8
    server = BufferServer(ReplayBuffer, {
        "storage": partial(LazyTensorStorage, 8),
        "sampler": partial(PrioritizedSampler, 8, alpha=alpha, beta=0.5, backend=backend),
    }, {})
    assert server.sampling_mass() == (0.0, math.inf, 0, 1.0)
    server.extend(pack(torch.arange(5.0)), {})
    priority = torch.tensor([0.5, 2.0, 1.0, 4.0, 0.25])
    server.update_priority(pack(torch.arange(5)), pack(priority), pack({}))
    total, minimum, length, top = server.sampling_mass()
    assert top == 4.0  # the max priority, reported for the sharded buffer's global max
    leaves = (priority.double() + eps) ** alpha
    assert length == 5
    assert total == pytest.approx(float(leaves.sum()), rel=1e-9)
    assert minimum == pytest.approx(float(leaves.min()), rel=1e-9)


def test_sampling_mass_of_other_samplers_is_the_number_of_written_slots():
    server = BufferServer(ReplayBuffer, {"storage": partial(ListStorage, 8)}, {})
    server.extend(pack([1, 2, 3]), {})
    assert server.sampling_mass() == (3.0, 1.0, 3, None)


def test_sample_with_mass_returns_the_shard_minimum_and_beta():
    server = BufferServer(TensorDictPrioritizedReplayBuffer, {
        "storage": partial(LazyTensorStorage, 8), "alpha": 1.0, "beta": 0.4,
        "sampler_backend": "torch"}, {})
    server.extend(pack(TensorDict({"x": torch.arange(3.0), "td_error": torch.tensor(
        [1.0, 2.0, 4.0])}, [3])), {})
    data, info, (total, minimum), beta, top = unpack(server.sample(5, True))
    assert top == 4.0
    assert beta == 0.4
    assert total == pytest.approx(7.0) and minimum == pytest.approx(1.0)
    assert data.batch_size == torch.Size([5]) and info["index"].shape == (5,)


def test_sample_part_reports_the_mass_at_the_draw_and_draws_nothing_when_asked_for_none():
    server = BufferServer(TensorDictPrioritizedReplayBuffer, {
        "storage": partial(LazyTensorStorage, 8), "alpha": 1.0, "beta": 0.4,
        "sampler_backend": "torch"}, {})
    assert server.describe()["independent_draws"] is True
    _, mass = unpack(server.extend(pack(TensorDict({"x": torch.arange(3.0), "td_error":
                                                    torch.tensor([1.0, 2.0, 4.0])}, [3])), {}))
    assert mass == pytest.approx((7.0, 1.0, 3, 4.0))
    data, info, mass, beta = unpack(server.sample_part(5))
    assert data.batch_size == torch.Size([5]) and info["index"].shape == (5,)
    assert mass == pytest.approx((7.0, 1.0, 3, 4.0)) and beta == 0.4
    assert unpack(server.sample_part(0)) == (None, None, mass, 0.4)
    mass = server.update_priority(pack(torch.tensor([0])), pack(torch.tensor([9.0])), pack({}))
    assert mass == pytest.approx((15.0, 2.0, 3, 9.0))
    mass = server.empty(True)
    assert mass[:3] == (0.0, math.inf, 0)
    assert unpack(server.sample_part(4)) == (None, None, mass, 0.4)  # empty: nothing drawn


def test_only_samplers_with_independent_draws_let_a_sharded_client_draw_more_than_it_keeps():
    def independent(sampler):
        server = BufferServer(ReplayBuffer, {"storage": partial(ListStorage, 8),
                                             "sampler": sampler}, {})
        return server.describe()["independent_draws"]

    assert independent(RandomSampler) is True
    assert independent(partial(PrioritizedSampler, 8, alpha=0.7, beta=0.5)) is True
    assert independent(SamplerWithoutReplacement) is False


def test_update_tensordict_priority_needs_a_tensordict_buffer():
    server = BufferServer(ReplayBuffer, {"storage": partial(ListStorage, 8)}, {})
    with pytest.raises(TypeError, match="no update_tensordict_priority"):
        server.update_tensordict_priority(pack(TensorDict({"index": torch.zeros(1)}, [1])))


def test_sampling_mass_needs_the_priority_mass_of_a_prioritized_sampler():
    class OpaquePrioritized(RandomSampler):
        is_prioritized = True  # keeps priorities, but tells nothing about their mass

    server = BufferServer(ReplayBuffer, {"storage": partial(ListStorage, 8),
                                         "sampler": OpaquePrioritized}, {})
    server.extend(pack([1, 2, 3]), {})
    with pytest.raises(TypeError, match="total_priority and min_priority"):
        server.sampling_mass()
