"""Non-tensor entries (strings and other JSON values: ``NonTensorData`` / ``NonTensorStack``) in
``TensorStorage`` / ``LazyTensorStorage``: kept in columns of objects beside the tensors, read
back as TorchRL 0.14.1 reads them, checked (JSON values only), saved and restored; refused by
name (nothing written) where a storage or checkpointer cannot keep them.

What TorchRL 0.14.1 returns was observed by running it (``LazyTensorStorage(10)`` in a
``ReplayBuffer``, tensordict 0.14.3) and is written below as literals: a read of a batch (``rb[:]``,
``rb[1:2]``, ``storage.get(tensor)``, ``rb.sample(n)``, ``storage[:]``) gives a
``NonTensorStack`` under ``.get(key)`` and its list of values under ``[key]`` (one value per
row, even when every row holds the same one, and for one-row batches); a read of one item
(``rb[0]``, ``storage.get(1)``) gives a ``NonTensorData`` under ``.get(key)`` and the value
itself under ``[key]``; a tensorclass's ``str`` field reads alike (``.text``).
"""

from __future__ import annotations

import copy
import json
import pickle
import re

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, tensorclass

from tdreplay.core import CheckpointError, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.checkpoint import LOCK_NAME, POINTER_NAME, verify_checkpoint
from tdreplay.core.process_sharing import NotShareableError
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.storages import (
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    TensorStorage,
)
from tdreplay.storages._layout import TensorLayout


@tensorclass
class Prompted:
    x: torch.Tensor
    text: str


def _batch(n, text=None, **extra):
    td = TensorDict({"x": torch.arange(float(n)), **extra}, [n])
    if text is not None:
        td["text"] = text
    return td


def _texts(storage):
    """The values of the written rows' ``text`` entry (a list)."""
    return list(storage[:]["text"])


def _layout(storage):
    return storage._current_layout()


# ---- reads: what TorchRL 0.14.1 returns ------------------------------------------------------
@pytest.mark.parametrize("text, values", [
    (NonTensorData("hi", batch_size=[3]), ["hi", "hi", "hi"]),  # one value for every row
    (NonTensorStack("a", "b", "c"), ["a", "b", "c"]),  # one value per row
    (NonTensorStack("a", "a", "a"), ["a", "a", "a"]),  # identical values: still a stack
])
def test_reads_give_what_torchrl_gives(text, values):
    storage = LazyTensorStorage(10)
    rb = ReplayBuffer(storage=storage)
    rb.extend(_batch(3, text))
    # TorchRL 0.14.1: rb[:]["text"] -> LinkedList(values); rb[:].get("text") -> NonTensorStack
    for batch in (rb[:], storage[:], storage.get(torch.arange(3))):
        assert list(batch["text"]) == values
        assert type(batch.get("text")) is NonTensorStack
        assert batch.get("text").batch_size == torch.Size([3])
    # TorchRL 0.14.1: rb[1:2]["text"] -> LinkedList([values[1]]) (a stack of one)
    one_row = rb[1:2]
    assert list(one_row["text"]) == values[1:2] and type(one_row.get("text")) is NonTensorStack
    assert list(storage.get(torch.tensor([1]))["text"]) == values[1:2]
    picked = storage.get(torch.tensor([0, 2]))
    assert list(picked["text"]) == [values[0], values[2]]
    # TorchRL 0.14.1: rb[0]["text"] -> 'a' (str); rb[0].get("text") -> NonTensorData
    item = rb[0]
    assert item["text"] == values[0] and type(item["text"]) is str
    assert type(item.get("text")) is NonTensorData and item.get("text").batch_size == ()
    assert storage.get(1)["text"] == values[1]
    # TorchRL 0.14.1: rb.sample(4)["text"] -> LinkedList of 4, sample(1) -> LinkedList of 1
    for n in (4, 1):
        sample = rb.sample(n)
        assert type(sample.get("text")) is NonTensorStack
        assert sample.get("text").batch_size == torch.Size([n])
        assert list(sample["text"]) == [values[int(x)] for x in sample["x"]]


