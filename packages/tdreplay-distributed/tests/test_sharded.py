"""ShardedReplayBuffer: writes spread over shards, sampling as one buffer, global slots."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, ListStorage, TensorDictReplayBuffer
from tdreplay.distributed import ShardedReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.writers import TensorDictMaxValueWriter

ALPHA, BETA, EPS = 2.0, 1.0, 1e-8  # conftest.prioritized_shards
SHARD_SIZE = 8


@pytest.fixture
def _prioritized(prioritized_shards):
    return prioritized_shards


@pytest.fixture
def sharded(_prioritized):
    """An emptied 3-shard prioritized buffer, through a new client (write cursor at shard 0)."""
    _prioritized.empty()
    return ShardedReplayBuffer.attach("sharded", generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def uniform(ray_session):
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 10), batch_size=1000,
                             write_strategy="least_written",
                             generator=torch.Generator().manual_seed(2))
    yield rb
    rb.shutdown()


def _rows(values) -> TensorDict:
    values = torch.as_tensor(values, dtype=torch.float32)
    return TensorDict({"x": values}, values.shape[:1])


def _chi2_pvalue(observed: torch.Tensor, expected_p: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of ``observed`` counts against probabilities."""
    n = observed.sum()
    expected = expected_p.double() * n
    chi2 = ((observed.double() - expected) ** 2 / expected).sum()
    dof = torch.tensor((observed.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, chi2 / 2))


def _offset_of(index: torch.Tensor) -> torch.Tensor:
    return torch.div(index, SHARD_SIZE, rounding_mode="floor") * SHARD_SIZE


def test_writes_go_round_robin_and_return_global_slots(sharded):
    slots = []
    for i in range(4):
        td = _rows([10 * i, 10 * i + 1])
        slots.append(sharded.extend(td).tolist())
        assert "index" not in td.keys()  # the caller's data is left as it is
    assert slots == [[0, 1], [8, 9], [16, 17], [2, 3]]
    assert sharded.add(_rows([99])[0]) == 10  # shard 1, its third slot
    assert [len(shard) for shard in sharded.shards] == [4, 3, 2]
    assert len(sharded) == sharded.write_count == 9
    assert sharded.max_size == 3 * SHARD_SIZE and sharded.num_shards == 3


def test_prioritized_sampling_matches_one_buffer_over_all_shards(sharded):
    sizes = [5, 3, 7]
    written = torch.cat([sharded.extend(_rows(torch.arange(n))) for n in sizes])
    priority = torch.rand(written.numel(), generator=torch.Generator().manual_seed(3)) * 3 + 1.0
    sharded.update_priority(written, priority)

    p = (priority.double() + EPS) ** ALPHA
    counts = torch.zeros(written.numel())
    position = {int(slot): i for i, slot in enumerate(written)}
    for _ in range(40):
        data, info = sharded.sample(return_info=True)
        index = info["index"]
        assert torch.equal(data["index"], index)
        # each row is the one stored at its global slot (x = position within its batch)
        assert torch.equal(data["x"], (index - _offset_of(index)).float())
        rows = torch.tensor([position[int(i)] for i in index])
        counts += torch.bincount(rows, minlength=written.numel())
        # importance weights are global: (p_i / min_j p_j) ** -beta over all shards
        expected_w = (p[rows] / p.min()) ** -BETA
        assert torch.allclose(info["priority_weight"].double(), expected_w, rtol=1e-5)
        assert torch.equal(data["priority_weight"], info["priority_weight"])
    assert counts.sum() == 40 * 500
    assert _chi2_pvalue(counts, p / p.sum()) > 1e-3


def test_masses_changed_by_another_client_do_not_bias_the_next_sample(sharded, _prioritized):
    """A client draws a batch in one round from the masses it last heard of; another client's
    writes and priority updates since then change the shards' masses, yet the batch has the
    distribution of one buffer at the time of the draw (the shards' fresh masses decide the
    split, see ShardCalls)."""
    first = sharded.extend(_rows(torch.arange(4)))  # shard 0
    sharded.sample(20)  # this client now knows shards 1 and 2 as empty
    written = torch.cat([first] + [_prioritized.extend(_rows(torch.arange(4)))
                                   for _ in range(3)])  # one write to each shard, in turn
    assert sorted(len(shard) for shard in sharded.shards) == [4, 4, 8]
    position = torch.full((3 * SHARD_SIZE,), -1)
    position[written] = torch.arange(written.numel())
    generator = torch.Generator().manual_seed(4)
    chi2, dof = 0.0, 0
    for _ in range(8):
        # the other client reweighs every item: this client's masses are stale each time
        priority = torch.rand(written.numel(), generator=generator) * 3 + 1.0
        _prioritized.update_priority(written, priority)
        p = (priority.double() + EPS) ** ALPHA
        data, info = sharded.sample(return_info=True)
        rows = position[info["index"]]
        assert bool((rows >= 0).all())
        expected_w = (p[rows] / p.min()) ** -BETA
        assert torch.allclose(info["priority_weight"].double(), expected_w, rtol=1e-5)
        counts = torch.bincount(rows, minlength=written.numel()).double()
        expected = p / p.sum() * counts.sum()
        chi2 += float(((counts - expected) ** 2 / expected).sum())
        dof += written.numel() - 1
    pvalue = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                           torch.tensor(chi2 / 2, dtype=torch.float64)))
    assert pvalue > 1e-3


