"""Trainer registration, checkpointing (state_dict, .pt files, checkpoint directories) and resume."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, ListStorage, TensorDictReplayBuffer
from tdreplay.trainers import OptimizerHook, Trainer


class Counter:
    """A stateful module with state_dict only."""

    def __init__(self):
        self.count = 0

    def __call__(self, *args):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state_dict):
        self.count = state_dict["count"]


class StatefulCollector:
    """Yields regression batches; its position is saved with the trainer."""

    def __init__(self, frames=4):
        self.frames = frames
        self.position = 0

    def __iter__(self):
        while True:
            frame = torch.arange(self.frames) + self.position
            self.position += self.frames
            x = (frame.float() / 10).unsqueeze(-1)
            yield TensorDict({"x": x, "y": 2 * x + 1, "frame": frame}, [self.frames])

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state_dict):
        self.position = state_dict["position"]


def build(loss_module, total_frames=16, save_trainer_file=None, capacity=100, **kwargs):
    """A trainer with a buffer and a counter registered, and its optimizer."""
    collector = StatefulCollector()
    trainer = Trainer(collector=collector, total_frames=total_frames, optim_steps_per_batch=2,
                      loss_module=loss_module,
                      optimizer=torch.optim.Adam(loss_module.parameters(), lr=0.05),
                      progress_bar=False, save_trainer_file=save_trainer_file, **kwargs)
    rb = TensorDictReplayBuffer(storage=ListStorage(capacity), batch_size=4)
    counter = Counter()
    trainer.register_op("batch_process", rb.extend)
    trainer.register_op("process_optim_batch", lambda b: rb.sample())
    trainer.register_op("post_steps", counter)
    trainer.register_module("replay_buffer", rb)
    trainer.register_module("counter", counter)
    return trainer, rb, counter, collector


def assert_same_state(a, b):
    ta, rba, ca, cola = a
    tb, rbb, cb, colb = b
    assert (ta.collected_frames, ta.optim_count) == (tb.collected_frames, tb.optim_count)
    for pa, pb in zip(ta.loss_module.parameters(), tb.loss_module.parameters()):
        assert torch.equal(pa, pb)
    opt_a, opt_b = ta.optimizer.state_dict()["state"], tb.optimizer.state_dict()["state"]
    assert opt_a.keys() == opt_b.keys()
    for k in opt_a:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_a[k][name], opt_b[k][name])
    assert (len(rba), rba.write_count) == (len(rbb), rbb.write_count)
    assert torch.equal(rba[:]["frame"], rbb[:]["frame"])
    assert ca.count == cb.count
    assert cola.position == colb.position


# ---- registration ------------------------------------------------------------------------------
def test_register_module_rejects_clashes_bad_names_and_stateless_objects(loss_module):
    trainer, *_ = build(loss_module)
    with pytest.raises(ValueError, match="'counter' is already registered"):
        trainer.register_module("counter", Counter())
    # the optimizer given to the trainer is registered as module "optimizer"
    with pytest.raises(ValueError, match="'optimizer' is already registered"):
        trainer.register_module("optimizer", Counter())
    with pytest.raises(ValueError, match="module_name"):
        trainer.register_module("../escape", Counter())
    with pytest.raises(TypeError, match="cannot be saved"):
        trainer.register_module("plain", object())
    assert sorted(trainer.modules) == ["counter", "optimizer", "replay_buffer"]


def test_constructor_validates_its_arguments(loss_module):
    good = dict(collector=[], optim_steps_per_batch=1, loss_module=loss_module)
    for bad, match in [({"collector": 3}, "collector"), ({"total_frames": 0}, "total_frames"),
                       ({"frame_skip": 0}, "frame_skip"),
                       ({"optim_steps_per_batch": -1}, "optim_steps_per_batch"),
                       ({"loss_module": 3}, "loss_module"), ({"logger": object()}, "logger"),
                       ({"clip_norm": -1.0}, "clip_norm"), ({"log_interval": -1}, "log_interval"),
                       ({"optimizer": "adam"}, "optimizer")]:
        with pytest.raises((TypeError, ValueError), match=match):
            Trainer(**{**good, **bad})


def test_seed_makes_runs_reproducible(loss_module):
    seeded = []

    class SeededCollector(list):
        def set_seed(self, seed):
            seeded.append(seed)

    Trainer(collector=SeededCollector(), optim_steps_per_batch=0, loss_module=loss_module, seed=5)
    first = torch.rand(3)
    Trainer(collector=SeededCollector(), optim_steps_per_batch=0, loss_module=loss_module, seed=5)
    assert torch.equal(first, torch.rand(3))
    assert seeded == [5, 5]


# ---- state_dict ----------------------------------------------------------------------------------
def test_state_dict_round_trip_restores_everything(make_loss):
    saved = build(make_loss(0))
    saved[0].train()
    state = saved[0].state_dict()
    assert set(state) == {"collected_frames", "optim_count", "last_save", "last_log",
                          "loss_module", "collector", "modules"}
    assert set(state["modules"]) == {"replay_buffer", "counter", "optimizer"}
    restored = build(make_loss(1))
    restored[0].load_state_dict(state)
    assert_same_state(saved, restored)


def test_load_state_dict_with_other_modules_changes_nothing(loss_module, make_loss):
    saved = build(make_loss(0))
    saved[0].train()
    state = saved[0].state_dict()
    del state["modules"]["counter"]
    trainer, rb, counter, _ = build(loss_module)
    before = [p.clone() for p in loss_module.parameters()]
    with pytest.raises(ValueError, match="counter"):
        trainer.load_state_dict(state)
    assert trainer.collected_frames == 0 and len(rb) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, loss_module.parameters()))


# ---- checkpoint directories and files ----------------------------------------------------------
def test_directory_checkpoint_uses_the_buffers_own_dumps(tmp_path, make_loss):
    saved = build(make_loss(0))
    saved[0].train()
    saved[0].dumps(tmp_path / "ckpt")
    pointer = json.loads((tmp_path / "ckpt" / "tdreplay-checkpoint.json").read_text())
    snap = tmp_path / "ckpt" / pointer["snapshot"]
    meta = json.loads((snap / "trainer.json").read_text())
    assert meta["modules"] == {"replay_buffer": "dumps", "counter": "state_dict",
                               "optimizer": "state_dict"}
    # the buffer wrote its own crash-safe checkpoint inside the trainer's snapshot
    assert (snap / "modules" / "replay_buffer" / "tdreplay-checkpoint.json").is_file()
    restored = build(make_loss(1))
    restored[0].loads(tmp_path / "ckpt")
    assert_same_state(saved, restored)


def test_corrupted_directory_checkpoint_is_refused_without_change(tmp_path, loss_module, make_loss):
    saved = build(make_loss(0))
    saved[0].train()
    saved[0].dumps(tmp_path / "ckpt")
    snap = next((tmp_path / "ckpt").glob("snapshot-*"))
    state_file = snap / "trainer.pt"
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    trainer, rb, counter, collector = build(loss_module)
    with pytest.raises(CheckpointError, match="corrupted"):
        trainer.loads(tmp_path / "ckpt")
    assert (trainer.collected_frames, len(rb), counter.count, collector.position) == (0, 0, 0, 0)


def test_directory_checkpoint_with_other_modules_is_refused(tmp_path, loss_module, make_loss):
    saved = build(make_loss(0))
    saved[0].dumps(tmp_path / "ckpt")
    trainer, *_ = build(loss_module)
    trainer.register_module("extra", Counter())
    with pytest.raises(CheckpointError, match="extra"):
        trainer.loads(tmp_path / "ckpt")


class WideLoss(torch.nn.Module):
    """A loss whose head has another shape than the saved one's (its load raises)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 2)

    def forward(self, batch):
        return TensorDict({"loss_mse": self.linear(batch["x"]).pow(2).mean()}, [])


