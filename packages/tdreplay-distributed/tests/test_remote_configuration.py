"""Configuring a served buffer (TorchRL's RayReplayBuffer forwards these): transforms, save /
load hooks, the sampler's generator, ``synchronize``, ``start`` and ``shutdown(timeout)``."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.distributed import RayReplayBuffer
from tdreplay.distributed._server import BufferServer
from tdreplay.distributed._wire import pack, unpack
from tdreplay.samplers import PrioritizedSampler


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _items(n: int) -> list[torch.Tensor]:
    return [torch.tensor(i) for i in range(n)]


def test_the_server_runs_configuration_calls_only():
    server = BufferServer(ReplayBuffer, {"storage": partial(ListStorage, 4), "batch_size": 2}, {})
    server.configure("append_transform", pack(((torch.neg,), {})))
    server.configure("insert_transform", pack(((0, _double), {})))
    server.extend(pack(_items(4)[1:2] * 4), {})
    batch, _ = unpack(server.sample(None, False))
    assert batch.tolist() == [-2, -2]  # doubled, then negated
    with pytest.raises(ValueError, match="'extend' is not a configuration call"):
        server.configure("extend", pack(((_items(1),), {})))
    assert server.length() == 4  # the refused call wrote nothing


@pytest.fixture
def served(ray_session):
    rb = RayReplayBuffer(storage=partial(ListStorage, 10), batch_size=3)
    yield rb
    rb.close()


def test_transforms_run_in_the_actor(served):
    assert served.append_transform(torch.neg) is served
    assert served.insert_transform(0, _double) is served
    served.extend(_items(4)[3:] * 5)  # five 3s
    assert served.sample().tolist() == [-6, -6, -6]
    served.append_transform(_double, invert=True)  # on writes (of the batch, a tensor here)
    served.empty()
    served.extend(torch.ones(3, dtype=torch.long))
    assert len(served) == 3
    assert served.sample().tolist() == [-4, -4, -4]  # doubled on the way in and out


def test_the_generator_makes_remote_draws_repeatable(served):
    served.extend(_items(10))
    served.set_rng(torch.Generator().manual_seed(3))
    first = [served.sample().tolist() for _ in range(3)]
    served.set_rng(torch.Generator().manual_seed(3))
    assert [served.sample().tolist() for _ in range(3)] == first
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        served.set_rng(3)


def test_save_hooks_run_on_the_actors_checkpoint(served, tmp_path):
    served.extend(_items(3))
    served.register_save_hook(partial(_plus_ten))
    served.dumps(tmp_path / "ckpt")
    local = ReplayBuffer(storage=ListStorage(10))
    local.loads(tmp_path / "ckpt")
    assert [int(x) for x in local[:]] == [10, 11, 12]  # saved through the hook


def _plus_ten(items: list) -> list:
    return [x + 10 for x in items]


def test_synchronize_start_and_shutdown_with_a_timeout(served):
    assert served.can_sample() is False  # empty, of its batch size (3)
    served.extend(_items(2))
    assert served.can_sample() is True and served.can_sample(5) is True
    served.synchronize()  # nothing submitted: returns
    assert served.start() is served
    served.shutdown(timeout=1.0)
    with pytest.raises(Exception, match="dead|closed|shut"):
        served.sample()


def test_mark_update_reaches_the_actors_sampler(ray_session):
    # TorchRL's RayReplayBuffer forwards mark_update: a prioritized sampler in the actor gives
    # the slots the max priority again
    rb = RayReplayBuffer(storage=partial(ListStorage, 4),
                         sampler=partial(PrioritizedSampler, 4, alpha=1.0, beta=0.4),
                         batch_size=200)
    try:
        rb.extend(_items(4))
        rb.update_priority(torch.arange(4), torch.tensor([1e-8, 1e-8, 1e-8, 1.0]))
        assert set(rb.sample().tolist()) == {3}
        rb.mark_update(torch.tensor([0, 1]))
        assert set(rb.sample().tolist()) == {0, 1, 3}
        with pytest.raises(IndexError, match="index"):
            rb.mark_update(torch.tensor([9]))
    finally:
        rb.close()


def test_parts_are_replaced_in_the_actor_and_the_client_reads_the_new_description(served):
    from tdreplay.core import RandomSampler, RoundRobinWriter, SamplerWithoutReplacement
    served.extend(_items(4))
    served.set_storage(ListStorage(6))
    assert len(served) == 0 and served.max_size == 6  # the old storage's items went with it
    served.extend(_items(6))
    assert served.actor_info["is_prioritized"] is False
    served.set_sampler(PrioritizedSampler(6, alpha=1.0, beta=0.4))
    assert served.actor_info["is_prioritized"] is True
    served.update_priority(torch.arange(6), torch.tensor([1e-8] * 5 + [1.0]))
    assert set(served.sample(100).tolist()) == {5}
    served.set_writer(RoundRobinWriter())  # a fresh cursor: the next write goes to slot 0
    assert served.extend([torch.tensor(40)]).tolist() == [0]
    assert served[0].item() == 40
    for bad, name in [(RandomSampler(), "storage"), (ListStorage(2), "sampler"),
                      (RandomSampler(), "writer")]:
        with pytest.raises(TypeError, match=f"{name} must be a"):
            getattr(served, f"set_{name}")(bad)
    assert served.max_size == 6 and len(served) == 6
    unbatched = RayReplayBuffer(storage=partial(ListStorage, 4))
    try:
        unbatched.extend(_items(4))
        with pytest.raises(ValueError, match="batch"):  # refused in the actor: sampler kept
            unbatched.set_sampler(SamplerWithoutReplacement(drop_last=True))
        assert len(unbatched.sample(4)) == 4
        assert unbatched.actor_info["finite_epochs"] is False
    finally:
        unbatched.close()