def test_samples_match_their_rows():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=16)
    rb.extend(_batch(5, NonTensorStack(*"abcde")))
    sample = rb.sample()
    assert list(sample["text"]) == ["abcde"[int(x)] for x in sample["x"]]
    assert list(sample["text"]) == ["abcde"[int(i)] for i in sample["index"]]


def test_a_tensorclass_str_field_reads_as_torchrl():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(Prompted(x=torch.arange(3.0), text="hi", batch_size=[3]))
    rb.extend(Prompted(x=torch.arange(2.0), text=NonTensorStack("p", "q"), batch_size=[2]))
    # TorchRL 0.14.1: rb[:].text -> LinkedList([...]); rb[0].text -> 'hi'; sample(n).text ->
    # LinkedList of n (also for n == 1); the data read is of the tensorclass
    assert type(rb[:]) is Prompted
    assert list(rb[:].text) == ["hi", "hi", "hi", "p", "q"]
    assert rb[0].text == "hi" and rb[4].text == "q"
    assert list(rb[1:2].text) == ["hi"]
    assert len(list(rb.sample(1).text)) == 1
    assert set(rb.sample(8).text) <= {"hi", "p", "q"}


def test_a_storage_of_two_dims():
    storage = LazyTensorStorage(12, ndim=2)
    text = NonTensorStack(NonTensorStack("a", "b", "c"), NonTensorStack("d", "e", "f"))
    storage.set(slice(0, 2), TensorDict({"x": torch.arange(6.0).view(2, 3), "text": text}, [2, 3]))
    # TorchRL 0.14.1 (same writes): storage[:]["text"] -> [['a','b','c'], ['d','e','f']],
    # storage[0]["text"] -> ['a','b','c'], storage[0, 1]["text"] -> 'b', and
    # storage[(tensor([0, 1]), tensor([2, 0]))]["text"] -> ['c', 'd']
    assert [list(row) for row in storage[:]["text"]] == [["a", "b", "c"], ["d", "e", "f"]]
    assert storage[:].get("text").batch_size == torch.Size([2, 3])
    assert list(storage[0]["text"]) == ["a", "b", "c"]
    assert storage[0, 1]["text"] == "b"
    assert list(storage[(torch.tensor([0, 1]), torch.tensor([2, 0]))]["text"]) == ["c", "d"]
    got = storage.get(torch.tensor([[0, 4], [5, 1]]))  # flat slots, any shape
    assert [list(row) for row in got["text"]] == [["a", "e"], ["f", "b"]]
    assert got["x"].tolist() == [[0.0, 4.0], [5.0, 1.0]]


def test_nested_keys_and_levels_with_their_own_dims():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    names = NonTensorStack(*[NonTensorStack("p", "q") for _ in range(3)])
    rb.extend(TensorDict({
        "x": torch.arange(3.0),
        ("n", "t"): NonTensorStack("a", "b", "c"),
        "agents": TensorDict({"obs": torch.zeros(3, 2), "name": names}, [3, 2]),
        "words": TensorDict({"w": NonTensorStack("u", "v", "w")}, [3]),  # no tensor here
    }, [3]))
    sample = rb.sample()
    rows = [int(x) for x in sample["x"]]
    assert list(sample["n", "t"]) == ["abc"[r] for r in rows]
    assert list(sample["words", "w"]) == ["uvw"[r] for r in rows]
    assert sample["agents"].batch_size == torch.Size([4, 2])
    assert [list(v) for v in sample["agents", "name"]] == [["p", "q"]] * 4
    assert list(rb[:]["n", "t"]) == ["a", "b", "c"]


