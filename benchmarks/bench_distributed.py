"""Distributed replay: one Ray actor buffer fed by 2 collector processes while 1 learner samples.

One ``RayReplayBuffer`` (TensorDictReplayBuffer on a 200,000-row LazyTensorStorage, transition
rows of ~300 bytes) on a local, loopback-only Ray instance. Reported:

- concurrent: 2 collector processes extend 1,000-row batches as fast as they can while the
  learner (this process) calls ``sample(256)``: extend rows/s (both collectors) and sample/s;
- alone: the same calls from this process with nothing else running, and ``sample(256)``
  from a client with ``prefetch=2`` (two more calls in flight);
- payload: ``extend`` of 64 frames of 84x84x4 uint8 (1.8 MB a call), MB/s through the
  object store;
- single vs sharded (``--sharded`` runs only this part): a ``RayReplayBuffer`` of 100,000 rows
  against a ``ShardedReplayBuffer`` of 2 x 50,000, both filled, from this process alone:
  extend rows/s (1,000-row batches), ``sample(256)`` calls/s without and with
  ``prefetch=2`` (sharded prefetch is new in issue 21; before it, "n/a").

Every figure includes Ray's round trip; on a 2-core machine the collectors, the learner and the
actor share the two cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on 127.0.0.1 only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import multiprocessing  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402

import torch  # noqa: E402
from _common import rate, report, transition_batch, transition_batches  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from tdreplay.core import TensorDictReplayBuffer  # noqa: E402
from tdreplay.distributed import RayReplayBuffer  # noqa: E402
from tdreplay.storages import LazyTensorStorage  # noqa: E402

NAMESPACE = "tdreplay-bench"
NAME = "bench-buffer"
CAPACITY = 200_000
BATCH = 1_000
WINDOW = 8.0  # seconds of the concurrent phase


def collector(address: str, ready, start, stop_at, rows) -> None:
    """A collector process: attach by name, extend 1,000-row batches until ``stop_at``."""
    import ray

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    rb = RayReplayBuffer.attach(NAME)
    batches = transition_batches(BATCH)
    rb.extend(next(batches))  # warm
    ready.release()
    start.wait()
    written = 0
    while time.time() < stop_at.value:
        rb.extend(next(batches))
        written += BATCH
    rows.put(written)
    ray.shutdown()


def concurrent(ray, rb: RayReplayBuffer) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, start = ctx.Semaphore(0), ctx.Event()
    stop_at, rows = ctx.Value("d", 0.0), ctx.Queue()
    address = ray.get_runtime_context().gcs_address
    procs = [ctx.Process(target=collector, args=(address, ready, start, stop_at, rows))
             for _ in range(2)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    begin = time.time()
    stop_at.value = begin + WINDOW
    start.set()
    samples = 0
    while time.time() < stop_at.value:
        rb.sample(256)
        samples += 1
    elapsed = time.time() - begin
    written = sum(rows.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    report("distributed/concurrent/extend_1k_rows", written / WINDOW, "rows/s",
           collectors=2, learners=1)
    report("distributed/concurrent/sample_256", samples / elapsed, "calls/s",
           collectors=2, learners=1)


def sharded_comparison() -> None:
    """Throughput of one buffer actor against two shards (issue 21 item 3)."""
    from tdreplay.distributed import ShardedReplayBuffer

    storage = partial(LazyTensorStorage, 100_000)
    half = partial(LazyTensorStorage, 50_000)
    single = RayReplayBuffer(storage=storage, replay_buffer_cls=TensorDictReplayBuffer,
                             batch_size=256, name="bench-single")
    sharded = ShardedReplayBuffer(num_shards=2, storage=half, batch_size=256,
                                  replay_buffer_cls=TensorDictReplayBuffer, name="bench-sharded")
    for rb in (single, sharded):
        for _ in range(10):
            rb.extend(transition_batch(10_000))
    for label, rb in (("single", single), ("sharded_2", sharded)):
        batches = transition_batches(BATCH)
        report(f"distributed/{label}/extend_1k_rows",
               rate(lambda rb=rb: rb.extend(next(batches)), min_time=3.0) * BATCH, "rows/s")
        report(f"distributed/{label}/sample_256",
               rate(lambda rb=rb: rb.sample(256), min_time=3.0), "calls/s")
    prefetched = RayReplayBuffer.attach("bench-single", prefetch=2)
    report("distributed/single/sample_256_prefetch_2", rate(prefetched.sample, min_time=3.0),
           "calls/s")
    try:
        sharded_ahead = ShardedReplayBuffer.attach("bench-sharded", prefetch=2)
    except TypeError:  # before issue 21: no prefetch for sharded buffers
        print('{"name": "distributed/sharded_2/sample_256_prefetch_2", "value": "n/a"}')
    else:
        report("distributed/sharded_2/sample_256_prefetch_2",
               rate(sharded_ahead.sample, min_time=3.0), "calls/s")
    single.shutdown()
    sharded.shutdown()


def main() -> None:
    import ray

    if "--sharded" in sys.argv:
        ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
                 object_store_memory=512 * 1024**2)
        sharded_comparison()
        ray.shutdown()
        return

    ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
             object_store_memory=512 * 1024**2)
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, CAPACITY),
                         replay_buffer_cls=TensorDictReplayBuffer, batch_size=256, name=NAME)
    for _ in range(CAPACITY // 10_000):
        rb.extend(transition_batch(10_000))

    concurrent(ray, rb)

    batches = transition_batches(BATCH)
    report("distributed/alone/extend_1k_rows",
           rate(lambda: rb.extend(next(batches)), min_time=3.0) * BATCH, "rows/s")
    report("distributed/alone/sample_256", rate(lambda: rb.sample(256), min_time=3.0), "calls/s")
    learner = RayReplayBuffer.attach(NAME, prefetch=2)  # 2 more sample calls in flight
    report("distributed/alone/sample_256_prefetch_2", rate(learner.sample, min_time=3.0),
           "calls/s")

    frames = RayReplayBuffer(storage=partial(LazyTensorStorage, 2_000),
                             replay_buffer_cls=TensorDictReplayBuffer)
    pixels = TensorDict({"pixels": torch.randint(0, 256, (64, 84, 84, 4), dtype=torch.uint8)},
                        [64])
    calls = rate(lambda: frames.extend(pixels), min_time=3.0)
    report("distributed/alone/extend_84x84x4_frames", calls * pixels.bytes() / 1e6, "MB/s",
           frames_per_call=64)
    frames.shutdown()
    rb.shutdown()
    sharded_comparison()
    ray.shutdown()


if __name__ == "__main__":
    main()
