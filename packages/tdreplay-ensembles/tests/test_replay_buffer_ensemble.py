"""ReplayBufferEnsemble: building, refusing writes, indexing, sampling, checkpoints."""

import pickle
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from tdreplay.core import (
    CheckpointError,
    Compose,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)
from tdreplay.ensembles import (
    ReplayBufferEnsemble,
    SamplerEnsemble,
    StorageEnsemble,
    WriterEnsemble,
    stack_parts,
)
from tdreplay.storages import LazyTensorStorage


def _data(buffer_id, n, start=0):
    """Rows whose ``obs`` encodes (buffer, row): ``buffer_id * 1000 + row``."""
    rows = torch.arange(start, start + n)
    return TensorDict(obs=(buffer_id * 1000 + rows).float(), batch_size=[n])


def _ensemble(*sizes, capacity=20, **kwargs):
    rbs = [TensorDictReplayBuffer(storage=LazyTensorStorage(capacity)) for _ in sizes]
    rb = ReplayBufferEnsemble(*rbs, **kwargs)
    for buffer_id, size in enumerate(sizes):
        if size:
            rb[buffer_id].extend(_data(buffer_id, size))
    return rb


def _check_sample_matches_storage(sample):
    """Every item's obs is the one stored at (buffer_ids, index)."""
    expected = sample["index", "buffer_ids"] * 1000 + sample["index", "index"]
    torch.testing.assert_close(sample["obs"], expected.float())


class AddOffset:
    """A transform recording the shape it saw and adding ``offset`` to obs."""

    def __init__(self, offset):
        self.offset = offset
        self.seen = []

    def __call__(self, td):
        self.seen.append(td.batch_size)
        td.set("obs", td["obs"] + self.offset)
        return td


# ---- building ------------------------------------------------------------------------------------


def test_build_from_buffers_shares_their_components():
    rb0 = TensorDictReplayBuffer(storage=LazyTensorStorage(5))
    rb1 = ReplayBuffer(storage=ListStorage(5), sampler=RandomSampler(), writer=RoundRobinWriter())
    rb = ReplayBufferEnsemble(rb0, rb1, batch_size=4)
    assert rb[0] is rb0 and rb[1] is rb1 and rb[-1] is rb1 and len(rb) == 2
    assert rb.buffers == (rb0, rb1)
    assert rb.storage.storages == (rb0.storage, rb1.storage)
    assert rb.sampler.samplers == (rb0.sampler, rb1.sampler)
    assert rb.writer.writers == (rb0.writer, rb1.writer)
    assert rb.storage.transforms == [rb0.transform, rb1.transform]
    assert rb.collate_fns == [rb0.collate_fn, rb1.collate_fn]
    assert rb.collate_fn is stack_parts and rb.batch_size == 4


