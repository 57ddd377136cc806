"""Uniform replay end to end, through the ``tdreplay.data`` facade.

A collector thread extends a ``LazyTensorStorage`` buffer while a learner thread samples from
it; every sampled transition must be whole and sit where it was written. A buffer saved in
the middle of a stream and restored into a fresh buffer continues exactly like the original.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from tensordict import TensorDict

from tdreplay.data import (
    LazyTensorStorage,
    RandomSampler,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)

ENVS = 4
T = 8


def rollout(i: int, ndim: int) -> TensorDict:
    """Rollout ``i`` of ``ENVS`` environments for ``T`` steps, as a collector would return it.

    Transition number ``k`` (C-order over ``[ENVS, T]``) holds ``obs == k``,
    ``next.obs == k + 1`` and ``reward == -k``; ``ndim == 1`` flattens it to ``[ENVS * T]``.
    """
    k = (i * ENVS * T + torch.arange(ENVS * T)).reshape(ENVS, T)
    td = TensorDict(
        {
            "k": k,
            "obs": k[..., None].float().expand(ENVS, T, 6).clone(),
            "action": (k % 3)[..., None].expand(ENVS, T, 2).clone(),
            ("next", "obs"): (k + 1)[..., None].float().expand(ENVS, T, 6).clone(),
            ("next", "reward"): -k[..., None].float(),
            ("next", "done"): (torch.arange(T) == T - 1).expand(ENVS, T)[..., None].clone(),
        },
        [ENVS, T],
    )
    return td if ndim == 2 else td.reshape(-1)


def write_order(k: torch.Tensor, ndim: int) -> torch.Tensor:
    """Position of transition ``k`` in write order: ``k`` itself for a flat storage; for
    ``ndim == 2`` the storage is time-major as TorchRL's (``dim_extend``: a row per time step,
    ``ENVS`` slots in it), so step ``t`` of env ``e`` in rollout ``i`` is number
    ``(i * T + t) * ENVS + e``."""
    if ndim == 1:
        return k
    i, rest = k // (ENVS * T), k % (ENVS * T)
    return (i * T + rest % T) * ENVS + rest // T


def check_transitions(batch: TensorDict, capacity_slots: int, ndim: int) -> None:
    k = batch["k"]
    assert torch.equal(batch["obs"], k[:, None].float().expand_as(batch["obs"]))
    assert torch.equal(batch["next", "obs"], batch["obs"] + 1)
    assert torch.equal(batch["next", "reward"], -k[:, None].float())
    assert torch.equal(batch["action"], (k % 3)[:, None].expand_as(batch["action"]))
    # transitions are written in order, so the n-th one written sits at slot n % capacity
    assert torch.equal(write_order(k, ndim) % capacity_slots, batch["index"])


@pytest.mark.parametrize("ndim", [1, 2])
def test_collector_and_learner_threads(ndim):
    capacity = 512
    rollouts = 150
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, ndim=ndim),
                                writer=TensorDictRoundRobinWriter(), batch_size=128)
    rb.extend(rollout(0, ndim))
    done = threading.Event()
    errors: list[BaseException] = []
    learned = []

    def collector() -> None:
        try:
            for i in range(1, rollouts):
                data = rollout(i, ndim)
                slots = rb.extend(data)
                assert slots.shape == data.shape  # [ENVS*T] or [ENVS, T]
        except BaseException as err:  # noqa: BLE001 - reported in the main thread
            errors.append(err)
        finally:
            done.set()

    def learner() -> None:
        try:
            while not done.is_set():
                batch = rb.sample()
                assert batch.batch_size == torch.Size([128])
                check_transitions(batch, capacity, ndim)
                learned.append(int(batch["k"].max()))
        except BaseException as err:  # noqa: BLE001 - reported in the main thread
            errors.append(err)
            done.set()

    threads = [threading.Thread(target=collector), threading.Thread(target=learner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
    assert learned  # the learner sampled while the collector wrote
    total = rollouts * ENVS * T
    # a time-major ndim=2 storage counts rows (time steps of every env) as written items
    assert len(rb) == capacity and rb.write_count == total // (ENVS if ndim == 2 else 1)
    # the storage holds the last `capacity` transitions, each at its slot
    stored = rb[:].reshape(-1)
    assert sorted(stored["k"].tolist()) == list(range(total - capacity, total))
    assert torch.equal(write_order(stored["k"], ndim) % capacity, stored["index"].reshape(-1))


def test_iteration_without_replacement_covers_each_transition_once():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=32,
                                sampler=SamplerWithoutReplacement())
    rb.extend(rollout(0, 1))
    rb.extend(rollout(1, 1))
    rb.extend(rollout(2, 1))  # 96 transitions
    batches = list(rb)
    assert len(batches) == math.ceil(96 / 32)
    seen = torch.cat([b["k"] for b in batches])
    assert sorted(seen.tolist()) == list(range(96))


def _run(rb: TensorDictReplayBuffer, start: int, stop: int, ndim: int) -> list:
    """Extend with rollouts ``start .. stop - 1``, sampling after each; return what happened."""
    trace = []
    for i in range(start, stop):
        slots = rb.extend(rollout(i, ndim))
        batch = rb.sample()
        check_transitions(batch, rb.storage.max_size, ndim)
        trace.append((slots.tolist(), batch["k"].tolist(), rb.write_count, len(rb)))
    return trace


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("sampler", [RandomSampler, SamplerWithoutReplacement])
@pytest.mark.parametrize("writer", [RoundRobinWriter, TensorDictRoundRobinWriter])
def test_save_and_restore_mid_stream_continues_identically(tmp_path, ndim, sampler, writer):
    def make(seed: int) -> TensorDictReplayBuffer:
        return TensorDictReplayBuffer(storage=LazyTensorStorage(160, ndim=ndim), sampler=sampler(),
                                      writer=writer(), batch_size=24,
                                      generator=torch.Generator().manual_seed(seed))

    original = make(seed=0)
    _run(original, 0, 7, ndim)  # wraps around: 7 * 32 transitions into 160 slots
    original.dumps(tmp_path / "ckpt")
    expected = _run(original, 7, 14, ndim)

    restored = make(seed=12345)
    restored.extend(rollout(99, ndim))  # whatever it held is replaced
    restored.loads(tmp_path / "ckpt")
    assert _run(restored, 7, 14, ndim) == expected
    a, b = restored[:], original[:]
    assert (a == b).all()
