"""Boolean arguments of the trainers take a bool (or a numpy bool) and nothing else: ``"yes"``,
``1``, ``"False"`` (truthy in TorchRL) or ``None`` raise a ``TypeError`` naming the argument
before anything is built or saved."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tdreplay.core import ListStorage, TensorDictReplayBuffer, testing
from tdreplay.trainers import OptimizerHook, ReplayBufferTrainer, Trainer

BAD = testing.NOT_BOOLS
GOOD = testing.BOOLS


def trainer(loss_module: Any, **kwargs: Any) -> Trainer:
    kwargs.setdefault("progress_bar", False)
    return Trainer(collector=[], optim_steps_per_batch=1, loss_module=loss_module,
                   optimizer=torch.optim.SGD(loss_module.parameters(), lr=0.1), **kwargs)


def rb_trainer(**kwargs: Any) -> ReplayBufferTrainer:
    return ReplayBufferTrainer(TensorDictReplayBuffer(storage=ListStorage(10)), batch_size=2,
                               **kwargs)


def optimizer_hook(loss_module: Any, **kwargs: Any) -> OptimizerHook:
    return OptimizerHook(torch.optim.SGD(loss_module.parameters(), lr=0.1), **kwargs)


CONSTRUCTORS: list[tuple[str, Callable[..., Any], str]] = [
    ("Trainer", trainer, "clip_grad_norm"),
    ("Trainer", trainer, "progress_bar"),
    ("OptimizerHook", optimizer_hook, "clip_grad_norm"),
    ("ReplayBufferTrainer", lambda loss, **kw: rb_trainer(**kw), "memmap"),
    ("ReplayBufferTrainer", lambda loss, **kw: rb_trainer(**kw), "flatten_tensordicts"),
]
IDS = [f"{c[0]}-{c[2]}" for c in CONSTRUCTORS]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("owner, build, name", CONSTRUCTORS, ids=IDS)
def test_constructors_refuse_a_flag_that_is_not_a_bool(loss_module, owner, build, name, value):
    with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
        build(loss_module, **{name: value})


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("owner, build, name", CONSTRUCTORS, ids=IDS)
def test_constructors_take_bools_and_numpy_bools(loss_module, owner, build, name, value):
    obj = build(loss_module, **{name: value})
    got = getattr(obj, name)
    assert type(got) is bool and got == bool(value)


@pytest.mark.parametrize("value", BAD)
def test_save_trainer_refuses_a_force_save_that_is_not_a_bool(loss_module, tmp_path, value):
    t = trainer(loss_module, save_trainer_file=tmp_path / "trainer.pt")
    with pytest.raises(TypeError, match="force_save must be a bool, got"):
        t.save_trainer(force_save=value)
    assert not (tmp_path / "trainer.pt").exists()


@pytest.mark.parametrize("value", GOOD)
def test_save_trainer_takes_bools_and_numpy_bools(loss_module, tmp_path, value):
    t = trainer(loss_module, save_trainer_file=tmp_path / "trainer.pt")
    t.save_trainer(force_save=value)
    assert (tmp_path / "trainer.pt").exists() is bool(value)