def test_build_from_components_makes_extendable_buffers():
    storages = StorageEnsemble(LazyTensorStorage(10), LazyTensorStorage(10),
                               transforms=[AddOffset(0.5), None])
    samplers = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=True)
    writers = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
    rb = ReplayBufferEnsemble(storages=storages, samplers=samplers, writers=writers)
    assert isinstance(rb[0], ReplayBuffer) and rb[0].storage is storages[0]
    assert rb[1].sampler is samplers[1] and rb[1].writer is writers[1]
    assert rb[0] is rb[0]  # the same buffer every time
    assert rb[0].extend(_data(0, 3)).tolist() == [0, 1, 2]
    rb[1].extend(_data(1, 4))
    assert rb.write_count == 7 and [len(s) for s in storages.storages] == [3, 4]
    sample = rb.sample(6)
    assert sample.batch_size == torch.Size([2, 3])
    # buffer 0's transform (from storages.transforms) ran on its part only
    expected = sample["index", "buffer_ids"] * 1000 + sample["index", "index"]
    expected = expected.float() + torch.tensor([[0.5], [0.0]])
    torch.testing.assert_close(sample["obs"], expected)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda rbs, comps: ReplayBufferEnsemble(*rbs, storages=comps[0]), ValueError,
         "either replay buffers or storages"),
        (lambda rbs, comps: ReplayBufferEnsemble(storages=comps[0], samplers=comps[1]), ValueError,
         "missing: writers"),
        (lambda rbs, comps: ReplayBufferEnsemble(), ValueError, "missing: storages, samplers"),
        (lambda rbs, comps: ReplayBufferEnsemble(rbs[0], ListStorage(3)), TypeError,
         r"rbs\[1\] must be a ReplayBuffer"),
        (lambda rbs, comps: ReplayBufferEnsemble(ReplayBufferEnsemble(*rbs)), TypeError,
         "do not nest"),
        (lambda rbs, comps: ReplayBufferEnsemble(storages=comps[0], samplers=comps[0],
                                                 writers=comps[2]), TypeError,
         "samplers must be a SamplerEnsemble"),
        (lambda rbs, comps: ReplayBufferEnsemble(storages=comps[0], samplers=comps[1],
                                                 writers=comps[2], p=[1, 1]), ValueError,
         "set on the SamplerEnsemble"),
        (lambda rbs, comps: ReplayBufferEnsemble(
            storages=comps[0], samplers=SamplerEnsemble(RandomSampler()), writers=comps[2]),
         ValueError, "2 storages, 1 samplers and 2 writers"),
        (lambda rbs, comps: ReplayBufferEnsemble(*rbs, collate_fns=[stack_parts]), ValueError,
         r"collate_fns must have one entry per buffer \(2\), got 1"),
        (lambda rbs, comps: ReplayBufferEnsemble(*rbs, collate_fns=[stack_parts, 1]), TypeError,
         r"collate_fns\[1\] must be callable"),
        (lambda rbs, comps: ReplayBufferEnsemble(*rbs, collate_fn=3), TypeError,
         "collate_fn must be callable"),
        (lambda rbs, comps: ReplayBufferEnsemble(*rbs, p=[1, 2, 3]), ValueError,
         r"p must hold one weight per buffer \(2\), got 3"),
        (lambda rbs, comps: ReplayBufferEnsemble(*rbs, p=[1, 1], sample_from_all=True),
         ValueError, "p and sample_from_all"),
        (lambda rbs, comps: ReplayBufferEnsemble(*rbs, num_buffer_sampled=0), ValueError,
         "num_buffer_sampled must be a positive int"),
        (lambda rbs, comps: ReplayBufferEnsemble(*rbs, batch_size=0), ValueError,
         "batch_size must be >= 1"),
    ],
)
def test_bad_construction(build, error, match):
    rbs = [TensorDictReplayBuffer(storage=LazyTensorStorage(5)) for _ in range(2)]
    comps = (StorageEnsemble(LazyTensorStorage(5), LazyTensorStorage(5)),
             SamplerEnsemble(RandomSampler(), RandomSampler()),
             WriterEnsemble(RoundRobinWriter(), RoundRobinWriter()))
    with pytest.raises(error, match=match):
        build(rbs, comps)


# ---- writing is refused --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "call"),
    [
        ("extend", lambda rb: rb.extend(_data(0, 2))),
        ("add", lambda rb: rb.add(_data(0, 1)[0])),
        ("__setitem__", lambda rb: rb.__setitem__(0, _data(0, 1)[0])),
        ("write_all", lambda rb: rb.write_all(_data(0, 2))),
        ("set_", lambda rb: rb.set_("obs", torch.zeros(2))),
        ("set_at_", lambda rb: rb.set_at_("obs", torch.zeros(1), [0])),
        ("update_", lambda rb: rb.update_(_data(0, 2))),
    ],
)
def test_writing_to_the_ensemble_is_refused(method, call):
    rb = _ensemble(2, 2)
    before = [len(s) for s in rb.storage.storages], rb.write_count
    with pytest.raises(RuntimeError, match=rf"ReplayBufferEnsemble.{method}: an ensemble cannot "
                                           rf"be written to.*rb\[0\]\.{method}"):
        call(rb)
    assert ([len(s) for s in rb.storage.storages], rb.write_count) == before


def test_replacing_components_is_refused():
    rb = _ensemble(2, 2)
    for call in (lambda: rb.set_storage(ListStorage(2)), lambda: rb.set_sampler(RandomSampler()),
                 lambda: rb.set_writer(RoundRobinWriter())):
        with pytest.raises(RuntimeError, match="cannot be replaced"):
            call()


# ---- indexing --------------------------------------------------------------------------------------


