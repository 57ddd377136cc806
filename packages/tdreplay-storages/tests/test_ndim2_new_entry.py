"""An in-place write at an index of a multi-dim tensor storage (``rb[:] = td``, ``rb[i] = td``
of an ``ndim=2`` storage, ``storage[i, j] = td``) with data bringing a new entry adds it, zero-
filled in the cells not written, as a write of rows does at ``ndim=1`` (``adds_entries``); a
``LazyMemmapStorage`` keeps refusing it; a refused write adds nothing."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict, tensorclass

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage, TensorStorage


def _obs() -> torch.Tensor:
    return torch.arange(6.0).reshape(2, 3)


def _buffer(storage=None) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(
        storage=storage if storage is not None else LazyTensorStorage(6, ndim=2)
    )
    rb.extend(TensorDict({"obs": _obs(), "reward": torch.zeros(2, 3)}, [2, 3]))
    return rb


def _state(storage) -> dict:
    """Everything a refused write must leave as it was: keys, dtypes, shapes and values of
    every row (written or not), the written count."""
    td = storage._layout.td
    return {
        "len": len(storage),
        "rows": storage.rows_written,
        "entries": {k: (v.dtype, tuple(v.shape), v.clone()) for k, v in td.items(True, True)},
    }


def _assert_same(before: dict, after: dict) -> None:
    assert after["len"] == before["len"] and after["rows"] == before["rows"]
    assert list(after["entries"]) == list(before["entries"])
    for key, (dtype, shape, value) in before["entries"].items():
        got = after["entries"][key]
        assert got[0] == dtype and got[1] == shape and torch.equal(got[2], value), key


def test_full_slice_write_adds_the_entry_with_its_dtype_and_values():
    rb = _buffer()
    data = rb[:]
    data["value_target"] = (data["obs"] + 1).to(torch.float64)
    data["flag"] = torch.ones(2, 3, 2, dtype=torch.bool)
    rb[:] = data
    out = rb[:]
    assert out.batch_size == torch.Size([2, 3])
    assert out["value_target"].dtype is torch.float64
    assert out["value_target"].tolist() == (_obs() + 1).tolist()
    assert out["flag"].shape == (2, 3, 2) and out["flag"].dtype is torch.bool
    assert out["flag"].all()
    assert out["obs"].tolist() == _obs().tolist() and not out["reward"].any()
    assert len(rb) == 6


def test_write_all_adds_the_entry_as_the_full_slice():
    rb = _buffer()
    everything = rb.read_all_in_order()
    everything["value_target"] = everything["obs"] + 1
    rb.write_all(everything)
    assert rb.read_all_in_order()["value_target"].tolist() == (_obs() + 1).tolist()
    assert rb[:]["value_target"].tolist() == (_obs() + 1).tolist()


def test_row_write_adds_the_entry_zero_filled_elsewhere():
    rb = _buffer()
    row = rb[1]  # the second trajectory: [3]
    row["v"] = torch.tensor([7, 8, 9], dtype=torch.int32)
    row["obs"] = row["obs"] * 10
    rb[1] = row
    out = rb[:]
    assert out["v"].dtype is torch.int32
    assert out["v"].tolist() == [[0, 0, 0], [7, 8, 9]]
    assert out["obs"].tolist() == [[0.0, 1.0, 2.0], [30.0, 40.0, 50.0]]


def test_partial_index_write_adds_the_entry_in_the_cells_written():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12, ndim=2))
    rb.extend(TensorDict({"obs": torch.arange(12.0).reshape(3, 4)}, [3, 4]))  # 3 envs, 4 steps
    part = rb[1:, 2]
    assert part.batch_size == torch.Size([2])
    part["v"] = torch.tensor([1.0, 2.0])
    rb[1:, 2] = part
    out = rb[:]
    assert out["v"].tolist() == [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 2.0, 0.0]]
    assert out["obs"].tolist() == torch.arange(12.0).reshape(3, 4).tolist()


def test_storage_index_write_adds_the_entry():
    storage = LazyTensorStorage(6, ndim=2)
    storage.set(slice(0, 2), TensorDict({"obs": _obs()}, [2, 3]))
    storage[1, 0] = TensorDict(
        {"obs": torch.tensor(-1.0), "n": {"z": torch.tensor([4, 5], dtype=torch.int16)}}, []
    )
    out = storage[:]
    assert out[("n", "z")].dtype is torch.int16 and out[("n", "z")].shape == (2, 3, 2)
    assert out[("n", "z")][1, 0].tolist() == [4, 5]
    assert out[("n", "z")].sum().item() == 9  # every other cell zero
    assert out["obs"][1, 0].item() == -1.0 and out["obs"][0, 0].item() == 0.0
    # a later write of the grown keys writes the new entry as any other
    storage[0, 1] = TensorDict({"obs": torch.tensor(3.0), "n": {"z": torch.tensor([1, 1])}}, [])
    assert storage[0, 1][("n", "z")].tolist() == [1, 1]


def test_storage_set_at_rows_adds_the_entry():
    storage = TensorStorage(TensorDict({"obs": torch.zeros(2, 3)}, [2, 3]), ndim=2)
    storage.set(1, TensorDict({"obs": torch.ones(3), "v": torch.full((3,), 2)}, [3]))
    assert storage[:]["v"].tolist() == [[0, 0, 0], [2, 2, 2]]
    storage[(slice(None), 0)] = TensorDict(
        {"obs": torch.ones(2), "v": torch.ones(2, dtype=torch.long), "w": torch.ones(2)}, [2]
    )
    assert storage[:]["w"].tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert storage[:]["v"].tolist() == [[1, 0, 0], [1, 2, 2]]


def test_data_lacking_an_entry_writes_those_it_has():
    rb = _buffer()
    rb[0] = TensorDict({"obs": torch.full((3,), 9.0)}, [3])  # no "reward": kept as stored
    assert sorted(rb[:].keys()) == ["obs", "reward"]
    assert rb[:]["obs"].tolist() == [[9.0, 9.0, 9.0], [3.0, 4.0, 5.0]]


REFUSED = {  # (value written at index, error): each also brings the new entry "v"
    "missing_and_new": (
        TensorDict({"obs": torch.ones(2), "v": torch.ones(2)}, [2]),
        (slice(None), 0),
        KeyError,
    ),
    "bad_shape": (
        TensorDict(
            {"obs": torch.ones(2, 2), "k": torch.ones(2, dtype=torch.long), "v": torch.ones(2)}, [2]
        ),
        (slice(None), 0),
        ValueError,
    ),
    "bad_index": (
        TensorDict(
            {"obs": torch.ones(2), "k": torch.ones(2, dtype=torch.long), "v": torch.ones(2)}, [2]
        ),
        (slice(None), 7),
        IndexError,
    ),
    "lossy_cast": (
        TensorDict({"obs": torch.ones(2), "k": torch.full((2,), 0.5), "v": torch.ones(2)}, [2]),
        (slice(None), 0),
        TypeError,
    ),
    "key_index": (
        TensorDict(
            {
                "obs": torch.ones(2, 3),
                "k": torch.ones(2, 3, dtype=torch.long),
                "v": torch.ones(2, 3),
            },
            [2, 3],
        ),
        ("obs",),
        TypeError,
    ),
}


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_write_with_a_new_key_leaves_the_storage_unchanged(case):
    value, index, error = case
    storage = LazyTensorStorage(6, ndim=2)
    storage.set(
        slice(0, 2), TensorDict({"obs": _obs(), "k": torch.zeros(2, 3, dtype=torch.long)}, [2, 3])
    )
    before = _state(storage)
    with pytest.raises(error):
        storage[index] = value
    _assert_same(before, _state(storage))
    assert sorted(storage[:].keys()) == ["k", "obs"]


def test_missing_keys_beside_a_new_one_are_named():
    storage = LazyTensorStorage(6, ndim=2)
    storage.set(slice(0, 2), TensorDict({"obs": _obs(), "k": torch.zeros(2, 3)}, [2, 3]))
    before = _state(storage)
    with pytest.raises(KeyError, match=r"missing \['k'\], unexpected \['v'\]"):
        storage[0, 0] = TensorDict({"obs": torch.tensor(1.0), "v": torch.tensor(1.0)}, [])
    _assert_same(before, _state(storage))


def test_a_new_non_tensor_entry_is_added_empty_elsewhere():
    storage = LazyTensorStorage(6, ndim=2)
    storage.set(slice(0, 2), TensorDict({"obs": _obs()}, [2, 3]))
    value = TensorDict({"obs": torch.ones(2)}, [2])
    value["tag"] = NonTensorStack("a", "b")
    storage[:, 1] = value
    out = storage[:]
    assert out["obs"][:, 1].tolist() == [1.0, 1.0]
    assert out[:, 1]["tag"] == ["a", "b"]
    assert out[:, 0]["tag"] == [None, None] and out[:, 2]["tag"] == [None, None]


def test_a_new_field_in_a_tensorclass_level_is_refused_and_changes_nothing():
    @tensorclass
    class Obs:
        pos: torch.Tensor

    storage = LazyTensorStorage(6, ndim=2)
    storage.set(slice(0, 2), TensorDict(o=Obs(pos=_obs(), batch_size=[2, 3]), batch_size=[2, 3]))
    before = _state(storage)
    value = TensorDict({"o": TensorDict({"pos": torch.ones(3), "extra": torch.ones(3)}, [3])}, [3])
    with pytest.raises(ValueError, match="not a field of tensorclass Obs"):
        storage[:, 0] = value
    _assert_same(before, _state(storage))


def test_memmap_storage_keeps_refusing_a_new_entry(tmp_path):
    rb = _buffer(LazyMemmapStorage(6, ndim=2, scratch_dir=tmp_path / "m"))
    data = rb[:]
    data["value_target"] = data["obs"] + 1
    before = _state(rb.storage)
    for index, value in (((slice(None)), data), (0, data[0])):
        with pytest.raises(KeyError, match=r"unexpected \['value_target'\]"):
            rb[index] = value
    _assert_same(before, _state(rb.storage))
    assert sorted(rb[:].keys()) == ["obs", "reward"]


def test_state_dict_round_trip_of_a_grown_storage():
    rb = _buffer()
    data = rb[:]
    data["value_target"] = data["obs"] * 2
    rb[:] = data
    restored = TensorDictReplayBuffer(storage=LazyTensorStorage(6, ndim=2))
    restored.load_state_dict(rb.state_dict())
    out = restored[:]
    assert sorted(out.keys()) == ["obs", "reward", "value_target"]
    assert out["value_target"].tolist() == (_obs() * 2).tolist()


def test_dumps_loads_round_trip_of_a_grown_storage(tmp_path):
    rb = _buffer()
    part = rb[1]
    part["value_target"] = torch.tensor([1, 2, 3], dtype=torch.int8)
    rb[1] = part
    rb.dumps(tmp_path)
    restored = TensorDictReplayBuffer(storage=LazyTensorStorage(6, ndim=2))
    restored.loads(tmp_path)
    out = restored[:]
    assert out["value_target"].dtype is torch.int8
    assert out["value_target"].tolist() == [[0, 0, 0], [1, 2, 3]]
    assert out["obs"].tolist() == _obs().tolist() and len(restored) == 6
