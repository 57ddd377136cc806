"""ReplayBufferTrainer: extend (flatten / pad / memmap), sample, update_priority, register, state."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    Sampler,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.trainers import ReplayBufferTrainer, Trainer


class ProportionalSampler(Sampler):
    """A small prioritized sampler: draws slots proportionally to their priority."""

    is_prioritized = True

    def __init__(self, capacity):
        self.priority = torch.zeros(capacity, dtype=torch.float64)
        self.updates = []

    def extend(self, slots):
        self.priority[slots] = 1.0

    def sample(self, storage, batch_size):
        index = torch.multinomial(self.priority[: len(storage)], batch_size, replacement=True,
                                  generator=self._rng)
        weight = (self.priority[index] / self.priority[: len(storage)].sum()).float()
        return index, {"priority_weight": weight}

    def update_priority(self, index, priority, *, storage=None):
        index, priority = torch.as_tensor(index), torch.as_tensor(priority, dtype=torch.float64)
        self.updates.append((index.clone(), priority.clone()))
        self.priority[index] = priority

    def state_dict(self):
        return {"priority": self.priority.clone()}

    def load_state_dict(self, state_dict):
        self.priority = state_dict["priority"].clone()


def collected(n_envs=2, steps=3, mask=None, start=0):
    frame = torch.arange(n_envs * steps).reshape(n_envs, steps) + start
    td = TensorDict({"obs": frame.float().unsqueeze(-1), "frame": frame}, [n_envs, steps])
    if mask is not None:
        td["collector", "mask"] = torch.as_tensor(mask, dtype=torch.bool)
    return td


def buffer(size=100, sampler=None, **kwargs):
    return TensorDictReplayBuffer(storage=ListStorage(size), sampler=sampler, **kwargs)


# ---- construction ------------------------------------------------------------------------------
def test_constructor_checks_its_arguments():
    with pytest.raises(TypeError, match="replay_buffer must be a ReplayBuffer, got list"):
        ReplayBufferTrainer([], batch_size=2)
    with pytest.raises(ValueError, match="prioritized sampler needs a TensorDictReplayBuffer"):
        ReplayBufferTrainer(ReplayBuffer(sampler=ProportionalSampler(4), batch_size=2))
    with pytest.raises(TypeError, match="iterate"):
        ReplayBufferTrainer(buffer(), batch_size=2, iterate=1)
    with pytest.raises(TypeError, match="max_dims must be a sequence of ints .* got int"):
        ReplayBufferTrainer(buffer(), batch_size=2, max_dims=5)
    with pytest.raises(ValueError, match="device must be a torch device .* got 'bogus'"):
        ReplayBufferTrainer(buffer(), batch_size=2, device="bogus")
    with pytest.raises(ValueError, match="batch_size"):
        ReplayBufferTrainer(buffer())
    with pytest.raises(ValueError, match="batch_size"):
        ReplayBufferTrainer(buffer(), batch_size=0)
    # TorchRL's takes max_dims with flatten_tensordicts=True and ignores it: accepted, said
    with pytest.warns(UserWarning, match="max_dims has no effect with flatten_tensordicts"):
        flat = ReplayBufferTrainer(buffer(), batch_size=2, flatten_tensordicts=True,
                                   max_dims=[4])
    assert flat.extend(collected()).batch_size == torch.Size([6])  # flattened, not padded
    with pytest.raises(ValueError, match="max_dims"):
        ReplayBufferTrainer(buffer(), batch_size=2, max_dims=[0, 3])
    assert ReplayBufferTrainer(buffer(batch_size=5)).batch_size is None


# ---- extend --------------------------------------------------------------------------------------
def test_extend_flattens_with_the_collector_mask():
    rb = buffer()
    hook = ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True)
    batch = collected(mask=[[True, True, False], [True, False, False]])
    written = hook.extend(batch)
    assert written["frame"].tolist() == [0, 1, 3]  # what was written, as TorchRL's
    assert rb[:]["frame"].tolist() == [0, 1, 3]
    assert rb.write_count == 3
    # the collected batch itself is left as it was
    assert batch.batch_size == torch.Size([2, 3]) and "index" not in batch.keys()


def test_extend_flattens_without_a_mask():
    rb = buffer()
    ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True).extend(collected())
    assert rb[:]["frame"].tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("flag_shape", [(2, 3), (2, 3, 1)])
def test_flattening_without_a_mask_ends_each_environments_row(flag_shape):
    """Flattened [envs, T] rows would run into each other: the last step of each row is
    marked truncated and done (TorchRL marks truncated only, and every step for [envs, T, 1]
    flags); a terminated flag is left as it was, the collected batch unchanged."""
    rb = buffer()
    batch = collected()
    batch["next", "truncated"] = torch.zeros(flag_shape, dtype=torch.bool)
    batch["next", "terminated"] = torch.zeros(flag_shape, dtype=torch.bool)
    batch["next", "done"] = torch.zeros(flag_shape, dtype=torch.bool)
    batch["next", "done"][0, 1] = True
    written = ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True).extend(batch)
    stored = rb[:]
    for td in (written, stored):
        assert td["next", "truncated"].reshape(-1).tolist() == [0, 0, 1, 0, 0, 1]
        assert td["next", "done"].reshape(-1).tolist() == [0, 1, 1, 0, 0, 1]
        assert not td["next", "terminated"].any()
    assert batch["next", "truncated"].sum() == 0 and batch["next", "done"].sum() == 1


@pytest.mark.parametrize("flag_shape", [(2, 3), (2, 3, 1)])
def test_flattening_with_a_mask_ends_each_run_of_valid_steps(flag_shape):
    """With the collector's mask, the masked rows ran into each other (a MultiStepTransform
    after the hook added the next environment's rewards): the last valid step of each run is
    marked truncated and done, the steps the mask drops being gone."""
    rb = buffer()
    batch = collected(mask=[[True, True, False], [True, False, True]])
    batch["next", "truncated"] = torch.zeros(flag_shape, dtype=torch.bool)
    batch["next", "done"] = torch.zeros(flag_shape, dtype=torch.bool)
    written = ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True).extend(batch)
    for td in (written, rb[:]):
        assert td["frame"].tolist() == [0, 1, 3, 5]
        assert td["next", "truncated"].reshape(-1).tolist() == [0, 1, 1, 1]
        assert td["next", "done"].reshape(-1).tolist() == [0, 1, 1, 1]
    assert not batch["next", "truncated"].any() and not batch["next", "done"].any()


def test_flattening_a_masked_batch_of_one_environment_ends_the_runs_before_gaps():
    rb = buffer()
    batch = collected(n_envs=1, steps=6)[0]  # a [T] batch
    batch["collector", "mask"] = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool)
    batch["next", "truncated"] = torch.zeros(6, 1, dtype=torch.bool)
    batch["next", "done"] = torch.zeros(6, 1, dtype=torch.bool)
    written = ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True).extend(batch)
    assert written["frame"].tolist() == [0, 1, 3, 4, 5]
    # step 1 is followed by the dropped step 2; step 5 goes on in the next batch
    assert written["next", "truncated"].flatten().tolist() == [0, 1, 0, 0, 0]
    assert written["next", "done"].flatten().tolist() == [0, 1, 0, 0, 0]


def test_flattening_without_truncated_flags_marks_nothing():
    rb = buffer()
    batch = collected()
    batch["next", "done"] = torch.zeros(2, 3, dtype=torch.bool)
    ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True).extend(batch)
    assert not rb[:]["next", "done"].any()  # (a done alone would read as a termination)


def test_extend_rejects_a_mask_of_the_wrong_shape_without_writing():
    rb = buffer()
    hook = ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True)
    batch = collected()
    batch["collector", "mask"] = torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="mask"):
        hook.extend(batch)
    assert len(rb) == 0 and rb.write_count == 0


def test_extend_without_flattening_writes_rows_as_they_are():
    rb = buffer()
    ReplayBufferTrainer(rb, batch_size=1).extend(collected())
    assert len(rb) == 2
    assert rb[:]["frame"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_extend_pads_to_max_dims():
    rb = buffer()
    hook = ReplayBufferTrainer(rb, batch_size=1, max_dims=[-1, 5])
    hook.extend(collected(steps=3, mask=[[True] * 3, [True, True, False]]))
    hook.extend(collected(steps=5, start=100, mask=[[True] * 5] * 2))
    rows = rb[:]
    assert rows.batch_size == torch.Size([4, 5])
    assert rows["frame"][0].tolist() == [0, 1, 2, 0, 0]
    assert rows["collector", "mask"][1].tolist() == [True, True, False, False, False]
    assert rows["frame"][3].tolist() == [105, 106, 107, 108, 109]


def test_extend_refuses_a_batch_longer_than_max_dims_without_writing():
    rb = buffer()
    hook = ReplayBufferTrainer(rb, batch_size=1, max_dims=[-1, 2])
    with pytest.raises(ValueError, match=r"max_dims\[1\]=2"):
        hook.extend(collected(steps=3))
    with pytest.raises(ValueError, match="2 entries"):
        hook.extend(collected()[0])
    assert len(rb) == 0 and rb.write_count == 0


def test_extend_with_memmap_stores_memory_mapped_tensors():
    rb = buffer()
    hook = ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True, memmap=True)
    batch = collected()
    hook.extend(batch)
    assert rb.storage[0].is_memmap()
    assert not batch.is_memmap()
    assert rb[:]["frame"].tolist() == list(range(6))


def test_a_tensor_batch_is_written_as_it_is_into_a_plain_buffer():
    # (refused with a plain TypeError; TorchRL's hook writes it, and samples [4, 2])
    from tdreplay.core.utils import NotATensorDictError
    rb = ReplayBuffer(storage=ListStorage(100), batch_size=4)
    hook = ReplayBufferTrainer(rb)
    batch = torch.arange(12.0).reshape(6, 2)
    assert hook.extend(batch) is batch
    assert torch.equal(torch.stack(list(rb[:])), batch) and hook.sample(None).shape == (4, 2)
    # the options that need a TensorDict name themselves; nothing is written
    for kwargs, named in (({"flatten_tensordicts": True}, "flatten_tensordicts"),
                          ({"max_dims": (4,)}, "max_dims"), ({"memmap": True}, "memmap")):
        with pytest.raises(NotATensorDictError, match=f"extend: {named} need a TensorDict"):
            ReplayBufferTrainer(rb, **kwargs).extend(batch)
    assert len(rb) == 6
    with pytest.raises(ValueError, match="TensorDict"):  # (TorchRL's error class, too)
        ReplayBufferTrainer(buffer(), batch_size=2).extend(torch.zeros(3))


# ---- sample, update_priority -------------------------------------------------------------------
def test_sample_uses_its_batch_size_or_the_buffers():
    rb = buffer(batch_size=3)
    rb.extend(collected().reshape(-1))
    assert ReplayBufferTrainer(rb, batch_size=5).sample(None).batch_size == torch.Size([5])
    sample = ReplayBufferTrainer(rb).sample(collected())
    assert sample.batch_size == torch.Size([3])
    assert torch.equal(sample["frame"], sample["index"])
    assert sample.device is None  # (as TorchRL's: where the buffer returns it by default)
    assert ReplayBufferTrainer(rb, device="cpu").sample(None).device == torch.device("cpu")


def test_a_plain_replay_buffer_is_fed_and_sampled():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2)
    hook = ReplayBufferTrainer(rb)
    hook.extend(collected().reshape(-1))
    assert len(rb) == 6 and hook.sample(None).batch_size == torch.Size([2])
    hook.update_priority(hook.sample(None))  # nothing to update


def test_iterate_goes_over_the_buffer_then_starts_again():
    rb = buffer(batch_size=4, sampler=SamplerWithoutReplacement())
    rb.extend(collected(steps=5).reshape(-1))
    hook = ReplayBufferTrainer(rb, iterate=True)
    seen = [hook.sample(None)["frame"].tolist() for _ in range(3)]
    assert sorted(sum(seen, [])) == list(range(10)) and [len(b) for b in seen] == [4, 4, 2]
    with pytest.raises(StopIteration):
        hook.sample(None)
    assert len(hook.sample(None)) == 4  # a new iteration


def test_update_priority_reads_the_priority_key_at_the_sampled_index():
    sampler = ProportionalSampler(10)
    rb = buffer(10, sampler=sampler, priority_key="td_error")
    rb.extend(collected().reshape(-1))
    hook = ReplayBufferTrainer(rb, batch_size=4)
    sample = hook.sample(None)
    assert "priority_weight" in sample.keys()
    sample["td_error"] = torch.full((4,), 0.0)
    hook.update_priority(sample)
    (index, priority), = sampler.updates
    assert torch.equal(index, sample["index"]) and priority.tolist() == [0.0] * 4
    with pytest.raises(KeyError, match="td_error"):
        hook.update_priority(sample.exclude("td_error"))


def test_update_priority_is_a_no_op_for_a_uniform_buffer():
    rb = buffer()
    rb.extend(collected().reshape(-1))
    hook = ReplayBufferTrainer(rb, batch_size=4)
    sample = hook.sample(None)
    sample["td_error"] = torch.ones(4)
    hook.update_priority(sample)  # nothing to update, no warning, no error


# ---- inside a trainer --------------------------------------------------------------------------
def test_register_places_the_ops_and_the_module(loss_module):
    trainer = Trainer(collector=[], optim_steps_per_batch=1, loss_module=loss_module,
                      optimizer=torch.optim.SGD(loss_module.parameters(), lr=0.1),
                      progress_bar=False)
    hook = ReplayBufferTrainer(buffer(), batch_size=2)
    hook.register(trainer)
    assert trainer.registered_ops("batch_process") == [hook.extend]
    assert trainer.registered_ops("process_optim_batch") == [hook.sample]
    assert trainer.registered_ops("post_loss") == [hook.update_priority]
    assert trainer.modules["replay_buffer"] is hook
    with pytest.raises(ValueError, match="already registered"):
        ReplayBufferTrainer(buffer(), batch_size=2).register(trainer)
    ReplayBufferTrainer(buffer(), batch_size=2).register(trainer, name="second_buffer")
    assert "second_buffer" in trainer.modules


def test_priorities_follow_the_loss_in_a_training_loop(batches, loss_module, watched_loss):
    """The loss's td_error becomes the priority of exactly the slots it was computed on."""
    sampler = ProportionalSampler(100)
    rb = buffer(100, sampler=sampler)
    rb.set_rng(torch.Generator().manual_seed(0))
    losses_seen = []

    loss = watched_loss(loss_module, lambda sub, out: losses_seen.append(
        (sub["index"].clone(), out["td_error"].clone())))
    trainer = Trainer(collector=batches(3, frames=4), optim_steps_per_batch=2, loss_module=loss,
                      optimizer=torch.optim.SGD(loss.parameters(), lr=0.05), progress_bar=False)
    ReplayBufferTrainer(rb, batch_size=5).register(trainer)
    trainer.train()
    assert len(rb) == 12
    assert len(sampler.updates) == 6
    for (index, priority), (seen_index, td_error) in zip(sampler.updates, losses_seen):
        assert torch.equal(index, seen_index)
        torch.testing.assert_close(priority, td_error.double())