def test_indexing_returns_buffers_and_sub_ensembles():
    rb = _ensemble(2, 3, 4, p=[1, 2, 1], batch_size=4, num_buffer_sampled=2)
    sub = rb[1:]
    assert isinstance(sub, ReplayBufferEnsemble) and sub.buffers == rb.buffers[1:]
    torch.testing.assert_close(sub.sampler.p, torch.tensor([2 / 3, 1 / 3], dtype=torch.float64))
    assert sub.sampler.num_buffer_sampled == 2 and sub.batch_size == 4
    assert sub.transform is rb.transform
    assert rb[[2, 0]].buffers == (rb[2], rb[0])
    assert rb[torch.tensor([0, 1])].buffers == (rb[0], rb[1])
    assert rb[1, 2]["obs"].item() == 1002.0
    assert rb[(2, slice(1, 3))]["obs"].tolist() == [2001.0, 2002.0]
    with pytest.raises(IndexError, match="out of range for 3 buffers"):
        rb[3]
    single = rb[:1]  # one buffer supplies both parts (drawn with replacement)
    assert single.sample(4)["index", "buffer_ids"].tolist() == [[0, 0], [0, 0]]


@pytest.mark.parametrize("index", [[], slice(3, None), torch.tensor([], dtype=torch.long)])
def test_an_index_of_no_buffer_is_refused_naming_it(index):
    # it raised "ReplayBufferEnsemble needs replay buffers, or all of storages, samplers and
    # writers": the constructor's arguments, not the index given
    rb = _ensemble(2, 3, 4)
    with pytest.raises(IndexError, match="selects none of the 3 buffers"):
        rb[index]
    with pytest.raises(IndexError, match="selects none of the 3 samplers"):
        rb.sampler[index]


def test_read_across_buffers_joins_parts():
    rb = _ensemble(3, 3, transform=AddOffset(0.25))
    both = rb[:, 0:2]
    assert both.batch_size == torch.Size([2, 2])
    assert both["obs"].tolist() == [[0.25, 1.25], [1000.25, 1001.25]]
    ragged = _ensemble(2, 3).read_all_in_order()
    assert isinstance(ragged, list) and [len(p) for p in ragged] == [2, 3]


def test_extending_a_member_buffer_is_seen_by_the_ensemble():
    rb = _ensemble(0, 0, sample_from_all=True)
    with pytest.raises(RuntimeError, match=r"buffer\(s\) \[0, 1\] of the ensemble are empty"):
        rb.sample(2)
    rb[0].extend(_data(0, 1))
    with pytest.raises(RuntimeError, match=r"buffer\(s\) \[1\]"):
        rb.sample(2)
    rb[1].extend(_data(1, 1))
    assert rb.sample(2)["obs"].tolist() == [[0.0], [1000.0]]


# ---- sampling ---------------------------------------------------------------------------------------


def test_sample_shapes_ids_and_values():
    rb = _ensemble(5, 7, 3, p=[0.2, 0.5, 0.3], batch_size=12, num_buffer_sampled=3)
    for _ in range(20):
        sample = rb.sample()
        assert sample.batch_size == torch.Size([3, 4])
        assert sample["index", "index"].shape == sample["index", "buffer_ids"].shape == (3, 4)
        ids = sample["index", "buffer_ids"]
        assert bool((ids == ids[:, :1]).all())  # one buffer per part
        _check_sample_matches_storage(sample)


def test_more_parts_than_buffers_draws_buffers_with_replacement():
    rb = _ensemble(5, 7, num_buffer_sampled=8, batch_size=16)
    seen = set()
    for _ in range(10):
        sample = rb.sample()
        assert sample.batch_size == torch.Size([8, 2])
        ids = sample["index", "buffer_ids"]
        assert bool((ids == ids[:, :1]).all())  # one buffer per part
        assert set(ids.unique().tolist()) <= {0, 1}
        seen.update(ids.unique().tolist())
        _check_sample_matches_storage(sample)
    assert seen == {0, 1}


def test_more_parts_than_buffers_follow_p():
    rb = _ensemble(5, 7, 3, p=[0, 1, 0], num_buffer_sampled=6)
    sample = rb.sample(12)
    assert sample.batch_size == torch.Size([6, 2])
    assert sample["index", "buffer_ids"].unique().tolist() == [1]
    _check_sample_matches_storage(sample)


