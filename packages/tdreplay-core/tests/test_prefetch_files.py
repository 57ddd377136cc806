"""The batches drawn ahead in a snapshot: tensors and plain TensorDicts go to ``prefetch.pt``
and load with ``torch.load(weights_only=True)`` (no pickled code runs); other batches are
pickled to ``prefetch.pkl``."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core._prefetch_files import (
    PICKLE_FILE,
    TENSOR_FILE,
    load_prefetched,
    save_prefetched,
)
from tdreplay.core.checkpoint import CheckpointError

RAN: list[str] = []


class Payload:
    """An object whose unpickling leaves a trace."""

    def __reduce__(self):
        return (RAN.append, ("unpickled",))


class Item:
    def __init__(self, value: int) -> None:
        self.value = value


def state_of(queue: list) -> dict:
    return {"version": 1, "capacity": 2, "batch_size": 3, "queue": queue}


def test_tensordict_batches_round_trip_through_the_tensor_file(tmp_path):
    weights = torch.arange(3.0).requires_grad_()
    batch = TensorDict({"obs": torch.arange(6).reshape(3, 2),
                        "next": {"done": torch.tensor([True, False, True])}}, [3])
    info = {"index": torch.tensor([4, 0, 2]), ("next", "truncated"): torch.zeros(3),
            "weights": weights, "epoch": 7, "ran_out": False}
    save_prefetched(tmp_path, state_of([(batch, info), (batch.clone(), {})]))
    assert sorted(p.name for p in tmp_path.iterdir()) == [TENSOR_FILE]
    back = load_prefetched(tmp_path)
    assert back["capacity"] == 2 and back["batch_size"] == 3 and len(back["queue"]) == 2
    data, got = back["queue"][0]
    assert type(data) is TensorDict and data.batch_size == torch.Size([3])
    assert torch.equal(data["obs"], batch["obs"]) and data["next", "done"].tolist() == [
        True, False, True]
    assert data.device == batch.device
    assert sorted(map(str, got)) == sorted(map(str, info))
    assert got[("next", "truncated")].tolist() == [0.0, 0.0, 0.0]
    assert got["weights"].requires_grad and got["epoch"] == 7 and got["ran_out"] is False
    assert isinstance(back["queue"][0], tuple) and back["queue"][1][1] == {}


def test_other_items_fall_back_to_pickle(tmp_path):
    save_prefetched(tmp_path, state_of([([Item(1), Item(2)], {"index": torch.tensor([0, 1])})]))
    assert sorted(p.name for p in tmp_path.iterdir()) == [PICKLE_FILE]
    (items, info), = load_prefetched(tmp_path)["queue"]
    assert [item.value for item in items] == [1, 2] and info["index"].tolist() == [0, 1]


def test_nothing_drawn_ahead_writes_nothing(tmp_path):
    save_prefetched(tmp_path, state_of([]))
    assert list(tmp_path.iterdir()) == []
    assert load_prefetched(tmp_path) is None


def test_a_tensor_file_holding_objects_is_refused_without_running_them(tmp_path):
    torch.save({"queue": [Payload()]}, tmp_path / TENSOR_FILE)
    RAN.clear()
    with pytest.raises(CheckpointError, match="prefetch.pt"):
        load_prefetched(tmp_path)
    assert RAN == []


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_tensor_file_is_a_checkpoint_error(tmp_path, damage):
    save_prefetched(tmp_path, state_of([(torch.ones(3), {"index": torch.arange(3)})]))
    path = tmp_path / TENSOR_FILE
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else b"not a torch file")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_prefetched(tmp_path)