def test_uniform_sampling_weighs_shards_by_their_size(uniform):
    uniform.empty()
    # least_written: 3 items to shard 0, then 9 to shard 1, then 1 more to shard 0
    assert uniform.extend([torch.tensor(float(i)) for i in range(3)]).tolist() == [0, 1, 2]
    assert uniform.extend([torch.tensor(float(10 + i)) for i in range(9)]).tolist() == \
        list(range(10, 19))
    assert uniform.extend([torch.tensor(3.0)]).tolist() == [3]
    counts = torch.zeros(20)
    for _ in range(13):
        data, info = uniform.sample(return_info=True)
        assert torch.equal(data, info["index"].float())  # item value == its global slot
        counts += torch.bincount(info["index"], minlength=20)
    written = torch.tensor([0, 1, 2, 3] + list(range(10, 19)))
    assert counts.sum() == counts[written].sum() == 13_000
    assert _chi2_pvalue(counts[written], torch.full((13,), 1 / 13)) > 1e-3


def test_bad_priority_updates_change_no_shard(sharded):
    written = torch.cat([sharded.extend(_rows(torch.arange(2))) for _ in range(3)])
    sharded.update_priority(written, torch.arange(1.0, 7.0))
    before = [s["_sampler"]["priorities"] for s in sharded.state_dict()["shards"]]
    with pytest.raises(IndexError, match=r"\[0, 24\).*\[24\]"):
        sharded.update_priority(torch.tensor([0, 24]), torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        sharded.update_priority(written, torch.tensor([1.0, 1.0, -1.0, 1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="does not match"):
        sharded.update_priority(written, torch.ones(4))
    with pytest.raises(TypeError, match="integers"):
        sharded.update_priority(torch.tensor([0.5]), 1.0)
    after = [s["_sampler"]["priorities"] for s in sharded.state_dict()["shards"]]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_update_tensordict_priority_sends_rows_to_their_shards(sharded):
    for _ in range(3):
        sharded.extend(_rows(torch.arange(4)))
    sample = sharded.sample(60)
    sample["td_error"] = sample["index"].float() + 1.0  # a priority per slot
    sharded.update_tensordict_priority(sample)
    drawn = sample["index"].unique()
    for k, shard in enumerate(sharded.shards):
        leaves = shard.state_dict()["_sampler"]["priorities"]
        for slot in drawn[(drawn >= k * SHARD_SIZE) & (drawn < (k + 1) * SHARD_SIZE)]:
            expected = (float(slot) + 1.0 + EPS) ** ALPHA
            assert float(leaves[int(slot) - k * SHARD_SIZE]) == pytest.approx(expected)


def test_sampling_an_empty_buffer_says_so(sharded):
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        sharded.sample()
    with pytest.raises(ValueError, match="batch_size"):
        sharded.sample(0)


def test_attach_finds_every_shard_by_name(sharded, _prioritized):
    sharded.extend(_rows([1.0, 2.0]))
    other = ShardedReplayBuffer.from_name("sharded")
    assert other.num_shards == 3 and other.batch_size == 500
    assert len(other) == len(_prioritized) == 2
    with pytest.raises(ValueError, match="no buffer actor named 'missing/shard-0'"):
        ShardedReplayBuffer.attach("missing")


def test_dumps_loads_and_state_dict_restore_every_shard(sharded, tmp_path):
    for _ in range(3):
        sharded.extend(_rows(torch.arange(3)))
    sharded.update_priority(torch.tensor([0, 8, 16]), torch.tensor([2.0, 3.0, 4.0]))
    sharded.dumps(tmp_path / "ckpt")
    state = sharded.state_dict()
    priorities = [s["_sampler"]["priorities"] for s in state["shards"]]
    sharded.extend(_rows(torch.arange(5)))
    sharded.update_priority(torch.tensor([0]), torch.tensor([9.0]))
    sharded.loads(tmp_path / "ckpt")
    assert len(sharded) == sharded.write_count == 9
    restored = [s["_sampler"]["priorities"] for s in sharded.state_dict()["shards"]]
    assert all(torch.equal(a, b) for a, b in zip(priorities, restored))
    sharded.extend(_rows(torch.arange(2)))
    sharded.load_state_dict(state)
    assert [len(shard) for shard in sharded.shards] == [3, 3, 3]
    with pytest.raises(CheckpointError, match="holds no sharded checkpoint"):
        sharded.loads(tmp_path / "nothing-here")
    with pytest.raises(ValueError, match="3 shards"):
        sharded.load_state_dict({"num_shards": 2, "shards": state["shards"][:2]})


@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_restored_sharded_buffer_writes_and_draws_as_the_saved_one(ray_session, tmp_path, how):
    # (sharded.json held only the number of shards: the client's generator, which picks the
    # shard of each position of a batch, and its round-robin cursor were not saved, so a
    # restored buffer drew other batches and wrote its next rows to another shard)
    rb = ShardedReplayBuffer(num_shards=3, storage=partial(LazyTensorStorage, 100),
                             batch_size=16, replay_buffer_cls=TensorDictReplayBuffer,
                             generator=torch.Generator().manual_seed(0))
    try:
        for n in (10, 30, 60, 5):
            rb.extend(TensorDict({"x": torch.arange(n)}, [n]))
        if how == "dumps":
            rb.dumps(tmp_path / "ckpt")
        else:
            state = rb.state_dict()
        drawn = [rb.sample()["index"].tolist() for _ in range(3)]
        written = rb.extend(TensorDict({"x": torch.arange(2)}, [2])).tolist()
        if how == "dumps":
            rb.loads(tmp_path / "ckpt")
        else:
            rb.load_state_dict(state)
        assert [rb.sample()["index"].tolist() for _ in range(3)] == drawn
        assert rb.extend(TensorDict({"x": torch.arange(2)}, [2])).tolist() == written
        assert written[0] // 100 == 1  # the fourth extend went to shard 0, the next to 1
        damaged = {**rb.state_dict(), "client": {"cursor": 7, "generator": None}}
        with pytest.raises(ValueError, match="cursor must be an int in"):
            rb.load_state_dict(damaged)
    finally:
        rb.close()


def test_respawn_rebuilds_every_shard_from_the_checkpoint_at_a_url(uniform, tmp_path):
    url = f"file://{tmp_path}/ckpt"  # an fsspec URL: each shard under url/shard-k
    uniform.empty()
    uniform.extend([torch.tensor(1.0), torch.tensor(2.0)])
    uniform.extend([torch.tensor(3.0)])
    uniform.dumps(url)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "shard-0", "shard-1", "sharded.json"]
    uniform.extend([torch.tensor(4.0)])
    old_pids = [shard.actor_info["pid"] for shard in uniform.shards]
    uniform.respawn(url)
    assert [shard.actor_info["pid"] for shard in uniform.shards] != old_pids
    assert [shard[:].tolist() for shard in uniform.shards] == [[1.0, 2.0], [3.0]]
    assert uniform.write_count == 3


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_shards": 0}, ValueError, "num_shards must be >= 1, got 0"),
    ({"num_shards": 2, "write_strategy": "random"}, ValueError, "write_strategy must be one of"),
    ({"num_shards": 2, "generator": 3}, TypeError, "generator must be a torch.Generator"),
    ({"num_shards": 2, "storage": 3}, TypeError, "storage must be a Storage"),
])
def test_bad_arguments_are_refused(ray_session, kwargs, error, match):
    with pytest.raises(error, match=match):
        ShardedReplayBuffer(**kwargs)