def test_sample_return_info():
    rb = _ensemble(5, 5, sample_from_all=True)
    sample, info = rb.sample(4, return_info=True)
    assert set(info) == {"index"}
    assert torch.equal(info["index"]["index"], sample["index", "index"])
    assert info["index"]["buffer_ids"].tolist() == [[0, 0], [1, 1]]


def test_batch_not_divisible_is_refused_before_drawing():
    rb = _ensemble(5, 5, generator=torch.Generator().manual_seed(0))
    state = rb.sampler.samplers[0]._rng.get_state()
    with pytest.raises(ValueError, match=r"batch_size=5 cannot be split evenly among "
                                         r"num_buffer_sampled=2 buffers"):
        rb.sample(5)
    assert torch.equal(rb.sampler.samplers[0]._rng.get_state(), state)
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        rb.sample()


def test_transform_order_member_then_collate_then_ensemble():
    order = []

    def member(buffer_id):
        def transform(td):
            order.append(("member", buffer_id, tuple(td.batch_size)))
            return td.set("obs", td["obs"] * 2)
        return transform

    def ensemble_transform(td):
        order.append(("ensemble", tuple(td.batch_size)))
        return td.set("obs", td["obs"] + 1)

    rb0 = TensorDictReplayBuffer(storage=LazyTensorStorage(5), transform=member(0))
    rb1 = TensorDictReplayBuffer(storage=ListStorage(5), transform=member(1))
    rb = ReplayBufferEnsemble(rb0, rb1, sample_from_all=True, transform=ensemble_transform)
    rb[0].extend(_data(0, 2))
    rb[1].extend(_data(1, 2))
    sample = rb.sample(6)
    assert order == [("member", 0, (3,)), ("member", 1, (3,)), ("ensemble", (2, 3))]
    expected = (sample["index", "buffer_ids"] * 1000 + sample["index", "index"]) * 2 + 1
    torch.testing.assert_close(sample["obs"], expected.float())
    # the member buffers still sample on their own, with their own transform only
    assert float(rb[1].sample(1)["obs"][0]) in (2000.0, 2002.0)


def test_parts_that_do_not_stack_stay_a_list_with_their_index():
    rb0 = TensorDictReplayBuffer(storage=LazyTensorStorage(5))
    rb1 = TensorDictReplayBuffer(storage=LazyTensorStorage(5))
    rb = ReplayBufferEnsemble(rb0, rb1, sample_from_all=True)
    rb0.extend(_data(0, 3))
    rb1.extend(TensorDict(obs=torch.arange(3.0)[:, None].expand(3, 2) + 1000,
                          batch_size=[3]))
    sample = rb.sample(4)  # obs of other shapes: stacked lazily, both parts kept
    assert sample.batch_size == torch.Size([2, 2])
    assert sample[0]["obs"].shape == (2,) and sample[1]["obs"].shape == (2, 2)

    def keep_list(parts):
        return list(parts)

    listed = ReplayBufferEnsemble(rb0, rb1, sample_from_all=True, collate_fn=keep_list)
    parts = listed.sample(4)
    assert isinstance(parts, list) and len(parts) == 2
    for buffer_id, part in enumerate(parts):
        assert part["index", "buffer_ids"].tolist() == [buffer_id, buffer_id]
        assert part["index", "index"].shape == (2,)


def test_custom_collate_fns_per_buffer():
    calls = []

    def tagging_collate(buffer_id):
        def collate(items):
            calls.append(buffer_id)
            return items
        return collate

    rb = _ensemble(3, 3, sample_from_all=True)
    custom = ReplayBufferEnsemble(*rb.buffers, sample_from_all=True,
                                  collate_fns=[tagging_collate(0), tagging_collate(1)])
    custom.sample(4)
    assert calls == [0, 1]


def test_plain_tensor_buffers_stack_and_info_carries_the_index():
    rb0 = ReplayBuffer(storage=ListStorage(10))
    rb1 = ReplayBuffer(storage=ListStorage(10))
    rb = ReplayBufferEnsemble(rb0, rb1, sample_from_all=True)
    rb0.extend([torch.tensor([float(i)]) for i in range(3)])
    rb1.extend([torch.tensor([100.0 + i]) for i in range(3)])
    data, info = rb.sample(4, return_info=True)
    assert data.shape == (2, 2, 1)
    expected = info["index"]["buffer_ids"] * 100 + info["index"]["index"]
    torch.testing.assert_close(data[..., 0], expected.float())