def _trained_elsewhere(make_loss, tmp_path):
    saved = build(make_loss(0))
    saved[0].train()
    saved[0].dumps(tmp_path / "ckpt")
    return saved[0].state_dict()


def _unchanged(trainer, rb, counter, collector, params, frames):
    assert (trainer.collected_frames, len(rb), counter.count) == (frames, frames, frames // 4)
    assert all(torch.equal(a, b) for a, b in zip(params, trainer.loss_module.parameters()))


@pytest.mark.parametrize("how", ["loads", "load_state_dict"])
def test_a_load_that_a_module_refuses_changes_nothing(tmp_path, make_loss, how):
    """The loss head of another shape raised after the buffer (a directory) was replaced;
    a buffer of another capacity after the weights (a state dict) were: half-restored."""
    state = _trained_elsewhere(make_loss, tmp_path)
    trainer, rb, counter, collector = build(WideLoss(), total_frames=8)
    trainer.train()
    params = [p.clone() for p in trainer.loss_module.parameters()]
    error = CheckpointError if how == "loads" else RuntimeError
    with pytest.raises(error, match="size mismatch"):
        if how == "loads":
            trainer.loads(tmp_path / "ckpt")
        else:
            trainer.load_state_dict(state)
    _unchanged(trainer, rb, counter, collector, params, 8)


def test_a_buffer_that_refuses_its_state_puts_the_weights_back(tmp_path, make_loss):
    state = _trained_elsewhere(make_loss, tmp_path)  # (its buffer: capacity 100)
    trainer, rb, counter, collector = build(make_loss(1), total_frames=8, capacity=4)
    trainer.train()
    params = [p.clone() for p in trainer.loss_module.parameters()]
    opt_before = copy.deepcopy(trainer.optimizer.state_dict())
    with pytest.raises(ValueError, match="max_size.. is 100 but this ListStorage has max_size=4"):
        trainer.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(params, trainer.loss_module.parameters()))
    after = trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(after[k]["exp_avg"], opt_before["state"][k]["exp_avg"]) for k in after)
    assert (trainer.collected_frames, len(rb), counter.count) == (8, 4, 2)


