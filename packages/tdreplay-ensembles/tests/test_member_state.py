"""What an ensemble's state holds besides its members' storages, samplers and writers: the
member samplers' generators (``SamplerEnsemble.state_dict``), the member buffers' transforms'
state, the parts registered on member buffers and the ensemble's own transform's state; damaged entries are refused before anything
changes."""

from __future__ import annotations

import tempfile

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, RandomSampler, TensorDictReplayBuffer
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.ensembles import ReplayBufferEnsemble, SamplerEnsemble, StorageEnsemble
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import ObservationNorm, VecNorm


def _data(n, base=0.0):
    return TensorDict({"obs": torch.arange(n, dtype=torch.float32) * 3 + base}, [n])


def _ensemble(member_transform=None, transform=None):
    members = [TensorDictReplayBuffer(storage=LazyTensorStorage(10), transform=member_transform),
               TensorDictReplayBuffer(storage=LazyTensorStorage(10))]
    return ReplayBufferEnsemble(*members, transform=transform, sample_from_all=True,
                                batch_size=4, generator=torch.Generator().manual_seed(0))


def _filled(rb):
    rb[0].extend(_data(10))
    rb[1].extend(_data(10, base=100))
    for _ in range(3):
        rb.sample()
    return rb


def _restore(rb, fresh, how):
    if how == "state_dict":
        fresh.load_state_dict(rb.state_dict())
    else:
        with tempfile.TemporaryDirectory() as path:
            rb.dumps(path)
            fresh.loads(path)
    return fresh


def _stats(compose):
    """The statistics of the VecNorm first in ``compose``."""
    return {k: v.tolist() for k, v in compose[0].state_dict().items()}


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_the_ensembles_own_transform_state_is_restored(how):
    rb = _filled(_ensemble(transform=VecNorm(in_keys=["obs"], decay=0.9)))
    restored = _restore(rb, _ensemble(transform=VecNorm(in_keys=["obs"], decay=0.9)), how)
    assert _stats(restored.transform) == _stats(rb.transform)
    assert torch.equal(restored.sample()["obs"], rb.sample()["obs"])


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_transform_appended_to_a_member_after_building_is_saved(how):
    rb = _filled(_ensemble())
    rb[0].append_transform(ObservationNorm(loc=2.0, scale=4.0, in_keys=["obs"]))
    fresh = _ensemble()
    fresh[0].append_transform(ObservationNorm(loc=0.0, scale=1.0, in_keys=["obs"]))
    restored = _restore(rb, fresh, how)
    assert (restored[0].transform[0].loc.item(), restored[0].transform[0].scale.item()) == (2, 4)
    assert rb.state_dict()["_stateful"]["member_buffers"]["1"] == {"_transform": None}


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_state_without_a_members_transform_state_is_refused(how):
    saved = _filled(_ensemble())  # its member 0 has no VecNorm: no statistics saved
    target = _filled(_ensemble(member_transform=VecNorm(in_keys=["obs"], decay=0.9)))
    before = (buffer_snapshot(target), target.state_dict())
    error = ValueError if how == "state_dict" else CheckpointError
    with pytest.raises(error, match="member_buffers.*buffer 0.*no saved state"):
        _restore(saved, target, how)
    assert_same((buffer_snapshot(target), target.state_dict()), before)


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_members_transform_state_is_refused_by_a_member_without_one(how):
    saved = _filled(_ensemble(member_transform=ObservationNorm(loc=5.0, scale=1.0,
                                                               in_keys=["obs"])))
    target = _filled(_ensemble())  # its member 0 would read other values than the saved one
    before = (buffer_snapshot(target), target.state_dict())
    error = ValueError if how == "state_dict" else CheckpointError
    with pytest.raises(error, match="buffer 0.*which this buffer does not have"):
        _restore(saved, target, how)
    assert_same((buffer_snapshot(target), target.state_dict()), before)


def test_a_damaged_member_transform_state_is_refused():
    rb = _filled(_ensemble(member_transform=VecNorm(in_keys=["obs"], decay=0.9)))
    state = rb.state_dict()
    member = state["_stateful"]["member_buffers"]["0"]["_transform"]["0:VecNorm"]
    member["obs_ssq"] = torch.full_like(member["obs_ssq"], float("inf"))
    target = _ensemble(member_transform=VecNorm(in_keys=["obs"], decay=0.9))
    with pytest.raises(ValueError, match="buffer 0.*obs_ssq.*finite"):
        target.load_state_dict(state)
    assert len(target[0]) == 0 and target[0].transform.state_dict() == {"0:VecNorm": {}}
    assert target.state_dict()["_stateful"]["member_buffers"]["0"] == {
        "_transform": {"0:VecNorm": {}}}
    with pytest.raises(ValueError, match="one entry per buffer"):
        target.load_state_dict({**state, "_stateful": {"member_buffers": {"0": {}}}})