def test_item_batch_dims_are_kept():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    rb.add(TensorDict({"x": torch.zeros(2), "t": NonTensorStack("a", "b")}, [2]))
    rb.add(TensorDict({"x": torch.ones(2), "t": NonTensorStack("c", "d")}, [2]))
    assert [list(r) for r in rb[:]["t"]] == [["a", "b"], ["c", "d"]]
    assert list(rb[1]["t"]) == ["c", "d"]


def test_json_values_of_every_kind_come_back_equal_and_are_copies():
    values = ["s", 3, 2.5, True, None, [1, [2, "x"]], {"k": {"n": [None]}}]
    storage = LazyTensorStorage(10)
    storage.set(slice(0, 7), _batch(7, NonTensorStack(*values)))
    read = _texts(storage)
    assert read == values and [type(v) for v in read] == [type(v) for v in values]
    read[5].append("changed")  # a reader's change stays out of the storage
    values[6]["k"]["n"].append("changed")  # and so does a writer's, after the write
    assert _texts(storage)[5:] == [[1, [2, "x"]], {"k": {"n": [None]}}]


# ---- writes: which slots -----------------------------------------------------------------------
def test_writes_reach_exactly_their_slots():
    storage = LazyTensorStorage(6)
    storage.set(slice(0, 6), _batch(6, NonTensorStack(*"abcdef")))
    storage.set(torch.tensor([4, -6]), _batch(2, NonTensorStack("E", "A")))  # negative: from end
    storage.set(2, TensorDict({"x": torch.tensor(9.0), "text": "C"}, []))
    storage.set(slice(1, 6, 3), _batch(2, NonTensorStack("B", "e")))  # a stepped slice: 1, 4
    assert _texts(storage) == ["A", "B", "C", "d", "e", "f"]
    assert storage[:]["x"].tolist() == [1.0, 0.0, 9.0, 3.0, 1.0, 5.0]


def test_round_robin_wraps_around():
    rb = ReplayBuffer(storage=LazyTensorStorage(4))
    rb.extend(_batch(3, NonTensorStack("a", "b", "c")))
    rb.extend(_batch(3, NonTensorStack("d", "e", "f")))
    assert _texts(rb.storage) == ["e", "f", "c", "d"]


def test_rows_never_written_read_none():
    # (rows skipped by a write past the written ones are refused: see test_set_gaps; rows
    # written before a non-tensor entry was added hold none of it)
    storage = LazyTensorStorage(6)
    with pytest.raises(IndexError, match="filled without gaps"):
        storage.set(torch.tensor([3]), _batch(1, NonTensorStack("d")))
    storage.set(torch.tensor([0, 1, 2]), _batch(3))
    storage.set(torch.tensor([3]), _batch(1, NonTensorStack("d")))
    assert _texts(storage) == [None, None, None, "d"]
    assert storage[:]["x"].tolist() == [0.0, 1.0, 2.0, 0.0]


def test_index_assignment_set_key_and_update():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    rb.add(TensorDict({"x": torch.tensor(1.0), "t": "hello"}, []))
    rb.add(TensorDict({"x": torch.tensor(2.0), "t": "world"}, []))
    rb[0] = TensorDict({"x": torch.tensor(7.0), "t": "set"}, [])
    assert list(rb[:]["t"]) == ["set", "world"]  # TorchRL 0.14.1: LinkedList(['set', 'world'])
    rb[0:2] = TensorDict({"x": torch.tensor([7.0, 8.0]), "t": NonTensorStack("p", "q")}, [2])
    assert list(rb[:]["t"]) == ["p", "q"]
    storage = rb.storage
    storage[(slice(1, 2),)] = TensorDict({"x": torch.tensor([3.0]), "t": NonTensorStack("T")}, [1])
    assert list(rb[:]["t"]) == ["p", "T"] and rb[:]["x"].tolist() == [7.0, 3.0]
    storage.set_key("t", NonTensorStack("A", "B"))
    assert list(rb[:]["t"]) == ["A", "B"]
    storage.set_key("t", "Z", index=1)  # one value for the rows selected
    storage.set_key("t", NonTensorData("Y"), index=slice(0, 1))
    assert list(rb[:]["t"]) == ["Y", "Z"]
    storage.update_(TensorDict({"t": NonTensorStack("U", "V"), "x": torch.zeros(2)}, [2]))
    assert list(rb[:]["t"]) == ["U", "V"] and rb[:]["x"].tolist() == [0.0, 0.0]
    storage.update_(TensorDict({"t": NonTensorStack("u", "v"), "x": torch.ones(2)}, [2]),
                    keys_to_update=["x"])
    assert list(rb[:]["t"]) == ["U", "V"] and rb[:]["x"].tolist() == [1.0, 1.0]


