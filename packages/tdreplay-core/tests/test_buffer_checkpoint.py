"""dumps/loads (and aliases), state_dict, hooks, and refused checkpoints leaving the buffer as is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    CheckpointError,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    Sampler,
    Storage,
    TensorDictReplayBuffer,
)


def scalars(start: int, stop: int) -> list[torch.Tensor]:
    return [torch.tensor(float(i)) for i in range(start, stop)]


def make(seed: int | None = 0, max_size: int = 8, sampler: Sampler | None = None) -> ReplayBuffer:
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return ReplayBuffer(storage=ListStorage(max_size), sampler=sampler, batch_size=4,
                        generator=generator)


class CyclingSampler(Sampler):
    """A stateful sampler (position in storage order) to check sampler state is restored."""

    def __init__(self) -> None:
        self.pos = 0

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        index = (self.pos + torch.arange(batch_size)) % len(storage)
        self.pos = int(index[-1]) + 1
        return index, {}

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_state_dict(state_dict)
        self.pos = int(state_dict["pos"])


@pytest.mark.parametrize("save, load", [("dumps", "loads"), ("dump", "load"), ("save", "load")])
def test_round_trip_restores_contents_counts_and_cursor(tmp_path, save, load, same):
    rb = make()
    rb.extend(scalars(0, 11))  # wrapped: cursor 3
    getattr(rb, save)(tmp_path / "ckpt")
    restored = make(seed=123)
    restored.extend(scalars(50, 52))  # whatever it held is replaced
    getattr(restored, load)(tmp_path / "ckpt")
    assert len(restored) == 8 and restored.write_count == 11 and restored.writer.cursor == 3
    same(restored[:], rb[:])
    # both continue identically: same slots, same contents
    assert restored.extend(scalars(20, 23)).tolist() == rb.extend(scalars(20, 23)).tolist() == [3, 4, 5]
    same(restored[:], rb[:])
    assert restored.write_count == rb.write_count == 14


def test_aliases_are_the_same_methods():
    assert ReplayBuffer.save is ReplayBuffer.dumps and ReplayBuffer.dump is ReplayBuffer.dumps
    assert ReplayBuffer.load is ReplayBuffer.loads


def test_restored_generator_samples_like_the_original(tmp_path):
    rb = make(seed=0, max_size=100)
    rb.extend(scalars(0, 100))
    rb.sample()
    rb.dumps(tmp_path)
    expected = [rb.sample().tolist() for _ in range(4)]
    restored = make(seed=999, max_size=100)
    restored.loads(tmp_path)
    assert [restored.sample().tolist() for _ in range(4)] == expected


@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_buffer_without_a_generator_takes_the_saved_one(how, tmp_path):
    # (as TorchRL's: the restored buffer continues the saved stream; it drew from torch's
    # global generator instead)
    rb = make(seed=3, max_size=100)
    rb.extend(scalars(0, 100))
    rb.sample()
    state = rb.state_dict()
    rb.dumps(tmp_path)
    expected = [rb.sample().tolist() for _ in range(4)]
    restored = make(seed=None, max_size=100)
    if how == "dumps":
        restored.loads(tmp_path)
    else:
        restored.load_state_dict(state)
    assert restored.sampler.generator is not None
    torch.manual_seed(12345)  # (the global generator plays no part)
    assert [restored.sample().tolist() for _ in range(4)] == expected


def test_a_generator_state_that_does_not_fit_leaves_a_buffer_without_one_as_it_was():
    rb = make(seed=3)
    rb.extend(scalars(0, 8))
    state = rb.state_dict()
    state["_rng"] = torch.zeros(3, dtype=torch.uint8)
    restored = make(seed=None)
    with pytest.raises(ValueError, match=r"state_dict\['_rng'\]"):
        restored.load_state_dict(state)
    assert restored.sampler.generator is None and len(restored) == 0


def test_sampler_state_is_restored(tmp_path):
    rb = make(sampler=CyclingSampler())
    rb.extend(scalars(0, 6))
    assert rb.sample(4).tolist() == [0, 1, 2, 3]
    rb.dumps(tmp_path)
    restored = make(sampler=CyclingSampler())
    restored.loads(tmp_path)
    assert restored.sampler.pos == 4
    assert restored.sample(4).tolist() == rb.sample(4).tolist() == [4, 5, 0, 1]


def test_state_dict_round_trip(same):
    rb = make(seed=1)
    rb.extend(scalars(0, 10))
    rb.sample()
    state = rb.state_dict()
    assert set(state) == {"_storage", "_sampler", "_writer", "_batch_size", "_rng",
                          "_last_written_row"}
    expected = [rb.sample().tolist() for _ in range(3)]
    restored = make(seed=7)
    restored.load_state_dict(state)
    same(restored[:], rb[:])
    assert restored.write_count == 10 and restored.writer.cursor == 2
    assert [restored.sample().tolist() for _ in range(3)] == expected


def test_load_state_dict_refuses_bad_states(unchanged):
    rb = make()
    rb.extend(scalars(0, 3))
    good = make()
    good.extend(scalars(0, 5))
    state = good.state_dict()
    with unchanged(rb), pytest.raises(ValueError, match="_writer"):
        rb.load_state_dict({k: v for k, v in state.items() if k != "_writer"})
    with unchanged(rb), pytest.raises(ValueError, match="cursor"):
        rb.load_state_dict({**state, "_writer": {"write_count": 5}})
    with unchanged(rb), pytest.raises(ValueError, match="max_size"):
        rb.load_state_dict({**state, "_storage": {"storage": scalars(0, 9)}})


def test_tensordict_buffer_round_trip(tmp_path, same):
    rb = TensorDictReplayBuffer(storage=ListStorage(5), batch_size=2)
    rb.extend(TensorDict({"obs": torch.arange(6.0), ("next", "obs"): torch.arange(1.0, 7.0)}, [6]))
    rb.dumps(tmp_path)
    restored = TensorDictReplayBuffer(storage=ListStorage(5), batch_size=2)
    restored.loads(tmp_path)
    same(restored[:], rb[:])
    sample = restored.sample()
    assert torch.equal(sample["next", "obs"], sample["obs"] + 1)


def test_empty_buffer_checkpoint_empties_the_target(tmp_path):
    make().dumps(tmp_path)
    rb = make()
    rb.extend(scalars(0, 5))
    rb.loads(tmp_path)
    assert len(rb) == 0 and rb.write_count == 0 and rb.writer.cursor == 0


def test_save_and_load_hooks(tmp_path):
    rb = make()
    rb.extend(scalars(1, 4))
    rb.register_save_hook(lambda items: [x * 10 for x in items])
    rb.dumps(tmp_path)
    assert [float(x) for x in rb[:]] == [1, 2, 3]  # the hook changes the saved copy only
    restored = make()
    restored.register_load_hook(lambda items: [x + 1 for x in items])
    restored.loads(tmp_path)
    assert [float(x) for x in restored[:]] == [11, 21, 31]


def test_dumps_again_replaces_the_checkpoint(tmp_path):
    rb = make()
    rb.extend(scalars(0, 2))
    rb.dumps(tmp_path)
    rb.extend(scalars(2, 5))
    rb.dumps(tmp_path)
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("snapshot-")]) == 1
    restored = make()
    restored.loads(tmp_path)
    assert [float(x) for x in restored[:]] == [0, 1, 2, 3, 4]


# ---- refused checkpoints -----------------------------------------------------------------------
@pytest.fixture
def populated() -> ReplayBuffer:
    rb = make()
    rb.extend(scalars(0, 5))
    rb.sample()
    return rb


def test_missing_path(tmp_path, populated, unchanged):
    missing = tmp_path / "nowhere"
    with unchanged(populated), pytest.raises(CheckpointError, match="does not exist"):
        populated.loads(missing)
    assert not missing.exists()


def test_directory_that_is_not_a_checkpoint(tmp_path, populated, unchanged):
    (tmp_path / "other.txt").write_text("hello")
    with unchanged(populated), pytest.raises(CheckpointError, match="tdreplay-checkpoint.json"):
        populated.loads(tmp_path)


def test_mismatched_component(tmp_path, populated, unchanged):
    other = make(sampler=CyclingSampler())
    other.extend(scalars(0, 3))
    other.dumps(tmp_path)
    with unchanged(populated), pytest.raises(CheckpointError, match="sampler.*CyclingSampler"):
        populated.loads(tmp_path)


def test_mismatched_capacity(tmp_path, populated, unchanged):
    other = make(max_size=4)
    other.extend(scalars(0, 3))
    other.dumps(tmp_path)
    with unchanged(populated), pytest.raises(CheckpointError, match="max_size=4"):
        populated.loads(tmp_path)


def test_corrupted_file(tmp_path, populated, unchanged):
    other = make()
    other.extend(scalars(10, 14))
    other.dumps(tmp_path)
    items = next(Path(tmp_path).rglob("items.pt"))
    items.write_bytes(items.read_bytes()[:-8])
    with unchanged(populated), pytest.raises(CheckpointError, match="truncated"):
        populated.loads(tmp_path)
    items.write_bytes(b"\x00" * (items.stat().st_size + 8))
    with unchanged(populated), pytest.raises(CheckpointError, match="CRC"):
        populated.loads(tmp_path)


def test_random_sampler_state_dict_is_empty():
    assert RandomSampler().state_dict() == {}


@pytest.mark.parametrize(("kept", "cursor"), [(3, 7), (0, 2), (5, 6)])
def test_state_whose_cursor_is_past_its_rows_is_refused(unchanged, kept, cursor):
    """A writer cursor past the rows of a storage that is not full: it loaded before, and
    every later extend of the ListStorage raised (it would have left a gap)."""
    source = make()
    source.extend(scalars(0, 7))
    state = source.state_dict()
    state["_storage"]["storage"] = state["_storage"]["storage"][:kept]
    state["_writer"]["cursor"] = cursor
    rb = make()
    rb.extend(scalars(10, 12))
    with unchanged(rb), pytest.raises(ValueError, match=(
            rf"state_dict\['_writer'\]: RoundRobinWriter state_dict\['cursor'\] is {cursor} but "
            rf"the storage state holds {kept} rows of 8")):
        rb.load_state_dict(state)
    rb.extend(scalars(12, 13))
    assert [float(x) for x in rb[:]] == [10.0, 11.0, 12.0]


def test_cursor_anywhere_in_a_full_storage_and_at_its_rows_loads():
    full = make()
    full.extend(scalars(0, 11))  # wrapped: cursor 3 of 8 rows
    rb = make()
    rb.load_state_dict(full.state_dict())
    assert rb.writer.cursor == 3 and len(rb) == 8
    partial = make()
    partial.extend(scalars(0, 5))
    rb = make()
    rb.load_state_dict(partial.state_dict())
    rb.extend(scalars(5, 6))
    assert [float(x) for x in rb[:]] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