def test_p_shares_parts_between_buffers():
    rb = _ensemble(4, 4, p=[0.9, 0.1], generator=torch.Generator().manual_seed(0))
    ids = torch.cat([rb.sample(2)["index", "buffer_ids"][:, 0] for _ in range(300)])
    share = float((ids == 0).float().mean())
    assert 0.85 < share < 0.95


def test_generator_makes_ensemble_sampling_reproducible():
    def run():
        rb = _ensemble(6, 6, p=[0.5, 0.5], generator=torch.Generator().manual_seed(7))
        return [rb.sample(4)["obs"] for _ in range(4)]

    for a, b in zip(run(), run()):
        assert torch.equal(a, b)


def test_update_priority_reaches_the_member_samplers():
    from tdreplay.samplers import PrioritizedSampler

    rb0 = TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                 sampler=PrioritizedSampler(8, alpha=1.0, beta=1.0))
    rb1 = TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                 sampler=PrioritizedSampler(8, alpha=1.0, beta=1.0))
    rb = ReplayBufferEnsemble(rb0, rb1, sample_from_all=True,
                              generator=torch.Generator().manual_seed(0))
    rb0.extend(_data(0, 8))
    rb1.extend(_data(1, 8))
    assert rb.sampler.is_prioritized
    sample = rb.sample(8)
    assert sample["priority_weight"].shape == (2, 4)
    # give every slot a tiny priority, except slot 3 of buffer 0 and slot 6 of buffer 1
    everything = TensorDict(index=torch.arange(8).expand(2, 8),
                            buffer_ids=torch.tensor([[0] * 8, [1] * 8]), batch_size=[2, 8])
    rb.update_priority(everything, torch.full((2, 8), 1e-6))
    favourite = TensorDict(index=torch.tensor([[3], [6]]), buffer_ids=torch.tensor([[0], [1]]),
                           batch_size=[2, 1])
    rb.update_priority(favourite, torch.tensor([[1e3], [1e3]]))
    sample = rb.sample(200)
    assert float((sample["index", "index"][0] == 3).float().mean()) > 0.95
    assert float((sample["index", "index"][1] == 6).float().mean()) > 0.95
    with pytest.raises(ValueError, match=r"priority of shape \(3,\) does not match index of "
                                         r"shape \(2, 1\)"):
        rb.update_priority(favourite, torch.ones(3))
    for bad in (None, 0.5, torch.tensor([3])):  # not an ensemble index: named, nothing changed
        with pytest.raises(TypeError, match="index must be an ensemble index"):
            rb.update_priority(bad, torch.ones(1))
    sample = rb.sample(200)
    assert float((sample["index", "index"][0] == 3).float().mean()) > 0.95


def test_update_priority_takes_the_priority_shapes_a_single_buffer_takes():
    from tdreplay.samplers import PrioritizedSampler

    members = [TensorDictReplayBuffer(storage=LazyTensorStorage(4),
                                      sampler=PrioritizedSampler(4, alpha=1.0, beta=1.0))
               for _ in range(2)]
    rb = ReplayBufferEnsemble(*members, sample_from_all=True)
    for i, member in enumerate(members):
        member.extend(_data(i, 4))
    index = TensorDict(index=torch.tensor([[0, 1], [2, 3]]),
                       buffer_ids=torch.tensor([[0, 0], [1, 1]]), batch_size=[2, 2])
    rb.update_priority(index, torch.tensor([2.0]))  # [1] broadcasts, as on a single buffer
    totals = [m.sampler.total_priority for m in members]  # (each with the sampler's eps)
    assert totals == pytest.approx([2.0 + 2.0 + 1.0 + 1.0, 1.0 + 1.0 + 2.0 + 2.0])
    rb.update_priority(index, torch.tensor([[[3.0], [3.0]], [[5.0], [5.0]]]))  # [2, 2, 1]
    totals = [m.sampler.total_priority for m in members]
    assert totals == pytest.approx([3.0 + 3.0 + 1.0 + 1.0, 1.0 + 1.0 + 5.0 + 5.0])
    with pytest.raises(ValueError, match=r"does not match index of shape \(2, 2\)"):
        rb.update_priority(index, torch.ones(3))
    with pytest.raises(ValueError, match=r"priority must have the index's shape \(2, 2\)"):
        rb.update_priority(index, torch.ones(2, 2, 3))  # (several per item: for one buffer)
    assert [m.sampler.total_priority for m in members] == totals