def test_new_entries_after_the_first_write():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(_batch(2))
    rb.extend(_batch(2, NonTensorStack("a", "b")))  # a new non-tensor entry: None before
    assert _texts(rb.storage) == [None, None, "a", "b"]
    rb.extend(_batch(2, NonTensorStack("c", "d"), y=torch.ones(2)))  # a new tensor entry
    assert _texts(rb.storage) == [None, None, "a", "b", "c", "d"]
    assert rb[:]["y"].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_a_wrapped_storage_and_a_compilable_one():
    storage = TensorStorage(_batch(3, NonTensorStack("a", "b", "c")))
    assert len(storage) == 3 and _texts(storage) == ["a", "b", "c"]
    rb = ReplayBuffer(storage=LazyTensorStorage(10, compilable=True))
    rb.extend(_batch(2, NonTensorStack("a", "b")))
    rb.extend(_batch(2, NonTensorStack("c", "d")))
    assert _texts(rb.storage) == ["a", "b", "c", "d"]


def test_tensor_only_data_keeps_the_plain_layout():
    # the extend / sample paths of tensor-only data are the tensor layout's, untouched
    storage = LazyTensorStorage(10)
    storage.set(slice(0, 2), _batch(2))
    assert type(_layout(storage)) is TensorLayout
    storage.set(slice(2, 4), _batch(2, NonTensorStack("a", "b")))
    assert type(_layout(storage)) is not TensorLayout


# ---- refusals: named, nothing changed --------------------------------------------------------
@pytest.mark.parametrize("bad, kind", [
    ((1, 2), "tuple"),
    (object(), "object"),
    (torch.ones(2), "Tensor"),
    (np.int64(3), "int64"),
    ({1: "a"}, "dict"),
    ([1, {"k": (1,)}], "tuple"),
])
def test_a_value_json_does_not_hold_is_refused_and_nothing_changes(bad, kind):
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(_batch(3, NonTensorStack("a", "b", "c")))
    before, texts = buffer_snapshot(rb), _texts(rb.storage)
    message = f"entry 'text' holds a value of type {kind} .*ListStorage or LazyStackStorage"
    with pytest.raises(TypeError, match=message):
        rb.extend(_batch(2, NonTensorStack("ok", bad)))
    with pytest.raises(TypeError, match=message):
        rb.storage[0] = TensorDict({"x": torch.tensor(5.0), "text": NonTensorData(bad)}, [])
    with pytest.raises(TypeError, match=message):
        rb.storage.set_key("text", NonTensorData(bad), index=0)
    with pytest.raises(TypeError, match=message):
        rb.storage.update_(TensorDict({"x": torch.ones(3), "text": NonTensorData(bad, [3])}, [3]))
    assert_same(buffer_snapshot(rb), before)
    assert _texts(rb.storage) == texts and rb[:]["x"].tolist() == [0.0, 1.0, 2.0]


def test_a_first_write_refused_lays_nothing_out():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    with pytest.raises(TypeError, match="entry 'text' holds a value of type object"):
        rb.extend(_batch(2, NonTensorStack("a", object())))
    assert len(rb) == 0 and rb.write_count == 0 and not rb.storage.initialized
    rb.extend(_batch(2, NonTensorStack("a", "b")))  # the storage lays out as if new
    assert _texts(rb.storage) == ["a", "b"]