def test_a_loss_output_named_index_cannot_send_priorities_to_other_slots(batches):
    """A loss returning a per-sample "index" of its own replaced the sample's before
    post_loss: the priority update went to those slots (all to slot 0 here)."""
    sampler = ProportionalSampler(100)
    rb = buffer(100, sampler=sampler)
    model = torch.nn.Linear(1, 1)
    before = [p.detach().clone() for p in model.parameters()]

    def loss(sub):
        out = model(sub["x"]).squeeze(-1)
        return TensorDict({"loss_a": out.pow(2).mean(), "td_error": out.detach().abs(),
                           "index": torch.zeros(sub.shape[0], dtype=torch.long)}, [])

    trainer = Trainer(collector=batches(1, frames=8), optim_steps_per_batch=1, loss_module=loss,
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.5), progress_bar=False)
    ReplayBufferTrainer(rb, batch_size=4).register(trainer)
    with pytest.raises(ValueError, match="returned an 'index' entry other than the sample's"):
        trainer.train()
    assert sampler.updates == []  # no priority moved
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # no step

    def echoing_loss(sub):  # the sample's own index, passed through: fine
        out = model(sub["x"]).squeeze(-1)
        return TensorDict({"loss_a": out.pow(2).mean(), "td_error": out.detach().abs(),
                           "index": sub["index"].clone()}, [])

    trainer = Trainer(collector=batches(1, frames=8), optim_steps_per_batch=1,
                      loss_module=echoing_loss,
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.5), progress_bar=False)
    ReplayBufferTrainer(buffer(100, sampler=sampler), batch_size=4).register(trainer)
    trainer.train()
    assert len(sampler.updates) == 1