def test_rows_a_shard_writer_does_not_keep_are_minus_one_and_an_item_not_kept_is_none(
        ray_session):
    """With a max-value writer, as TorchRL 0.14.1: ``extend`` returns one entry per batch row
    (the global slot, or ``-1`` for a row not kept, not shifted by the shard's offset) and
    ``add`` of an item not kept returns ``None``; the caller's data is left as it is."""
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 2),
                             writer=partial(TensorDictMaxValueWriter, rank_key="rank"),
                             replay_buffer_cls=TensorDictReplayBuffer, batch_size=4)
    ranked = lambda ranks: TensorDict({"rank": torch.tensor(ranks)}, [len(ranks)])  # noqa: E731
    try:
        assert rb.extend(ranked([5.0, 1.0])).tolist() == [0, 1]  # shard 0
        assert rb.extend(ranked([3.0, 2.0])).tolist() == [2, 3]  # shard 1
        item = ranked([0.1])[0]
        assert rb.add(item) is None  # shard 0 is full and 0.1 is below its lowest rank
        assert "index" not in item.keys()
        td = ranked([0.5, 4.0, 0.2])
        assert rb.extend(td).tolist() == [-1, 3, -1]  # shard 1: 4 replaces rank 2 (slot 1)
        assert "index" not in td.keys()
        assert rb.add(ranked([9.0])[0]) == 1  # shard 0: 9 replaces rank 1 (slot 1)
        assert [shard[:]["rank"].tolist() for shard in rb.shards] == [[5.0, 9.0], [3.0, 4.0]]
        assert len(rb) == 4
    finally:
        rb.shutdown()