def test_data_that_does_not_fit_is_refused_by_name():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(_batch(2, NonTensorStack("a", "b")))
    before = buffer_snapshot(rb)
    with pytest.raises(KeyError, match=re.escape("missing ['text']")):
        rb.extend(_batch(2))
    with pytest.raises(TypeError, match="entry 'text' is a Tensor: this storage holds "
                                        "non-tensor data"):
        rb.extend(_batch(2, torch.zeros(2)))
    with pytest.raises(ValueError, match="entry 'x' has shape"):  # the tensors are checked too
        rb.extend(TensorDict({"x": torch.zeros(2, 3), "text": NonTensorStack("c", "d")}, [2]))
    with pytest.raises(ValueError, match=r"index .* of key 'text' is not within the 2 written"):
        rb.storage.set_key("text", "v", index=5)
    with pytest.raises(ValueError, match=re.escape("entry 'text' has batch size (3,), expected "
                                                   "(2,)")):
        rb.storage.set_key("text", NonTensorStack("a", "b", "c"))
    assert_same(buffer_snapshot(rb), before)
    assert _texts(rb.storage) == ["a", "b"]


@pytest.mark.parametrize("entry", [{"p": "a"}, {("n", "q"): "deep"}])
def test_memory_mapped_storages_refuse_them_by_name(tmp_path, entry):
    # files other processes map: objects kept in one process would diverge silently
    for storage in (LazyMemmapStorage(8, scratch_dir=tmp_path / "m"),
                    LazyTensorStorage(8, shared_init=True)):
        rb = TensorDictReplayBuffer(storage=storage)
        item = TensorDict({"x": torch.tensor(1.0)}, [])
        for key, value in entry.items():
            item[key] = value
        name = next(iter(entry))
        with pytest.raises(TypeError, match=re.escape(f"entry {name!r} is a NonTensorData: ")
                           + ".*diverge.*silently"):
            rb.add(item)
        assert len(rb) == 0 and rb.write_count == 0 and not rb.storage.initialized


def test_a_memory_mapped_storage_refuses_a_new_entry_and_changes_nothing(tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(8, scratch_dir=tmp_path))
    rb.extend(_batch(3))
    before = buffer_snapshot(rb)
    with pytest.raises(TypeError, match="entry 'p' is a NonTensorStack: "):
        rb.extend(_batch(2, p=NonTensorStack("a", "b")))
    assert_same(buffer_snapshot(rb), before)
    assert rb[:]["x"].tolist() == [0.0, 1.0, 2.0]


def test_a_storage_of_objects_keeps_any_object():
    rb = TensorDictReplayBuffer(storage=LazyStackStorage(8))
    for i in range(3):
        rb.add(TensorDict({"p": "abc"[i], "x": torch.tensor(float(i))}, []))
    assert [rb[i]["p"] for i in range(3)] == ["a", "b", "c"]


def test_sharing_between_processes_is_refused():
    storage = LazyTensorStorage(4)
    storage.set(slice(0, 2), _batch(2, NonTensorStack("a", "b")))
    with pytest.raises(NotShareableError, match="Cannot share a storage"):
        storage.check_shareable()


# ---- state ---------------------------------------------------------------------------------
def _filled(**kwargs):
    storage = LazyTensorStorage(8, **kwargs)
    storage.set(slice(0, 3), TensorDict({
        "x": torch.arange(3.0), "text": NonTensorStack("a", ["b", 1], {"c": None}),
        ("n", "same"): NonTensorData("s", batch_size=[3])}, [3]))
    return storage


def _assert_restored(storage):
    assert len(storage) == 3
    assert _texts(storage) == ["a", ["b", 1], {"c": None}]
    assert list(storage[:]["n", "same"]) == ["s", "s", "s"]
    assert storage[:]["x"].tolist() == [0.0, 1.0, 2.0]
    assert list(storage.get(torch.tensor([2, 0]))["text"]) == [{"c": None}, "a"]


