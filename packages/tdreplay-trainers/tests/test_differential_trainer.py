"""Differential tests of the trainer hook (``ReplayBufferTrainer``): a seeded run of the hook's
ops (``extend`` each collected batch, then ``optim_steps`` times ``sample`` and
``update_priority`` from a loss computed from the batch) is compared with the same run whose
hook state (``state_dict``, as a trainer checkpoint saves it, or ``dumps`` / ``loads``, or a
whole ``Trainer`` checkpoint) is restored into a fresh hook and buffer at a random step: the
continued run must sample the same batches (values, ``index``, ``priority_weight``) and write
the same priorities back.

Buffers: ``TensorDictPrioritizedReplayBuffer`` over list and lazy tensor storages, and a plain ``TensorDictReplayBuffer``; each with a seeded generator
(its state is part of the buffer's ``state_dict``). Not with ``prefetch``: a batch drawn ahead
races the priority updates made meanwhile (documented), so even an unrestored run is not
reproducible.

The first tests are focused reproductions of divergences found (xfail until fixed), if any;
the last ones guard the behaviours that agree.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.trainers import ReplayBufferTrainer, Trainer

samplers = pytest.importorskip("tdreplay.samplers")
storages = pytest.importorskip("tdreplay.storages")

BATCH = 8


def _buffer(kind, prefetch, seed=0):
    gen = torch.Generator().manual_seed(seed)
    storage = (ListStorage(60) if kind.startswith("list") else storages.LazyTensorStorage(60))
    if kind.endswith("plain"):
        return TensorDictReplayBuffer(storage=storage, prefetch=prefetch, generator=gen)
    return samplers.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage,
                                                      prefetch=prefetch, generator=gen)


def _priorities(rb):
    """The priorities written back (the prioritized sampler's saved priorities)."""
    return torch.as_tensor(rb.sampler.state_dict()["priorities"])


def _collector(seed, n=8):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.randint(3, 9)
        x = torch.arange(size, dtype=torch.float32) + 100 * i
        out.append(TensorDict({"x": x, "y": x.remainder(7)}, [size]))
    return out


def _loss(batch):
    """A deterministic loss: the td_error depends only on the sampled values."""
    return (batch["y"] + 0.5 + batch["x"].remainder(3)) / 4


def _run(hook, collector, optim_steps, log, restore_at=None, restore=None):
    step = 0
    for batch in collector:
        hook.extend(batch)
        for _ in range(optim_steps):
            if restore_at == step:
                hook = restore(hook)
            sub = hook.sample(batch)
            sub["td_error"] = _loss(sub)
            log.append((sub["x"].tolist(), sub["index"].tolist(),
                        sub.get("priority_weight", torch.zeros(())).tolist()))
            hook.update_priority(sub)
            step += 1
    return hook


def _restorer(kind, prefetch, how, tmp_path):
    def restore(hook):
        new = ReplayBufferTrainer(_buffer(kind, prefetch, seed=99), batch_size=BATCH)
        if how == "state_dict":
            new.load_state_dict(copy.deepcopy(hook.state_dict()))
        else:
            path = tmp_path / f"ckpt{random.random()}"
            hook.dumps(path)
            new.loads(path)
        return new
    return restore


@pytest.mark.parametrize("prefetch", [0])
@pytest.mark.parametrize("kind", ["list", "tensor", "tensor-plain"])
@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_restored_hook_continues_identically(kind, prefetch, how, tmp_path):
    for seed in range(3):
        collector = _collector(seed)
        full, resumed = [], []
        hook = _run(ReplayBufferTrainer(_buffer(kind, prefetch), batch_size=BATCH), collector,
                    3, full)
        at = random.Random(seed).randrange(1, 3 * len(collector))
        hook2 = _run(ReplayBufferTrainer(_buffer(kind, prefetch), batch_size=BATCH), collector,
                     3, resumed, restore_at=at, restore=_restorer(kind, prefetch, how, tmp_path))
        assert resumed == full, (seed, at)
        if not kind.endswith("plain"):
            # the priorities written back are the same
            assert torch.equal(_priorities(hook.replay_buffer), _priorities(hook2.replay_buffer))
        assert torch.equal(hook.replay_buffer[:]["x"], hook2.replay_buffer[:]["x"])


def _trainer(collector, rb, path, log):
    trainer = Trainer(collector=collector, optim_steps_per_batch=2, progress_bar=False,
                      loss_module=lambda td: TensorDict(
                          {"loss_x": (td["x"] * 0).sum().requires_grad_(),
                           "td_error": _loss(td)}, []),
                      optimizer=None, save_trainer_file=path)
    trainer.register_op("optimizer", lambda losses: losses)
    ReplayBufferTrainer(rb, batch_size=BATCH).register(trainer)
    trainer.register_op("post_optim_log", lambda sub: log.append(
        (sub["x"].tolist(), sub["index"].tolist(), sub["priority_weight"].tolist())) or {})
    return trainer


@pytest.mark.parametrize("suffix", ["ckpt", "ckpt.pt"])
def test_trainer_checkpoint_resumes_identically(tmp_path, suffix):
    collector = _collector(5)
    full, first, rest = [], [], []
    rb_full = _buffer("tensor", 0)
    _trainer(collector, rb_full, None, full).train()
    path = str(tmp_path / suffix)
    _trainer(collector[:4], _buffer("tensor", 0), path, first).train()
    rb2 = _buffer("tensor", 0, seed=42)
    resumed = _trainer(collector[4:], rb2, path, rest)
    resumed.load_from_file(path)
    resumed.train()
    assert first + rest == full
    assert torch.equal(_priorities(rb2), _priorities(rb_full))