def test_shards_without_replacement_fill_every_batch_across_their_epochs(ray_session):
    # (a shard whose epoch ended handed out fewer items than asked: the merge raised a bare
    # IndexError in about a third of the samples, and some batches came back short)
    from tdreplay.core import SamplerWithoutReplacement

    rb = ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 8),
                             sampler=SamplerWithoutReplacement, batch_size=4,
                             name="sharded-without-replacement",
                             generator=torch.Generator().manual_seed(0))
    try:
        rb.extend([torch.tensor(float(i)) for i in range(3)])
        rb.extend([torch.tensor(float(10 + i)) for i in range(5)])
        seen = torch.cat([rb.sample(return_info=True)[1]["index"] for _ in range(60)])
        assert seen.numel() == 240  # every batch whole
        written = torch.tensor([0, 1, 2, 8, 9, 10, 11, 12])
        assert bool(torch.isin(seen, written).all())
        counts = torch.bincount(seen, minlength=16)[written]
        assert int(counts.min()) > 15  # each item drawn in its shard's epochs (30 each on average)
    finally:
        rb.close()


def test_shards_without_replacement_never_repeat_an_item_within_a_batch(ray_session):
    # the shard counts were multinomial: a shard asked for more items than its epoch had
    # left started a new epoch to top the batch up, and repeated items (20 in 40 batches;
    # a batch of all 10 items held one twice and missed two)
    from tdreplay.core import SamplerWithoutReplacement

    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 20), batch_size=6,
                             sampler=SamplerWithoutReplacement,
                             replay_buffer_cls=TensorDictReplayBuffer,
                             generator=torch.Generator().manual_seed(0))
    try:
        rb.extend(TensorDict({"id": torch.arange(7)}, [7]))
        rb.extend(TensorDict({"id": torch.arange(100, 103)}, [3]))
        written = set(range(7)) | {100, 101, 102}
        for _ in range(40):
            ids = rb.sample()["id"].tolist()
            assert len(ids) == 6 and len(set(ids)) == 6 and set(ids) <= written
        whole = rb.sample(10)["id"].tolist()  # every item, once
        assert sorted(whole) == sorted(written)
    finally:
        rb.close()


def test_shards_without_replacement_hand_out_every_item_for_a_batch_larger_than_all(
        ray_session):
    # (a shard was asked for more distinct items than it holds: after 64 rounds of top-up
    # draws, each starting a new epoch of the shard, the sample raised RuntimeError "drew no
    # items"); one buffer without replacement hands out what it has
    from tdreplay.core import SamplerWithoutReplacement

    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 20), batch_size=4,
                             sampler=SamplerWithoutReplacement,
                             replay_buffer_cls=TensorDictReplayBuffer,
                             generator=torch.Generator().manual_seed(0))
    try:
        rb.extend(TensorDict({"id": torch.arange(6)}, [6]))
        rb.extend(TensorDict({"id": torch.arange(100, 106)}, [6]))
        written = set(range(6)) | set(range(100, 106))
        rb.sample()
        for size in (13, 30):
            ids = rb.sample(size)["id"].tolist()
            assert sorted(ids) == sorted(written)  # every item once
        assert len(set(rb.sample(8)["id"].tolist())) == 8
    finally:
        rb.close()


def test_loads_of_a_checkpoint_with_a_damaged_shard_changes_no_shard(ray_session, tmp_path):
    # (shard 0 was restored before shard 1's damaged file was found: the buffer was left half
    # old, half restored, and shard 0's live rows were gone)
    rb = ShardedReplayBuffer(num_shards=2, storage=partial(LazyTensorStorage, 8), batch_size=2,
                             name="sharded-damaged-checkpoint")
    try:
        rb.extend(TensorDict({"id": torch.arange(4)}, [4]))
        rb.extend(TensorDict({"id": torch.arange(10, 14)}, [4]))
        rb.dumps(tmp_path / "ckpt")
        rb.empty()
        rb.extend(TensorDict({"id": torch.arange(500, 503)}, [3]))
        rb.extend(TensorDict({"id": torch.arange(600, 603)}, [3]))
        before = [s["_storage"]["storage"]["id"].tolist() for s in rb.state_dict()["shards"]]
        data = max((p for p in (tmp_path / "ckpt" / "shard-1").rglob("*") if p.is_file()),
                   key=lambda p: p.stat().st_size)
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
        with pytest.raises(CheckpointError, match="shard-1"):
            rb.loads(tmp_path / "ckpt")
        after = [s["_storage"]["storage"]["id"].tolist() for s in rb.state_dict()["shards"]]
        assert after == before and len(rb) == 6
    finally:
        rb.close()