def test_state_dict_round_trip_into_a_new_and_a_laid_out_storage():
    state = _filled().state_dict()
    assert type(state["storage"].get("text")) is NonTensorStack
    fresh = LazyTensorStorage(8)
    fresh.load_state_dict(state)
    _assert_restored(fresh)
    laid_out = _filled()
    laid_out.set_key("text", "other")
    laid_out.load_state_dict(state)
    _assert_restored(laid_out)


def _two_dims_storage():
    storage = LazyTensorStorage(12, ndim=2)
    text = NonTensorStack(NonTensorStack("a", "b", "c"), NonTensorStack("d", "e", "f"))
    storage.set(slice(0, 2), TensorDict({"x": torch.arange(6.0).view(2, 3), "text": text}, [2, 3]))
    return storage, "text", lambda n: TensorDict(
        {"x": torch.ones(n, 3), "text": NonTensorStack(*[NonTensorStack("p", "q", "r")] * n)},
        [n, 3])


def _nested_level_storage():  # a nested level with its own batch dims ([rows, 3])
    storage = LazyTensorStorage(4)

    def rows(n):
        names = NonTensorStack(*[NonTensorStack("p", "q", "r")] * n)
        return TensorDict({"x": torch.ones(n), "agents": TensorDict({"name": names}, [n, 3])}, [n])

    storage.set(slice(0, 2), rows(2))
    return storage, ("agents", "name"), rows