def test_iteration_and_prefetch():
    rb = _ensemble(4, 4, batch_size=4, prefetch=2, sample_from_all=True)
    it = iter(rb)
    for _ in range(5):
        sample = next(it)
        assert sample.batch_size == (2, 2)
        _check_sample_matches_storage(sample)


def test_empty_empties_every_buffer():
    rb = _ensemble(3, 4)
    rb.empty()
    assert [len(b) for b in rb.buffers] == [0, 0] and rb.write_count == 0
    assert rb[0].writer.cursor == 0
    rb[0].extend(_data(0, 1))
    assert len(rb[0]) == 1


def test_repr_lists_components():
    rb = _ensemble(1, 1, p=[1, 3], transform=AddOffset(1.0))
    text = repr(rb)
    assert text.startswith("ReplayBufferEnsemble(\n    storages=StorageEnsemble(\n        storages=(")
    assert "    samplers=SamplerEnsemble(\n        samplers=(RandomSampler(), RandomSampler())" in text
    assert "p=[0.25, 0.75]" in text and "num_buffer_sampled=2" in text
    assert "    writers=WriterEnsemble(\n        writers=(RoundRobinWriter(" in text
    assert "\nbatch_size=None,\ntransform=Compose(" in text
    assert text.endswith("collate_fn=tdreplay.ensembles.collate.stack_parts)")


def test_pickle_round_trip():
    rb = _ensemble(3, 3, sample_from_all=True, batch_size=2)
    clone = pickle.loads(pickle.dumps(rb))
    assert [len(b) for b in clone.buffers] == [3, 3]
    clone[0].extend(_data(0, 1, start=3))
    assert len(clone[0]) == 4 and len(rb[0]) == 3
    _check_sample_matches_storage(clone.sample())


def test_member_extend_while_ensemble_samples():
    rb = _ensemble(1, 1, capacity=64, sample_from_all=True)
    errors = []

    def writer(buffer_id):
        try:
            for start in range(1, 60, 3):
                rb[buffer_id].extend(_data(buffer_id, 3, start=start))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for _ in range(50):
        _check_sample_matches_storage(rb.sample(8))
    for t in threads:
        t.join()
    assert not errors and [len(b) for b in rb.buffers] == [61, 61]


def test_a_thread_holding_a_member_samples_while_another_samples_the_ensemble():
    # (the other thread held the ensemble's own lock while it waited for member 1, which the
    # first held while it waited for the ensemble's lock: both waited for good)
    rb = _ensemble(4, 4, sample_from_all=True, batch_size=4)
    started, drawn = threading.Event(), []

    def other():
        started.set()
        drawn.append(rb.sample())

    def holder():
        with rb[1].locked():
            thread = threading.Thread(target=other, daemon=True)
            thread.start()
            started.wait(5)
            for _ in range(20):  # (the other thread waits for member 1 in between)
                drawn.append(rb.sample())
        thread.join(10)

    holding = threading.Thread(target=holder, daemon=True)
    holding.start()
    holding.join(30)
    assert not holding.is_alive() and len(drawn) == 21
    for batch in drawn:
        _check_sample_matches_storage(batch)


def test_the_ensemble_lock_enters_only_when_every_member_is_free():
    rb = _ensemble(2, 2)
    lock = rb.locked()
    held = threading.Event()
    leave = threading.Event()

    def holder():
        with rb[1].locked():
            held.set()
            leave.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    try:
        assert lock.enter_if_free() is False
        assert not rb[0].holds_lock() and rb[0].locked().enter_if_free()  # (none kept)
        rb[0].locked().__exit__(None, None, None)
    finally:
        leave.set()
        thread.join(10)
    assert lock.enter_if_free() is True and rb[0].holds_lock() and rb[1].holds_lock()
    lock.__exit__(None, None, None)
    assert not rb.holds_lock()


# ---- state and checkpoints -----------------------------------------------------------------------


