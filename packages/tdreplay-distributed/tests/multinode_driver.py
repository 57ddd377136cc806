"""The driver of the multi-node test (run in its own process, connected to a two-node cluster).

Usage: ``python multinode_driver.py ADDRESS SHARED_DIR WORKER_RAYLET_PID WORKER_PORT``. Prints ``OK`` when
every check passed; any failure raises (non-zero exit).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from functools import partial

import ray
from distributed_workers import make_batch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.distributed import (
    RayReplayBuffer,
    RemoteBufferError,
    ShardedReplayBuffer,
    ShardsUnavailableWarning,
)
from tdreplay.storages import LazyTensorStorage


def until(call, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except (RemoteBufferError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main(address: str, shared: str, raylet_pid: int, worker_port: int) -> None:
    ray.init(address=address, namespace="tdreplay-multinode", log_to_driver=False)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2, nodes
    worker = next(n["NodeID"] for n in nodes if n["NodeManagerPort"] == worker_port)
    head = next(n["NodeID"] for n in nodes if n["NodeID"] != worker)
    # the worker node takes work (its resources reached the scheduler) before anything else
    on = ray.remote(num_cpus=0)(lambda: ray.get_runtime_context().get_node_id())
    for node in (head, worker):
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        assert ray.get(on.options(scheduling_strategy=strategy).remote(), timeout=120) == node
    storage = partial(LazyTensorStorage, 100)

    # placement: shards spread over the two nodes by default
    sharded = ShardedReplayBuffer(num_shards=2, storage=storage, batch_size=20,
                                  replay_buffer_cls=TensorDictReplayBuffer, name="mn")
    placed = [s.actor_info["node_id"] for s in sharded.shards]
    assert set(placed) == {head, worker}, (placed, head, worker)
    on_worker = next(k for k, s in enumerate(sharded.shards)
                     if s.actor_info["node_id"] == worker)
    sharded.extend(make_batch(0, 0, 10))
    sharded.extend(make_batch(1, 0, 10))
    sharded.dumps(os.path.join(shared, "sharded"))  # a path both nodes reach

    # a buffer on the worker node, restarted by Ray from its shared checkpoint_path
    for _ in range(10):  # soft affinity is a preference: try until it is on the worker
        single = RayReplayBuffer(
            storage=storage, replay_buffer_cls=TensorDictReplayBuffer, name="mn-single",
            checkpoint_path=os.path.join(shared, "single"),
            remote_config={"max_restarts": 1, "scheduling_strategy":
                           NodeAffinitySchedulingStrategy(worker, soft=True)})
        if single.actor_info["node_id"] == worker:
            break
        single.shutdown()
    assert single.actor_info["node_id"] == worker
    single.extend(make_batch(2, 0, 7))
    single.dumps()

    os.kill(raylet_pid, signal.SIGKILL)  # the worker node dies

    def moved():
        single.reconnect()
        assert single.actor_info["node_id"] == head

    until(moved)  # Ray restarted it on the head (max_restarts)...
    assert len(single) == 7  # ... restored from the shared checkpoint_path

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = until(lambda: sharded.sample())
    assert any(issubclass(w.category, ShardsUnavailableWarning) for w in caught)
    assert sharded.dead_shards == (on_worker,)
    assert set(data["collector"].tolist()) == {1 - on_worker}
    sharded.respawn(os.path.join(shared, "sharded"))  # only the dead shard, on the head
    assert sharded.dead_shards == () and len(sharded) == 20
    assert sharded.shards[on_worker].actor_info["node_id"] == head
    sharded.shutdown()
    single.shutdown()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