def test_pt_file_checkpoint_round_trip(tmp_path, make_loss):
    # what saves killed before their rename left (each as large as a checkpoint) is removed;
    # another file's temporaries are not
    (tmp_path / ".trainer.pt.0badc0de.tmp").write_bytes(b"x" * 1000)
    (tmp_path / ".other.pt.0badc0de.tmp").write_bytes(b"x")
    saved = build(make_loss(0), save_trainer_file=tmp_path / "trainer.pt")
    saved[0].train()
    (tmp_path / ".other.pt.0badc0de.tmp").unlink()
    assert (tmp_path / "trainer.pt").is_file()
    assert list(tmp_path.iterdir()) == [tmp_path / "trainer.pt"]  # no temporary file left
    restored = build(make_loss(1))
    restored[0].load_from_file(tmp_path / "trainer.pt")
    assert_same_state(saved, restored)


def test_save_trainer_every_interval_and_at_the_end(tmp_path, loss_module, monkeypatch):
    trainer, *_ = build(loss_module, total_frames=40, save_trainer_file=tmp_path / "ckpt",
                        save_trainer_interval=12)
    saves = []
    real_dumps = trainer.dumps
    monkeypatch.setattr(trainer, "dumps", lambda p: (saves.append(trainer.collected_frames),
                                                    real_dumps(p)))
    trainer.train()
    assert saves == [12, 24, 36, 40]


def test_resume_continues_the_frame_count_and_the_buffer(tmp_path, make_loss):
    first = build(make_loss(0), total_frames=16, save_trainer_file=tmp_path / "ckpt")
    first[0].train()
    frames_before = first[1][:]["frame"].tolist()
    assert frames_before == list(range(16))

    second = build(make_loss(1), total_frames=32, save_trainer_file=tmp_path / "ckpt")
    second[0].load_from_file(tmp_path / "ckpt")
    assert_same_state(first, second)
    second[0].train()
    trainer, rb, counter, _ = second
    assert trainer.collected_frames == 32 and trainer.optim_count == 16
    assert rb[:]["frame"].tolist() == list(range(32)) and rb.write_count == 32
    assert counter.count == 8

    # a trainer already past total_frames does nothing
    third = build(make_loss(2), total_frames=32, save_trainer_file=tmp_path / "ckpt")
    third[0].load_from_file(tmp_path / "ckpt")
    third[0].train()
    assert third[0].collected_frames == 32 and len(third[1]) == 32


def test_load_from_a_missing_path_is_an_error(tmp_path, loss_module):
    trainer, *_ = build(loss_module)
    with pytest.raises(FileNotFoundError):
        trainer.load_from_file(tmp_path / "nothing.pt")


# ---- progress bar ------------------------------------------------------------------------------
def test_progress_bar_shows_frames_and_pbar_values(capsys, loss_module):
    collector = StatefulCollector()
    trainer = Trainer(collector=collector, total_frames=12, optim_steps_per_batch=1,
                      loss_module=loss_module,
                      optimizer=torch.optim.SGD(loss_module.parameters(), lr=0.1),
                      progress_bar=True)
    trainer.register_op("process_optim_batch", lambda b: b)
    trainer.register_op("post_steps_log", lambda b: {"last_frame": int(b["frame"][-1]),
                                                     "log_pbar": True})
    trainer.train()
    err = capsys.readouterr().err
    assert "12/12" in err
    assert "last_frame=11" in err


def test_seed_and_save_file_of_a_wrong_kind_are_refused_naming_them(loss_module):
    with pytest.raises(ValueError, match="seed must be below 2\\*\\*64"):
        Trainer(collector=[], loss_module=loss_module, optim_steps_per_batch=0, seed=2**70,
                progress_bar=False)
    with pytest.raises(TypeError, match="save_trainer_file must be a str, a path or None, got int"):
        Trainer(collector=[], loss_module=loss_module, optim_steps_per_batch=0,
                save_trainer_file=5, progress_bar=False)


@pytest.mark.parametrize("key", [5, "", ("grad", "norm")])
def test_optimizer_hook_refuses_a_grad_norm_key_that_is_not_a_name(loss_module, key):
    # (it was taken, and the first call stepped the weights before tensordict's KeyError)
    with pytest.raises(TypeError, match="grad_norm_key must be a non-empty str"):
        OptimizerHook(torch.optim.SGD(loss_module.parameters(), lr=0.1), grad_norm_key=key)
