"""Test setup of tdreplay-distributed: one local, loopback-only Ray instance per test session.

Loaded for the doctests of ``src/`` and for ``tests/``. The environment is set before Ray is
imported (Ray reads it at import, and its worker processes inherit it):

- ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray's node address is 127.0.0.1, so every Ray
  process listens on and talks to the loopback interface only;
- ``RAY_USAGE_STATS_ENABLED=0``: no usage report is sent anywhere;
- ``tests/`` on ``PYTHONPATH`` (and ``sys.path``): buffer actors and spawned collector
  processes import the helpers of ``tests/distributed_workers.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from _pytest.doctest import DoctestItem

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
_TESTS = str(Path(__file__).resolve().parent / "tests")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_TESTS, os.environ.get("PYTHONPATH")) if p)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

RAY_NAMESPACE = "tdreplay-tests"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "multinode: starts a two-node Ray cluster on 127.0.0.1 "
                            "(a few, slow; deselect with -m 'not multinode')")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance (2 CPUs, no dashboard, loopback only), shut down at the end."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, namespace=RAY_NAMESPACE, log_to_driver=False,
             object_store_memory=256 * 1024**2)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _ray_for_doctests(request: pytest.FixtureRequest) -> None:
    """Doctests run on the session's Ray instance (their ray_init_config is then unused)."""
    if isinstance(request.node, DoctestItem):
        request.getfixturevalue("ray_session")


@pytest.fixture(scope="session")
def _shared_td_buffer(ray_session):
    from functools import partial

    from tdreplay.core import TensorDictReplayBuffer
    from tdreplay.distributed import RayReplayBuffer
    from tdreplay.storages import LazyTensorStorage

    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 20_000),
                         replay_buffer_cls=TensorDictReplayBuffer, batch_size=32,
                         name="shared-td")
    yield rb
    rb.shutdown()


@pytest.fixture
def shared_td(_shared_td_buffer):
    """The session's named TensorDict buffer actor ("shared-td", 20 000 rows), emptied.

    Every test writes batches of ``distributed_workers.make_batch`` to it.
    """
    _shared_td_buffer.call_timeout = 60.0
    _shared_td_buffer.empty()
    return _shared_td_buffer


@pytest.fixture(scope="session")
def prioritized_shards(ray_session):
    """The session's 3-shard prioritized TensorDict buffer "sharded" (8 rows a shard,
    alpha 2, beta 1, torch trees, batch 500, seeded); tests attach their own client."""
    from functools import partial

    import torch

    from tdreplay.distributed import ShardedReplayBuffer
    from tdreplay.samplers import TensorDictPrioritizedReplayBuffer
    from tdreplay.storages import LazyTensorStorage

    rb = ShardedReplayBuffer(num_shards=3, storage=partial(LazyTensorStorage, 8),
                             replay_buffer_cls=TensorDictPrioritizedReplayBuffer, alpha=2.0,
                             beta=1.0, sampler_backend="torch", batch_size=500,
                             name="sharded", generator=torch.Generator().manual_seed(0))
    yield rb
    rb.shutdown()
