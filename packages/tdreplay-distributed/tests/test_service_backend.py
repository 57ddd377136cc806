"""``ReplayBuffer(..., service_backend="ray")`` (the entry point this package installs) and
``update_if_present`` on Ray and sharded buffers."""

from __future__ import annotations

from functools import partial
from importlib import metadata

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer, service_backend, transport_backend
from tdreplay.distributed import RayReplayBuffer, ShardedReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictRoundRobinWriter

TRACKING = partial(TensorDictRoundRobinWriter, track_generations=True)


def test_the_ray_backend_is_an_installed_entry_point() -> None:
    names = {e.name: e.value for e in metadata.entry_points(group="tdreplay.service_backends")}
    assert names.get("ray") == "tdreplay.distributed.service:ray_service"


def test_service_backend_ray_serves_the_class_with_its_arguments(ray_session) -> None:
    rb = TensorDictReplayBuffer(storage=partial(LazyTensorStorage, 10), batch_size=3,
                                service_backend="ray",
                                service_backend_options={"remote_config": {"num_cpus": 0},
                                                         "call_timeout": 30.0})
    try:
        assert isinstance(rb, RayReplayBuffer)
        assert rb.service_backend == "ray" and rb.transport_kind == "ray"
        assert rb.actor_info["buffer_cls"] == "TensorDictReplayBuffer"
        assert rb.batch_size == 3 and rb.call_timeout == 30.0 and rb.max_size == 10
        td = TensorDict({"x": torch.arange(4.0)}, [4])
        assert rb.extend(td).tolist() == [0, 1, 2, 3]
        assert "index" not in td.keys()  # the caller's data is left as it is
        assert rb.sample().batch_size == torch.Size([3])
    finally:
        rb.close()


def test_context_managers_select_ray_and_its_transport(ray_session) -> None:
    with service_backend("ray"), transport_backend("ray"):
        rb = ReplayBuffer(storage=partial(LazyTensorStorage, 4))
    try:
        assert isinstance(rb, RayReplayBuffer)
        assert rb.extend(TensorDict({"x": torch.ones(2)}, [2])).tolist() == [0, 1]
    finally:
        rb.close()
    assert type(ReplayBuffer()) is ReplayBuffer  # outside the block: direct again


def test_ray_backend_refuses_what_it_does_not_offer(ray_session) -> None:
    with pytest.raises(ValueError, match="backend must be 'gloo'"):
        ReplayBuffer(service_backend="ray", transport="distributed",
                     transport_options={"backend": "nccl"})
    with pytest.raises(ValueError, match="takes no transport_options"):
        ReplayBuffer(service_backend="ray", transport_options={"timeout": 3.0})
    with pytest.raises(TypeError, match="Unexpected Ray replay-buffer service options"):
        ReplayBuffer(service_backend="ray", service_backend_options={"num_gpus": 1})
    with service_backend("ray"), pytest.raises(ValueError, match="enclosing service_backend"):
        ReplayBuffer(transport="thread")


def _td(values) -> TensorDict:
    values = torch.as_tensor(values, dtype=torch.float32)
    return TensorDict({"x": values, "version": torch.zeros(values.shape[0], dtype=torch.long)},
                      values.shape[:1])


