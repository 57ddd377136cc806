"""A trainer that saves itself refuses to train when its checkpoints would miss parameters the
optimizer steps (a loss module that is a plain function: the guide's own example saved the
optimizer's moments and the buffer, not the network, and a resumed run paired them with fresh
weights)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from tdreplay.core import ListStorage, TensorDictReplayBuffer
from tdreplay.trainers import ReplayBufferTrainer, Trainer


def _collector():
    torch.manual_seed(0)
    return [TensorDict({"x": (x := torch.randn(8, 1)), "y": 3 * x}, [8]) for _ in range(6)]


def _trainer(model, tmp_path, *, register: bool, save: bool = True):
    def loss_module(batch):
        return TensorDict({"loss_mse": ((model(batch["x"]) - batch["y"]) ** 2).mean()}, [])

    trainer = Trainer(collector=_collector(), optim_steps_per_batch=2, loss_module=loss_module,
                      progress_bar=False, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      save_trainer_file=tmp_path / "ckpt" if save else None)
    if register:
        trainer.register_module("model", model)
    rb = TensorDictReplayBuffer(storage=ListStorage(100))
    ReplayBufferTrainer(rb, batch_size=4).register(trainer)
    return trainer, rb


def test_a_function_loss_whose_network_is_not_registered_is_refused_before_training(tmp_path):
    model = nn.Linear(1, 1)
    trainer, rb = _trainer(model, tmp_path, register=False)
    before = model.weight.detach().clone()
    with pytest.raises(ValueError, match=r"updates 2 parameter tensors \(\(1, 1\), \(1,\)\).*"
                                         r"register_module\('model', model\)"):
        trainer.train()
    assert trainer.collected_frames == 0 and len(rb) == 0
    assert torch.equal(model.weight, before) and not (tmp_path / "ckpt").exists()


def test_the_registered_network_comes_back_with_the_checkpoint(tmp_path):
    model = nn.Linear(1, 1)
    trainer, _ = _trainer(model, tmp_path, register=True)
    trainer.train()
    trained = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    resumed, _ = _trainer(model, tmp_path, register=True)
    resumed.load_from_file(tmp_path / "ckpt")
    assert torch.equal(model.weight, trained)


def test_an_nn_module_loss_or_no_checkpoint_needs_no_registration(tmp_path):
    model = nn.Linear(1, 1)
    trainer, rb = _trainer(model, tmp_path, register=False, save=False)
    trainer.train()  # nothing saved: nothing to miss
    assert len(rb) == 48

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(1, 1)

        def forward(self, batch):
            return TensorDict({"loss_mse": ((self.net(batch["x"]) - batch["y"]) ** 2).mean()}, [])

    loss = Loss()
    saved = Trainer(collector=_collector(), optim_steps_per_batch=1, loss_module=loss,
                    progress_bar=False, optimizer=torch.optim.SGD(loss.parameters(), lr=0.1),
                    save_trainer_file=tmp_path / "module")
    ReplayBufferTrainer(TensorDictReplayBuffer(storage=ListStorage(100)),
                        batch_size=4).register(saved)
    saved.train()
    assert saved.collected_frames == 48


def test_a_collector_whose_state_holds_the_network_needs_no_registration(tmp_path):
    # (TorchRL's collectors save their policy's weights: the check refused to train)
    model = nn.Linear(1, 1)

    class Collector(list):
        def state_dict(self):
            return {"policy": model.state_dict()}

        def load_state_dict(self, state):
            model.load_state_dict(state["policy"])

    def loss_module(batch):
        return TensorDict({"loss_mse": ((model(batch["x"]) - batch["y"]) ** 2).mean()}, [])

    trainer = Trainer(collector=Collector(_collector()), optim_steps_per_batch=1,
                      loss_module=loss_module, progress_bar=False,
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      save_trainer_file=tmp_path / "ckpt")
    ReplayBufferTrainer(TensorDictReplayBuffer(storage=ListStorage(100)),
                        batch_size=4).register(trainer)
    trainer.train()
    assert trainer.collected_frames == 48