def _samplers(seed):
    samplers = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=True)
    samplers.samplers[0].set_rng(torch.Generator().manual_seed(seed))
    return samplers


def _storages():
    storages = StorageEnsemble(LazyTensorStorage(8), LazyTensorStorage(8))
    for storage in storages.storages:
        storage.set(torch.arange(8), _data(8))
    return storages


def test_sampler_ensemble_state_dict_holds_the_generators():
    saved, storages = _samplers(0), _storages()
    saved.sample(storages, 4)
    state = saved.state_dict()
    assert state["generators"][1] is None
    restored = _samplers(7)
    restored.load_state_dict(state)
    assert torch.equal(restored.sample(storages, 4)[0]["index"][0],
                       saved.sample(storages, 4)[0]["index"][0])
    # a state saved without generators leaves them as they are
    untouched = _samplers(7)
    untouched.load_state_dict({k: v for k, v in state.items() if k != "generators"})
    assert torch.equal(untouched.samplers[0].generator.get_state(),
                       _samplers(7).samplers[0].generator.get_state())


@pytest.mark.parametrize("generators, match", [
    ([torch.zeros(3)], r"one generator state \(or None\) per sampler \(2\)"),
    ([torch.zeros(3), None], r"\['generators'\]\[0\] is not a state of sampler 0's generator"),
    ("state", "must be a list"),
])
def test_a_damaged_generator_state_is_refused_and_changes_nothing(generators, match):
    state = _samplers(0).state_dict()
    target = _samplers(7)
    before = target.samplers[0].generator.get_state()
    with pytest.raises(ValueError, match=match):
        target.load_state_dict({**state, "generators": generators})
    with pytest.raises(ValueError, match=match):
        target.check_state_dict({**state, "generators": generators})
    assert torch.equal(target.samplers[0].generator.get_state(), before)


def test_a_damaged_generators_file_is_refused(tmp_path):
    _samplers(0).dumps(tmp_path)
    torch.save([None], tmp_path / "generators.pt")
    with pytest.raises(CheckpointError, match="generators.pt.*per sampler"):
        _samplers(7).prepare_load(tmp_path)


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_checkpoint_without_member_transform_states_still_loads(how):
    # written before the members' transforms were saved (here: the part unregistered): the
    # rows, samplers and writers are restored, the members' transforms keep their state
    old = _filled(_ensemble(member_transform=VecNorm(in_keys=["obs"], decay=0.9)))
    old.register_stateful("member_buffers", None)
    fresh = _ensemble(member_transform=VecNorm(in_keys=["obs"], decay=0.9))
    before = _stats(fresh[0].transform) if fresh[0].transform[0].state_dict() else {}
    restored = _restore(old, fresh, how)
    assert torch.equal(restored[0].storage[:]["obs"], old[0].storage[:]["obs"])
    assert restored[1].writer.state_dict() == old[1].writer.state_dict()
    after = _stats(restored[0].transform) if restored[0].transform[0].state_dict() else {}
    assert after == before


def _scheduled(beta=0.4):
    """An ensemble whose member 0 anneals its prioritized sampler's beta with a scheduler
    registered on that member (not on the ensemble)."""
    from tdreplay.samplers import LinearScheduler, PrioritizedSampler

    member = TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                    sampler=PrioritizedSampler(10, alpha=0.7, beta=beta))
    scheduler = LinearScheduler(member, param_name="beta", final_value=1.0, num_steps=6)
    rb = ReplayBufferEnsemble(member, TensorDictReplayBuffer(storage=LazyTensorStorage(10)),
                              sample_from_all=True, batch_size=4,
                              generator=torch.Generator().manual_seed(0))
    return rb, scheduler


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_part_registered_on_a_member_is_saved_and_restored(how):
    rb, scheduler = _scheduled()
    _filled(rb)
    for _ in range(3):
        scheduler.step()
    assert rb.state_dict()["_stateful"]["member_buffers"]["0"]["_stateful"][
        "scheduler.beta"]["step_count"] == 3
    fresh, fresh_scheduler = _scheduled()
    _restore(rb, fresh, how)
    assert fresh_scheduler.state_dict() == scheduler.state_dict()
    for _ in range(4):  # both ramps go on from step 3 alike
        scheduler.step()
        fresh_scheduler.step()
        assert fresh[0].sampler.beta == pytest.approx(rb[0].sampler.beta)
    assert fresh[0].sampler.beta == pytest.approx(1.0)