def test_iterate_ends_the_optimisation_steps_of_a_batch_at_the_end_of_an_epoch(batches,
                                                                               loss_module):
    """The hook's StopIteration at the end of an epoch ends that batch's optimisation steps,
    as TorchRL's trainer takes it; it ended ``train()`` after two steps."""
    rb = buffer(100, sampler=SamplerWithoutReplacement(), batch_size=4)
    drawn = []
    trainer = Trainer(collector=batches(3, frames=6), optim_steps_per_batch=3,
                      loss_module=loss_module,
                      optimizer=torch.optim.SGD(loss_module.parameters(), lr=0.05),
                      progress_bar=False)
    hook = ReplayBufferTrainer(rb, iterate=True)
    hook.register(trainer)
    trainer.register_op("post_loss", lambda sub: drawn.append(len(sub)))
    trainer.train()
    assert len(rb) == 18
    # batch 1: 6 rows -> 4, 2, the epoch ends; batch 2: 12 rows -> 4, 4, 4 (a new epoch);
    # batch 3: that epoch ends at its first draw (no step), the next batch would begin another
    assert drawn == [4, 2, 4, 4, 4]
    assert trainer.optim_count == 5


def test_state_dict_and_directory_checkpoint_restore_the_buffer(tmp_path):
    sampler = ProportionalSampler(20)
    rb = buffer(20, sampler=sampler)
    hook = ReplayBufferTrainer(rb, batch_size=2, flatten_tensordicts=True)
    hook.extend(collected())
    rb.update_priority(torch.tensor([1, 2]), torch.tensor([5.0, 7.0]))

    def check(restored_hook):
        restored = restored_hook.replay_buffer
        assert (len(restored), restored.write_count) == (6, 6)
        assert restored[:]["frame"].tolist() == list(range(6))
        assert restored.sampler.priority[:6].tolist() == [1.0, 5.0, 7.0, 1.0, 1.0, 1.0]

    from_state = ReplayBufferTrainer(buffer(20, sampler=ProportionalSampler(20)), batch_size=2)
    from_state.load_state_dict(hook.state_dict())
    check(from_state)

    hook.dumps(tmp_path / "rb")
    from_dir = ReplayBufferTrainer(buffer(20, sampler=ProportionalSampler(20)), batch_size=2)
    from_dir.loads(tmp_path / "rb")
    check(from_dir)
    with pytest.raises(ValueError, match="replay_buffer"):
        from_dir.load_state_dict({})