def _saved_and_restored(tmp_path, **kwargs):
    rb = _ensemble(5, 9, generator=torch.Generator().manual_seed(3), **kwargs)
    rb.sample(4)
    rb.dumps(tmp_path / "ckpt")
    restored = _ensemble(0, 0, generator=torch.Generator().manual_seed(99), **kwargs)
    restored.loads(tmp_path / "ckpt")
    return rb, restored


def test_dumps_loads_round_trip_samples_alike(tmp_path):
    rb, restored = _saved_and_restored(tmp_path, p=[0.3, 0.7])
    assert [len(b) for b in restored.buffers] == [5, 9]
    assert [b.write_count for b in restored.buffers] == [5, 9]
    for _ in range(3):
        a, b = rb.sample(4), restored.sample(4)
        assert torch.equal(a["obs"], b["obs"])
        assert torch.equal(a["index", "buffer_ids"], b["index", "buffer_ids"])
    restored[0].extend(_data(0, 1, start=5))  # the writer continues where the saved one was
    assert restored[0][5]["obs"].item() == 5.0


def test_dumps_loads_restores_member_generators(tmp_path):
    def build(seed):
        rbs = [TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                      generator=torch.Generator().manual_seed(seed + i))
               for i in range(2)]
        return ReplayBufferEnsemble(*rbs, sample_from_all=True)

    rb = build(0)
    rb[0].extend(_data(0, 10))
    rb[1].extend(_data(1, 10))
    rb.dumps(tmp_path)
    restored = build(50)
    restored.loads(tmp_path)
    assert torch.equal(rb.sample(8)["obs"], restored.sample(8)["obs"])


def test_loads_refuses_a_mismatched_checkpoint_and_changes_nothing(tmp_path):
    rb = _ensemble(5, 9)
    rb.dumps(tmp_path / "two")
    _ensemble(1, 1, 1).dumps(tmp_path / "three")
    target = _ensemble(2, 3)
    before = target.state_dict()
    with pytest.raises(CheckpointError, match="3 members but this StorageEnsemble has 2"):
        target.loads(tmp_path / "three")
    small = ReplayBufferEnsemble(TensorDictReplayBuffer(storage=LazyTensorStorage(20)),
                                 TensorDictReplayBuffer(storage=LazyTensorStorage(4)))
    small[0].extend(_data(0, 2))
    with pytest.raises(CheckpointError, match="max_size"):
        small.loads(tmp_path / "two")
    assert [len(b) for b in small.buffers] == [2, 0] and small.write_count == 2
    plain = ReplayBuffer(storage=LazyTensorStorage(20))
    with pytest.raises(CheckpointError, match="StorageEnsemble"):
        plain.loads(tmp_path / "two")
    assert target.state_dict()["_writer"] == before["_writer"]


def test_state_dict_round_trip(tmp_path):
    rb = _ensemble(4, 6, sample_from_all=True)
    state = rb.state_dict()
    restored = _ensemble(0, 0, sample_from_all=True)
    restored.load_state_dict(state)
    assert [len(b) for b in restored.buffers] == [4, 6] and restored.write_count == 10
    _check_sample_matches_storage(restored.sample(4))
    with pytest.raises(ValueError, match="keys"):
        restored.load_state_dict({**state, "_writer": {"0": state["_writer"]["0"]}})
    assert restored.write_count == 10


# ---- properties ----------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    parts_fraction=st.floats(0.0, 1.0),
    part_size=st.integers(1, 4),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_samples_are_split_evenly_and_read_from_their_buffers(sizes, parts_fraction, part_size,
                                                              weighted, seed):
    n = len(sizes)
    parts = max(1, round(parts_fraction * n))
    p = torch.rand(n, generator=torch.Generator().manual_seed(seed)) + 0.01 if weighted else None
    rb = _ensemble(*sizes, capacity=8, p=p, num_buffer_sampled=parts,
                   generator=torch.Generator().manual_seed(seed))
    sample = rb.sample(parts * part_size)
    assert sample.batch_size == torch.Size([parts, part_size])
    ids, index = sample["index", "buffer_ids"], sample["index", "index"]
    assert bool((ids == ids[:, :1]).all())
    bounds = torch.tensor(sizes)[ids]
    assert bool(((index >= 0) & (index < bounds)).all())
    _check_sample_matches_storage(sample)