@pytest.mark.parametrize("make", [_two_dims_storage, _nested_level_storage])
def test_an_emptied_storage_round_trips_its_dims_past_the_rows(tmp_path, make):
    # found by differential fuzzing: zero rows of [rows, 3] values were read (and saved) as an
    # empty NonTensorStack, whose batch size tensordict keeps as (0,) (a stack of none, or a
    # clone of one): load_state_dict / loads of the state of an emptied storage then refused
    # it, or laid out a fresh storage with a [rows] column that refused the next write
    storage, key, rows = make()
    storage.empty()
    assert storage.written_rows().get(key).batch_size[1:] == torch.Size([3])
    state = storage.state_dict()
    assert state["storage"].get(key).batch_size[1:] == torch.Size([3])
    storage.dumps(tmp_path)
    targets = [LazyTensorStorage(storage.max_size, ndim=storage.ndim) for _ in range(2)]
    targets[0].load_state_dict(state)
    targets[1].loads(tmp_path)
    storage.load_state_dict(state)
    for target in (*targets, storage):
        assert len(target) == 0
        target.set(slice(0, 1), rows(1))
        assert [list(row) for row in target[:].get(key).tolist()] == [["p", "q", "r"]] * (
            len(target) // target.row_numel)


def test_a_state_with_values_json_does_not_hold_is_refused():
    state = _filled().state_dict()
    state["storage"].set("text", NonTensorStack("a", (1,), "c"))
    fresh, laid_out = LazyTensorStorage(8), _filled()
    for storage in (fresh, laid_out):
        with pytest.raises(ValueError, match="entry 'text' holds a value of type tuple"):
            storage.load_state_dict(state)
    assert not fresh.initialized
    _assert_restored(laid_out)


def test_dumps_loads_keeps_them_as_json(tmp_path):
    storage = _filled()
    storage.dumps(tmp_path)
    storage.dumps(tmp_path)  # twice over the same directory
    snapshot = verify_checkpoint(tmp_path)
    meta = json.loads((snapshot / "storage.json").read_text())
    assert meta["non_tensor"] == "non_tensor.json"
    columns = json.loads((snapshot / "non_tensor.json").read_text())
    assert columns["entries"] == [
        {"key": ["n", "same"], "shape": [3], "values": ["s", "s", "s"]},
        {"key": ["text"], "shape": [3], "values": ["a", ["b", 1], {"c": None}]},
    ]
    assert not list(tmp_path.rglob("*.pkl")) and not list(tmp_path.glob(".*.tmp"))
    for target in (LazyTensorStorage(8), _filled()):
        target.loads(tmp_path)
        _assert_restored(target)


def test_checkpoints_of_tensors_alone_are_as_before(tmp_path):
    storage = LazyTensorStorage(8)
    storage.set(slice(0, 2), _batch(2))
    storage.dumps(tmp_path)
    snapshot = verify_checkpoint(tmp_path)
    assert "non_tensor" not in json.loads((snapshot / "storage.json").read_text())
    assert not (snapshot / "non_tensor.json").exists()
    restored = LazyTensorStorage(8)
    restored.loads(tmp_path)
    assert restored[:]["x"].tolist() == [0.0, 1.0]


def test_a_damaged_column_file_is_refused(tmp_path):
    _filled().write_files(tmp_path)  # (plain files: a manifest would refuse the edit first)
    (tmp_path / "non_tensor.json").write_text(json.dumps(
        {"format": 1, "entries": [{"key": ["text"], "shape": [3], "values": ["a"]}]}))
    target = LazyTensorStorage(8)
    with pytest.raises(CheckpointError, match="non-tensor entries cannot be read"):
        target.loads(tmp_path)
    assert not target.initialized


def test_a_memory_mapped_storage_refuses_such_a_checkpoint(tmp_path):
    _filled().dumps(tmp_path / "ckpt")
    target = LazyMemmapStorage(8, scratch_dir=tmp_path / "scratch")
    with pytest.raises(CheckpointError, match="entry .* is a NonTensorStack: a LazyMemmapStorage"):
        target.loads(tmp_path / "ckpt")
    assert not target.initialized


@pytest.mark.parametrize("checkpointer", [FlatStorageCheckpointer, NestedStorageCheckpointer,
                                          H5StorageCheckpointer])
def test_the_tensor_file_checkpointers_refuse_them_by_name(tmp_path, checkpointer):
    storage = _filled(checkpointer=checkpointer())
    with pytest.raises(TypeError, match=f"entry .* is a NonTensor.*: {checkpointer.__name__} "
                                        "saves tensor entries only.*TensorStorageCheckpointer"):
        storage.dumps(tmp_path)
    assert not [p for p in tmp_path.rglob("*")  # nothing written but the pointer (no snapshot)
                if p.name not in (POINTER_NAME, LOCK_NAME)]


def test_pickle_deepcopy_and_empty():
    storage = _filled()
    for copied in (pickle.loads(pickle.dumps(storage)), copy.deepcopy(storage)):
        _assert_restored(copied)
        copied.set_key("text", "changed")
    _assert_restored(storage)  # the copies are copies
    storage.empty()
    assert len(storage) == 0
    storage.set(slice(0, 1), TensorDict({"x": torch.ones(1), "text": NonTensorStack("z"),
                                         ("n", "same"): NonTensorStack("t")}, [1]))
    assert _texts(storage) == ["z"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_storage_on_another_device():
    rb = ReplayBuffer(storage=LazyTensorStorage(8, device="cuda"), batch_size=4)
    rb.extend(_batch(3, NonTensorStack("a", "b", "c")))
    sample = rb.sample()
    assert sample["x"].device.type == "cuda"
    assert list(sample["text"]) == ["abc"[int(x)] for x in sample["x"].cpu()]
    restored = LazyTensorStorage(8, device="cuda")
    restored.load_state_dict(rb.storage.state_dict())
    assert _texts(restored) == ["a", "b", "c"]


def test_a_storage_wrapping_data_moved_to_its_device():
    # (the columns stay in this process's memory whatever the device of the tensors)
    storage = TensorStorage(_batch(2, NonTensorStack("a", "b")), device="cpu")
    assert storage.get(torch.tensor([1, 0]))["x"].device.type == "cpu"
    assert list(storage.get(torch.tensor([1, 0]))["text"]) == ["b", "a"]
