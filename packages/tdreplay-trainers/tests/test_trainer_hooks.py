"""Every hook place of the Trainer, one by one: when it runs, what it gets, what its return does."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.trainers import HOOK_DESTINATIONS, Trainer


class Collector(list):
    """A list of batches with the optional collector attributes the trainer reads."""

    init_random_frames = 0


class RecordingLogger:
    def __init__(self):
        self.calls = []

    def log_scalar(self, name, value, step):
        self.calls.append((name, value, step))


def make_trainer(batches, loss_module, *, steps=2, optimizer=True, **kwargs):
    if optimizer is True:
        optimizer = torch.optim.SGD(loss_module.parameters(), lr=0.1)
    collector = kwargs.pop("collector", None)
    return Trainer(collector=collector if collector is not None else Collector(batches),
                   optim_steps_per_batch=steps, loss_module=loss_module,
                   optimizer=optimizer or None, progress_bar=kwargs.pop("progress_bar", False),
                   **kwargs)


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---- order -------------------------------------------------------------------------------------
def test_every_place_runs_in_documented_order(batches, loss_module, watched_loss):
    events = []
    loss = watched_loss(loss_module, lambda sub, out: events.append("loss"))
    trainer = make_trainer(batches(2), loss, steps=2)
    for dest in HOOK_DESTINATIONS:
        trainer.register_op(dest, lambda *a, _d=dest, **k: events.append(_d))
    trainer.train()
    optim_step = ["process_optim_batch", "loss", "post_loss", "optimizer", "post_optim",
                  "post_optim_log"]
    one_batch = (["batch_process", "pre_steps_log", "pre_optim_steps"] + optim_step * 2
                 + ["post_steps", "post_steps_log"])
    assert events == one_batch * 2
    assert trainer.collected_frames == 8
    assert trainer.optim_count == 4


def test_ops_of_one_place_run_in_registration_order_with_their_kwargs(batches, loss_module):
    calls = []
    trainer = make_trainer(batches(1), loss_module, steps=0)
    trainer.register_op("post_steps", lambda **k: calls.append(("first", k)), tag=1)
    trainer.register_op("post_steps", lambda **k: calls.append(("second", k)))
    trainer.train()
    assert calls == [("first", {"tag": 1}), ("second", {})]


def test_unknown_destination_lists_the_valid_ones(batches, loss_module):
    trainer = make_trainer(batches(1), loss_module)
    with pytest.raises(ValueError) as err:
        trainer.register_op("post_train", print)
    for dest in HOOK_DESTINATIONS:
        assert dest in str(err.value)
    with pytest.raises(TypeError, match="callable"):
        trainer.register_op("post_steps", 3)
    assert all(not trainer.registered_ops(d) for d in HOOK_DESTINATIONS if d != "optimizer")


# ---- batch_process -----------------------------------------------------------------------------
def test_batch_process_return_replaces_the_batch_and_none_keeps_it(batches, loss_module):
    seen = {}

    def add_z(batch):
        return batch[:2].set("z", torch.ones(2))

    def check(batch):
        seen["second_op"] = (batch.batch_size, "z" in batch.keys())
        return None

    def pre_log(batch):
        seen["pre_log"] = batch.batch_size

    trainer = make_trainer(batches(3, frames=4), loss_module, steps=1)
    trainer.register_op("batch_process", add_z)
    trainer.register_op("batch_process", check)
    trainer.register_op("pre_steps_log", pre_log)
    trainer.register_op("process_optim_batch", lambda b: seen.setdefault("optim", b.batch_size))
    trainer.train()
    assert seen["second_op"] == (torch.Size([2]), True)
    assert seen["pre_log"] == torch.Size([2])
    assert seen["optim"] == torch.Size([2])
    # frames are counted on the processed batch
    assert trainer.collected_frames == 6


def test_frames_count_the_collector_mask_times_frame_skip(loss_module):
    mask = torch.tensor([[True, True, False], [True, False, False]])
    batch = TensorDict({"x": torch.zeros(2, 3, 1), "y": torch.zeros(2, 3, 1),
                        ("collector", "mask"): mask}, [2, 3])
    trainer = make_trainer([batch, batch.clone()], loss_module, steps=0, frame_skip=4)
    trainer.train()
    assert trainer.collected_frames == 2 * 3 * 4


# ---- pre_optim_steps ---------------------------------------------------------------------------
def test_pre_optim_steps_runs_once_per_batch_after_init_random_frames(batches, loss_module):
    collector = Collector(batches(5, frames=4))
    collector.init_random_frames = 8
    at = []
    trainer = make_trainer(None, loss_module, steps=3, collector=collector)
    trainer.register_op("pre_optim_steps", lambda: at.append((trainer.collected_frames,
                                                              trainer.optim_count)))
    trainer.train()
    # 4 frames are not 8 yet: no optimisation for the first batch; from 8 on, as TorchRL's
    # (it started at 12: one batch of optimisation fewer)
    assert at == [(8, 0), (12, 3), (16, 6), (20, 9)]
    assert trainer.optim_count == 12


# ---- process_optim_batch -----------------------------------------------------------------------
def test_process_optim_batch_chains_and_feeds_the_loss(batches, loss_module, watched_loss):
    collected = batches(1, frames=6)
    received, loss_inputs = [], []

    def first(batch):
        received.append(batch)
        return batch[:3]

    def second(sub):
        received.append(sub)
        return sub[1:]

    loss = watched_loss(loss_module, lambda sub, out: loss_inputs.append(sub))
    trainer = make_trainer(collected, loss, steps=2)
    trainer.register_op("process_optim_batch", first)
    trainer.register_op("process_optim_batch", second)
    trainer.train()
    # each optimisation step starts again from the collected batch
    assert received[0] is collected[0] and received[2] is collected[0]
    assert [r.batch_size[0] for r in received] == [6, 3, 6, 3]
    assert [s["frame"].tolist() for s in loss_inputs] == [[1, 2], [1, 2]]


# ---- post_loss ---------------------------------------------------------------------------------
def test_post_loss_sees_the_sub_batch_with_loss_outputs_before_the_step(batches, loss_module):
    seen = []
    trainer = make_trainer(batches(1), loss_module, steps=1)
    before = params(loss_module)
    sub_batch = batches(1)[0][:3]
    trainer.register_op("process_optim_batch", lambda b: sub_batch)

    def post_loss(sub):
        seen.append((sub, same(params(loss_module), before), sub["td_error"].clone()))
        return TensorDict({"ignored": torch.zeros(3)}, [3])

    logged = []
    trainer.register_op("post_loss", post_loss)
    trainer.register_op("post_optim_log", lambda sub: logged.append(sub))
    trainer.train()
    (sub, unchanged, td_error), = seen
    assert sub is sub_batch and unchanged
    weight, bias = before
    expected = (sub_batch["x"] * weight + bias - sub_batch["y"]).abs().squeeze(-1)
    torch.testing.assert_close(td_error, expected)
    assert not td_error.requires_grad
    # post_loss return values are ignored: the next places get the same sub-batch
    assert logged[0] is sub_batch and "ignored" not in logged[0].keys()


def test_loss_without_loss_entries_is_rejected(batches):
    model = torch.nn.Linear(1, 1)
    trainer = make_trainer(batches(1), lambda b: TensorDict({"mse": model(b["x"]).sum()}, []),
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="'loss_'"):
        trainer.train()


# ---- optimizer ---------------------------------------------------------------------------------
def test_custom_optimizer_op_gets_the_losses_and_its_return_is_logged(batches, loss_module):
    got = []

    def sgd(losses, lr):
        got.append(losses["loss_mse"].requires_grad)
        losses["loss_mse"].backward()
        with torch.no_grad():
            for p in loss_module.parameters():
                p -= lr * p.grad
                p.grad = None
        return losses.set("custom", torch.tensor(7.0))

    trainer = make_trainer(batches(2), loss_module, steps=2, optimizer=None)
    before = params(loss_module)
    trainer.register_op("optimizer", sgd, lr=0.1)
    trainer.train()
    assert got == [True] * 4
    assert not same(params(loss_module), before)
    assert trainer.latest_logged["custom"] == 7.0
    assert trainer.latest_logged["optim_steps"] == 4


def test_training_without_an_optimizer_op_is_an_error(batches, loss_module):
    trainer = make_trainer(batches(1), loss_module, optimizer=None)
    with pytest.raises(RuntimeError, match="optimizer"):
        trainer.train()
    assert trainer.collected_frames == 0


def test_default_optimizer_clips_the_gradient_norm(batches):
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    loss = lambda b: TensorDict({"loss_big": (1000 * model(b["x"])).sum()}, [])  # noqa: E731
    x = TensorDict({"x": torch.ones(1, 1)}, [1])
    trainer = Trainer(collector=[x], optim_steps_per_batch=1, loss_module=loss,
                      optimizer=torch.optim.SGD(model.parameters(), lr=1.0), clip_norm=2.0,
                      progress_bar=False)
    trainer.train()
    # gradient 1000 clipped to norm 2: one SGD step of lr 1 moves the weight by -2
    assert model.weight.item() == pytest.approx(-2.0)
    assert trainer.latest_logged["grad_norm"] == pytest.approx(1000.0)


# ---- post_optim, post_optim_log ----------------------------------------------------------------
def test_post_optim_runs_after_the_step(batches, loss_module):
    trainer = make_trainer(batches(1), loss_module, steps=1)
    snapshots = {}
    trainer.register_op("post_loss", lambda sub: snapshots.setdefault("loss", params(loss_module)))
    trainer.register_op("post_optim", lambda: snapshots.setdefault("optim", params(loss_module)))
    trainer.train()
    assert not same(snapshots["loss"], snapshots["optim"])
    assert same(snapshots["optim"], params(loss_module))


def test_post_optim_log_gets_the_sub_batch_and_its_dict_is_logged(batches, loss_module):
    logger = RecordingLogger()
    trainer = make_trainer(batches(2), loss_module, steps=1, logger=logger, log_interval=0)
    trainer.register_op("process_optim_batch", lambda b: b[:3])
    trainer.register_op("post_optim_log", lambda sub: {"n": sub.numel(), "log_pbar": True})
    trainer.train()
    assert [c for c in logger.calls if c[0] == "n"] == [("n", 3, 4), ("n", 3, 8)]
    assert trainer.pbar_values == {"n": 3}


# ---- post_steps, pre/post_steps_log ------------------------------------------------------------
def test_post_steps_runs_once_per_batch_after_the_optimisation_steps(batches, loss_module):
    at = []
    trainer = make_trainer(batches(3), loss_module, steps=2)
    trainer.register_op("post_steps", lambda: at.append(trainer.optim_count))
    trainer.train()
    assert at == [2, 4, 6]


@pytest.mark.parametrize("dest", ["pre_steps_log", "post_steps_log"])
def test_steps_log_ops_get_the_batch_and_log_their_dict(dest, batches, loss_module):
    logger = RecordingLogger()
    collected = batches(2, frames=4)
    got = []
    trainer = make_trainer(collected, loss_module, steps=1, logger=logger, log_interval=0)

    def log(batch):
        got.append(batch)
        return {"mean_frame": batch["frame"].float().mean(), "log_pbar": False}

    trainer.register_op(dest, log)
    trainer.train()
    assert got[0] is collected[0] and got[1] is collected[1]
    assert [c for c in logger.calls if c[0] == "mean_frame"] == [("mean_frame", 1.5, 4),
                                                                 ("mean_frame", 5.5, 8)]
    assert "mean_frame" not in trainer.pbar_values


def test_log_ops_must_return_a_dict_or_none(batches, loss_module):
    trainer = make_trainer(batches(1), loss_module, steps=0)
    trainer.register_op("post_steps_log", lambda b: [1, 2])
    with pytest.raises(TypeError, match="post_steps_log"):
        trainer.train()


def test_logger_is_called_once_per_log_interval_per_name(batches, loss_module):
    logger = RecordingLogger()
    trainer = make_trainer(batches(6, frames=4), loss_module, steps=1, logger=logger,
                           log_interval=10)
    trainer.register_op("post_steps_log", lambda b: {"v": float(b["frame"][0])})
    trainer.train()
    assert [(v, s) for n, v, s in logger.calls if n == "v"] == [(0.0, 4), (12.0, 16)]
    # every loss log goes through the same rule
    assert [s for n, _, s in logger.calls if n == "loss_mse"] == [4, 16]
    assert trainer.latest_logged["v"] == 20.0


def test_a_per_item_output_of_fewer_dims_than_the_sample_is_named_in_a_warning():
    # (a [B] td_error for a [B, T] sample of [T] items was dropped without a word; the
    # priority update after the loss then said the loss returned no 'td_error')
    class PerItem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, batch):
            err = (batch["x"] - self.weight) ** 2  # [B, T]
            return TensorDict({"loss_a": err.mean(), "td_error": err.detach().amax(-1),
                               "per_step": err.detach()}, [])

    seen = []
    trainer = make_trainer([TensorDict({"x": torch.randn(3, 5)}, [3, 5])], PerItem(), steps=1)
    trainer.register_op("post_loss", lambda sub: seen.append(set(sub.keys())))
    with pytest.warns(UserWarning, match=r"loss output 'td_error' has shape \(3,\), which does "
                      r"not start with the sampled batch's \(3, 5\)"):
        trainer.train()
    assert seen == [{"x", "per_step"}]  # the [B, T] output is written, the [B] one is not