class _Counter:
    """A part registered on a buffer whose state every checkpoint must hold (no
    ``missing_ok``, unlike a scheduler)."""

    def __init__(self, n):
        self.n = n

    def state_dict(self):
        return {"n": self.n}

    def check_state_dict(self, state):
        if not isinstance(state.get("n"), int):
            raise ValueError("n must be an int")

    def load_state_dict(self, state):
        self.n = state["n"]


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_state_without_a_members_registered_part_is_refused(how):
    saved, _ = _scheduled()
    _filled(saved)
    target, scheduler = _scheduled()
    counter = _Counter(1)
    target[0].register_stateful("counter", counter)  # a part the saved member never had
    _filled(target)
    scheduler.step()
    before = (buffer_snapshot(target), target.state_dict())
    error = ValueError if how == "state_dict" else CheckpointError
    with pytest.raises(error, match="member_buffers.*buffer 0.*counter"):
        _restore(saved, target, how)
    assert_same((buffer_snapshot(target), target.state_dict()), before)
    assert counter.n == 1 and scheduler.state_dict()["step_count"] == 1


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_state_saved_before_a_members_scheduler_was_added_loads(how):
    saved, _ = _scheduled()
    saved[0].register_stateful("scheduler.beta", None)  # as if never registered on member 0
    _filled(saved)
    target, scheduler = _scheduled()
    scheduler.step()
    _restore(saved, target, how)
    assert torch.equal(target[0].storage[:]["obs"], saved[0].storage[:]["obs"])
    assert scheduler.state_dict()["step_count"] == 1  # left as it was (as TorchRL's)


def test_a_damaged_member_part_state_is_refused_and_changes_nothing():
    rb, scheduler = _scheduled()
    _filled(rb)
    state = rb.state_dict()
    state["_stateful"]["member_buffers"]["0"]["_stateful"]["scheduler.beta"] = "step 3"
    target, target_scheduler = _scheduled()
    with pytest.raises(ValueError, match="buffer 0.*scheduler.beta.*must be a dict"):
        target.load_state_dict(state)
    assert len(target[0]) == 0 and target_scheduler.state_dict()["step_count"] == 0


def test_a_half_restored_member_is_not_saved_through_the_ensemble(tmp_path):
    # a member whose restore failed while installing refuses saves; the ensemble, which reads
    # its parts directly, must refuse them too
    from tdreplay.core import ListStorage, RandomSampler, ReplayBuffer

    class FailingSampler(RandomSampler):
        fail_next = False

        def load_state_dict(self, state_dict):
            if self.fail_next:
                self.fail_next = False
                raise MemoryError("no room")
            super().load_state_dict(state_dict)

    member = ReplayBuffer(storage=ListStorage(8), sampler=FailingSampler())
    other = ReplayBuffer(storage=ListStorage(8))
    member.extend([1, 2, 3])
    other.extend([4, 5])
    state = member.state_dict()
    member.extend([9])
    member.sampler.fail_next = True
    with pytest.raises(MemoryError):
        member.load_state_dict(state)
    ensemble = ReplayBufferEnsemble(member, other, batch_size=2)
    for save in (ensemble.state_dict, lambda: ensemble.dumps(tmp_path / "mixed")):
        with pytest.raises(RuntimeError, match="member 0 of the ensemble.*failed while installing"):
            save()
    assert not (tmp_path / "mixed").exists()
    member.load_state_dict(state)  # restored: saveable again, through the ensemble too
    ensemble.dumps(tmp_path / "ok")


def test_empty_drops_the_steps_a_members_multistep_transform_holds_back():
    # the ensemble emptied the members' storages, not their transforms: a member's held
    # steps were joined to the first steps written after the empty
    from tdreplay.transforms import MultiStepTransform

    def steps(start):
        obs, flags = torch.arange(start, start + 4.0).unsqueeze(-1), torch.zeros(4, 1, dtype=bool)
        return TensorDict({"obs": obs, "next": {"obs": obs + 1, "reward": torch.ones(4, 1),
                                                "done": flags, "terminated": flags,
                                                "truncated": flags}}, [4])

    multistep = MultiStepTransform(n_steps=2, gamma=0.9)
    member = TensorDictReplayBuffer(storage=LazyTensorStorage(20), transform=multistep)
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    ensemble = ReplayBufferEnsemble(member, other, batch_size=2)
    member.extend(steps(0))
    other.extend(steps(0))
    ensemble.empty()
    assert multistep.held is None and len(member) == 0
    member.extend(steps(100))
    assert member[:]["obs"].flatten().tolist() == [100.0, 101.0]