def test_ray_update_if_present_patches_only_live_records(ray_session) -> None:
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 4), writer=TRACKING, batch_size=4,
                         replay_buffer_cls=TensorDictReplayBuffer)
    try:
        index = rb.extend(_td([0.0, 1.0, 2.0, 3.0]))
        sample = rb.sample()
        assert sample["index_generation"].tolist() == [0, 0, 0, 0]  # each row written once
        rb.extend(_td([-1.0]))  # row 0 rewritten: a handle taken before is stale
        result = rb.update_if_present(index=index, generation=torch.zeros(4, dtype=torch.long),
                                      patch={"x": torch.full((4,), 7.0)})
        assert result.updated.tolist() == [False, True, True, True]
        assert result.stale_count == 1
        assert rb[:]["x"].tolist() == [-1.0, 7.0, 7.0, 7.0]
        # versions: only a newer version is written, with the patch
        versioned = rb.update_if_present(
            index=index[1:], generation=torch.zeros(3, dtype=torch.long),
            patch={"x": torch.full((3,), 9.0)}, version_key="version",
            version=torch.tensor([1, 0, 1]), require_newer=True)
        assert versioned.updated.tolist() == [True, False, True]
        assert versioned.version_rejected.tolist() == [False, True, False]
        assert rb[:]["x"].tolist() == [-1.0, 9.0, 7.0, 9.0]
        assert rb[:]["version"].tolist() == [0, 1, 0, 1]
        with pytest.raises(KeyError, match="not an entry"):
            rb.update_if_present(index=index, generation=torch.zeros(4, dtype=torch.long),
                                 patch={"nope": torch.zeros(4)})
        assert rb[:]["x"].tolist() == [-1.0, 9.0, 7.0, 9.0]  # refused: nothing written
    finally:
        rb.close()


def test_sharded_update_if_present_routes_global_slots(ray_session) -> None:
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 3), writer=TRACKING,
                             replay_buffer_cls=TensorDictReplayBuffer, batch_size=4)
    try:
        first = rb.extend(_td([0.0, 1.0]))   # shard 0: global slots 0, 1
        second = rb.extend(_td([2.0, 3.0]))  # shard 1: global slots 3, 4
        assert first.tolist() == [0, 1] and second.tolist() == [3, 4]
        index = torch.tensor([4, 0, 3, 1])
        generation = torch.zeros(4, dtype=torch.long)  # every row written once: generation 0
        rb.extend(_td([5.0]))  # shard 0, slot 2 (untouched by the patch below)
        result = rb.update_if_present(index=index, generation=generation,
                                      patch={"x": torch.tensor([40.0, 0.5, 30.0, 10.0])})
        assert result.updated.tolist() == [True, True, True, True]
        assert sorted(rb.shards[0][:]["x"].tolist()) == [0.5, 5.0, 10.0]
        assert sorted(rb.shards[1][:]["x"].tolist()) == [30.0, 40.0]
        stale = rb.update_if_present(index=torch.tensor([0, 3]),
                                     generation=torch.tensor([1, 0]),
                                     patch={"x": torch.tensor([-5.0, -6.0])})
        assert stale.updated.tolist() == [False, True] and stale.stale_count == 1
        assert rb.shards[1][:]["x"].tolist()[0] == -6.0
        with pytest.raises(ValueError, match="shaped like the index"):
            rb.update_if_present(index=torch.tensor([0, 3]), generation=torch.zeros(2, dtype=torch.long),
                                 patch={"x": torch.zeros(3)})
    finally:
        rb.close()


def test_sharded_update_if_present_takes_a_list_of_versions(ray_session) -> None:
    # (a list, one version per record, went whole to every shard, which refused its shape)
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 3), writer=TRACKING,
                             replay_buffer_cls=TensorDictReplayBuffer, batch_size=4)
    try:
        rb.extend(_td([0.0, 1.0]))   # shard 0: global slots 0, 1
        rb.extend(_td([2.0, 3.0]))   # shard 1: global slots 3, 4
        result = rb.update_if_present(index=torch.tensor([0, 1, 3, 4]),
                                      generation=torch.zeros(4, dtype=torch.long),
                                      patch={"x": torch.tensor([10.0, 11.0, 12.0, 13.0])},
                                      version_key="version", version=[5, 5, 5, 5])
        assert result.updated.tolist() == [True, True, True, True]
        assert rb.shards[0][:]["version"].tolist() == [5, 5]
        assert rb.shards[1][:]["x"].tolist() == [12.0, 13.0]
    finally:
        rb.close()
