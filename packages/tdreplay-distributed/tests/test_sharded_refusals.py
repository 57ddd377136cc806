"""A sharded priority update refused for one shard changes no shard, and names global slots
(issue 18 item 9). Runs on the session's local Ray instance (conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.distributed import ShardedReplayBuffer


@pytest.fixture
def sharded(prioritized_shards):
    """The session's emptied 3-shard buffer (alpha 2, conftest.prioritized_shards) whose
    shards hold 2, 2 and 1 rows, through a new client."""
    prioritized_shards.empty()
    rb = ShardedReplayBuffer.attach("sharded")
    for n in (2, 2, 1):
        rb.extend(TensorDict({"x": torch.arange(float(n))}, [n]))
    return rb


def priorities(rb: ShardedReplayBuffer) -> list[torch.Tensor]:
    return [s["_sampler"]["priorities"].clone() for s in rb.state_dict()["shards"]]


def test_unwritten_slot_on_one_shard_updates_no_shard_and_is_named_globally(sharded):
    before = priorities(sharded)
    # slots 0 (shard 0, written), 9 (shard 1, written), 17 (shard 2: local 1, unwritten)
    with pytest.raises(IndexError, match=r"unwritten slots \[17\] \(global slots; shard 2 "
                                         r"holds local slot \[1\] unwritten\)"):
        sharded.update_priority(torch.tensor([0, 9, 17]), torch.tensor([5.0, 6.0, 7.0]))
    assert all(torch.equal(a, b) for a, b in zip(before, priorities(sharded)))
    sharded.update_priority(torch.tensor([0, 9, 16]), torch.tensor([5.0, 6.0, 7.0]))
    after = priorities(sharded)
    assert [float(after[0][0]), float(after[1][1]), float(after[2][0])] == \
        pytest.approx([25.0, 36.0, 49.0])


def test_priority_that_overflows_on_its_shard_updates_no_shard(sharded):
    before = priorities(sharded)
    with pytest.raises(ValueError, match=r"priority \[1e\+200\] overflows"):
        sharded.update_priority(torch.tensor([0, 8]),
                                torch.tensor([2.0, 1e200], dtype=torch.float64))
    assert all(torch.equal(a, b) for a, b in zip(before, priorities(sharded)))


@pytest.mark.parametrize(("priority", "error", "match"), [
    (torch.ones(3, 2), ValueError, "does not match index of shape"),   # index [2, 3]
    (np.array([[1.0, None, 1.0]] * 2, dtype=object), TypeError, "priority must"),
])
def test_bad_priority_shapes_and_dtypes_are_refused_before_any_shard(sharded, priority, error,
                                                                     match):
    before = priorities(sharded)
    index = torch.tensor([[0, 1, 8], [9, 16, 0]])
    with pytest.raises(error, match=match):
        sharded.update_priority(index, priority)
    assert all(torch.equal(a, b) for a, b in zip(before, priorities(sharded)))
    sharded.update_priority(index, torch.tensor([1.0, 2.0, 3.0]))  # broadcasts over rows
    after = priorities(sharded)  # slot 8 (shard 1, local 0) gets 3, slot 9 (local 1) gets 1
    assert [float(after[1][0]), float(after[1][1])] == pytest.approx([9.0, 1.0])


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 1e200])
def test_a_tensordict_priority_update_refused_by_one_shard_updates_no_shard(sharded, bad):
    # (shard 0 took its rows, 50.0 each, before shard 1 refused the NaN: "Nothing was updated")
    before = priorities(sharded)
    update = TensorDict({"index": torch.tensor([0, 1, 8, 9]),
                         "td_error": torch.tensor([50.0, 50.0, bad, 1.0], dtype=torch.float64)},
                        [4])
    with pytest.raises(ValueError, match="priority"):
        sharded.update_tensordict_priority(update)
    assert all(torch.equal(a, b) for a, b in zip(before, priorities(sharded)))


def test_a_rate_limiter_is_refused_with_its_own_reason():
    # the message began with "generator is given once ...", which never applies (generator is
    # a parameter of its own)
    from functools import partial

    from tdreplay.core import ListStorage, MinSize

    with pytest.raises(TypeError, match=r"^rate_limiter is not supported on sharded buffers"):
        ShardedReplayBuffer(num_shards=2, storage=partial(ListStorage, 4),
                            rate_limiter=MinSize(2))


@pytest.mark.parametrize("n", [1, 7, 8, 15, 16])
def test_distinct_shard_draws_never_ask_a_shard_for_more_than_it_holds(n):
    # (a batch of nearly all the items redrew its last ones for about n rounds: 16,000 of
    # 16,000 took 24 s)
    from tdreplay.distributed._sharding import draw_shards

    masses = [(6.0, 1.0, 6, None), (10.0, 1.0, 10, None)]
    g = torch.Generator().manual_seed(n)
    for _ in range(50):
        counts = torch.bincount(draw_shards(n, masses, [0, 1], g, distinct=True),
                                minlength=2).tolist()
        assert sum(counts) == n and counts[0] <= 6 and counts[1] <= 10
    whole = draw_shards(16_000, [(8000.0, 1.0, 8000, None)] * 2, [0, 1], g, distinct=True)
    assert torch.bincount(whole).tolist() == [8000, 8000]


def test_a_manifest_with_a_damaged_client_state_is_refused(tmp_path):
    import json

    from tdreplay.core import CheckpointError
    from tdreplay.distributed._client_state import client_state
    from tdreplay.distributed._sharding import check_manifest, write_manifest

    write_manifest(str(tmp_path), 2)  # (as an earlier version wrote it: no client state)
    assert check_manifest(str(tmp_path), 2) is None
    good = client_state(1, torch.Generator().manual_seed(0))
    write_manifest(str(tmp_path), 2, good)
    assert check_manifest(str(tmp_path), 2) == good
    for damaged in ({**good, "cursor": -1}, {**good, "cursor": True},
                    {**good, "generator": "not base64!"}, {**good, "generator": "AAAA"},
                    {"cursor": 0}):
        (tmp_path / "sharded.json").write_text(json.dumps({"num_shards": 2, "client": damaged}))
        with pytest.raises(CheckpointError, match="sharded.json"):
            check_manifest(str(tmp_path), 2)