def test_compose_transform_of_member_is_shared_with_the_ensemble():
    rb0 = TensorDictReplayBuffer(storage=LazyTensorStorage(5))
    rb = ReplayBufferEnsemble(rb0, sample_from_all=True)
    rb0.extend(_data(0, 2))
    rb0.append_transform(AddOffset(10.0))  # appended after the ensemble was built
    assert isinstance(rb.storage.transforms[0], Compose)
    assert bool((rb.sample(2)["obs"] >= 10).all())


def test_a_sub_ensemble_of_buffers_all_weighted_zero_is_refused_naming_p():
    # it raised "p must give at least one buffer a positive weight, got [0.0, 0.0]": a p
    # the caller did not pass to rb[1:]
    rb = _ensemble(2, 3, 4, p=[1, 0, 0], batch_size=4)
    with pytest.raises(ValueError, match=r"selects buffers \[1, 2\], which all have weight 0 "
                                         r"in the ensemble's p=\[1.0, 0.0, 0.0\]"):
        rb[1:]
    assert rb[:2].buffers == rb.buffers[:2]  # a selection with a weighted buffer is built


def test_a_collate_fn_joining_the_parts_into_one_dim_keeps_the_index():
    # torch.cat of the parts: the sample had no "index" (its batch [4] is not [2, 2]), so
    # update_priority could not be fed from it
    rb = _ensemble(5, 5, sample_from_all=True, batch_size=4,
                   collate_fn=lambda parts: torch.cat(list(parts)))
    data, info = rb.sample(return_info=True)
    assert data.batch_size == (4,)
    assert data["index", "buffer_ids"].tolist() == [0, 0, 1, 1]
    assert data["index", "index"].tolist() == info["index"]["index"].reshape(-1).tolist()
    torch.testing.assert_close(data["obs"], (data["index", "buffer_ids"] * 1000
                                             + data["index", "index"]).float())


def test_a_collate_fn_output_the_index_cannot_fit_warns():
    rb = _ensemble(5, 5, sample_from_all=True, batch_size=4, collate_fn=lambda parts: parts[0])
    with pytest.warns(UserWarning, match=r"collate_fn made a sample of batch size \(2,\).*"
                                         r"index of batch size \(2, 2\)"):
        data, info = rb.sample(return_info=True)
    assert "index" not in data.keys() and info["index"].batch_size == (2, 2)


def test_a_mixed_ensemble_sample_carries_priority_weights_of_one_for_uniform_parts():
    # the weights were a list [tensor, None] left out of the sample: sample["priority_weight"]
    # raised KeyError
    from tdreplay.samplers import PrioritizedSampler
    prioritized = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                         sampler=PrioritizedSampler(20, alpha=0.7, beta=0.5))
    uniform = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    prioritized.extend(_data(0, 6))
    uniform.extend(_data(1, 6))
    prioritized.update_priority(torch.arange(6), torch.arange(1.0, 7.0))
    rb = ReplayBufferEnsemble(prioritized, uniform, sample_from_all=True, batch_size=6)
    data, info = rb.sample(return_info=True)
    weights = data["priority_weight"]
    assert weights.shape == (2, 3) and weights.dtype == torch.float32
    assert weights[1].tolist() == [1.0, 1.0, 1.0]
    _, member_info = prioritized.sampler.sample(prioritized.storage, 3)
    assert weights[0].dtype == member_info["priority_weight"].dtype
    assert bool((weights[0] > 0).all()) and bool((weights[0] <= 1).all())
    torch.testing.assert_close(info["priority_weight"], weights)


def test_a_member_refusing_its_part_size_is_named_with_the_split():
    # "batch_size=3 is not divisible by slice_len=4": the caller asked for 6, of two parts
    from tdreplay.samplers import SliceSampler
    rbs = [TensorDictReplayBuffer(storage=LazyTensorStorage(20)),
           TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=SliceSampler(
               slice_len=4, end_key="done"))]
    for rb in rbs:
        rb.extend(TensorDict(obs=torch.arange(8.0), done=torch.arange(8) % 4 == 3,
                             batch_size=[8]))
    rb = ReplayBufferEnsemble(*rbs, sample_from_all=True)
    with pytest.raises(ValueError, match=r"buffer 1, asked for 1 part\(s\) of 3 items of the "
                                         r"batch of 6 split among 2 buffers: .*slice_len=4"):
        rb.sample(6)
