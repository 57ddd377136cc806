"""A process that already holds a LazyMemmapStorage never counts nor reads the rows a writer
of another process left torn when it was killed: whatever it does first (sample, len, a
direct get_trusted, state_dict, dumps), the torn rows are dropped before."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyMemmapStorage

CAP = 10
#: a full ring (ids 0..12, cursor at 3) whose writer dies overwriting rows 3..5 (ids 3, 4, 5
#: gone): the ids that stay, oldest first
KEPT = [6, 7, 8, 9, 10, 11, 12]


def rows(ids) -> TensorDict:
    ids = torch.as_tensor(ids)
    n = len(ids)
    return TensorDict({"id": ids, "a": ids.double().unsqueeze(-1).expand(n, 3).clone(),
                       ("next", "z"): (-ids).float()}, [n])


def whole(td: TensorDict) -> bool:
    """Whether every row's leaves come from the same write."""
    ids = td["id"]
    return bool(((td["a"] == ids.double().unsqueeze(-1)).all(-1)
                 & (td["next", "z"] == (-ids).float())).all())


def die_overwriting(killed, rb: ReplayBuffer, how: str) -> None:
    """In a forked child: overwrite counted rows, and die after the first leaf is copied."""
    killed.die_after_first_leaf()
    if how == "extend":  # the ring's next rows: 3, 4, 5 (a packed range)
        rb.extend(rows([100, 101, 102]))
    else:  # scattered rows of a write (a journal of row numbers; an item assignment,
        # set_cursor=False, journals the old values instead: test_memmap_torn_writes)
        rb.storage.set(torch.tensor([3, 5, 4]), rows([100, 101, 102]))


def crash_a_writer(killed, rb: ReplayBuffer, how: str = "extend") -> None:
    killed.run_killed(die_overwriting, killed, rb, how)


def full_ring(tmp_path) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=tmp_path / "s"), batch_size=64,
                      generator=torch.Generator().manual_seed(0))
    rb.extend(rows(range(13)))
    return rb


@pytest.mark.parametrize("how", ["extend", "scattered"])
def test_sample_first_never_draws_a_torn_row(tmp_path, killed, how):
    rb = full_ring(tmp_path)
    crash_a_writer(killed, rb, how)
    for _ in range(5):  # the sampler reads the count after the torn rows are dropped
        batch, info = rb.sample(return_info=True)
        assert whole(batch)
        assert int(info["index"].max()) < len(KEPT)
        assert set(batch["id"].tolist()) <= set(KEPT)
    assert len(rb) == len(KEPT) and rb.storage[:]["id"].tolist() == KEPT


@pytest.mark.parametrize("of", ["buffer", "storage"])
def test_len_first_does_not_count_torn_rows(tmp_path, killed, of):
    rb = full_ring(tmp_path)
    crash_a_writer(killed, rb)
    assert len(rb if of == "buffer" else rb.storage) == len(KEPT)
    assert len(rb) == len(rb.storage) == len(KEPT)
    assert whole(rb.storage[:]) and rb.storage[:]["id"].tolist() == KEPT


def test_get_trusted_first_reads_no_torn_row(tmp_path, killed):
    rb = full_ring(tmp_path)
    crash_a_writer(killed, rb)
    got = rb.storage.get_trusted(torch.tensor([3, 4, 5]))  # the rows the writer tore
    assert whole(got) and got["id"].tolist() == KEPT[3:6]


def test_state_dict_first_holds_no_torn_row(tmp_path, killed):
    rb = full_ring(tmp_path)
    crash_a_writer(killed, rb)
    state = rb.storage.state_dict()
    assert state["len_rows"] == len(KEPT)
    assert whole(state["storage"]) and state["storage"]["id"].tolist() == KEPT


def test_dumps_first_saves_no_torn_row(tmp_path, killed):
    rb = full_ring(tmp_path)
    crash_a_writer(killed, rb)
    rb.dumps(tmp_path / "ckpt")
    restored = ReplayBuffer(storage=LazyMemmapStorage(CAP, scratch_dir=tmp_path / "other"))
    restored.loads(tmp_path / "ckpt")
    assert len(restored) == len(KEPT)
    assert whole(restored.storage[:]) and restored.storage[:]["id"].tolist() == KEPT


def test_a_pickled_handle_drops_torn_rows_too(tmp_path, killed):
    rb = full_ring(tmp_path)
    clone = pickle.loads(pickle.dumps(rb))  # what a spawned worker receives
    crash_a_writer(killed, rb)
    assert len(clone) == len(KEPT)
    batch = clone.sample()
    assert whole(batch) and set(batch["id"].tolist()) <= set(KEPT)
    assert len(rb) == len(KEPT) and rb.storage[:]["id"].tolist() == KEPT


def test_the_ring_goes_on_after_the_torn_rows_are_dropped(tmp_path, killed):
    rb = full_ring(tmp_path)
    crash_a_writer(killed, rb)
    rb.extend(rows([200, 201, 202, 203]))  # 3 fill the dropped places, the oldest goes
    assert len(rb) == CAP
    assert rb.storage[:]["id"].tolist() == [203, *KEPT[1:], 200, 201, 202]
    assert whole(rb.sample())
