"""A tensorclass nested in a TensorDict (``td["obs"]`` an ``Obs``, at any depth, also inside a
top-level tensorclass's field) reads back as that class from the tensor storages and the
compressed storage, in every read form, through buffers, and after state_dict, dumps/loads,
every checkpointer and a reopened memory-mapped storage. Before, the layout of leaves rebuilt
plain TensorDicts there (a ListStorage keeps the objects, so it always gave them back).

The ``TORCHRL_*`` literals are what TorchRL 0.14.1 reads back for the same data and calls
(observed, not imported here). Where tdreplay differs on purpose it says so next to the test.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, is_tensor_collection, tensorclass

from tdreplay.core import CheckpointError, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.checkpoint import verify_checkpoint
from tdreplay.storages import (
    CompressedListStorage,
    FlatStorageCheckpointer,
    H5StorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
    TensorStorage,
    TensorStorageCheckpointer,
)


@tensorclass
class Obs:
    pos: torch.Tensor
    vel: torch.Tensor


@tensorclass
class Other:  # Obs's fields, another class
    pos: torch.Tensor
    vel: torch.Tensor


@tensorclass
class Inner:
    a: torch.Tensor


@tensorclass
class Outer:
    inner: Inner
    b: torch.Tensor


@tensorclass
class Holder:
    td: TensorDict
    x: torch.Tensor


def steps(n: int, start: int = 0) -> TensorDict:
    """``n`` rows: an ``Obs`` at ``"obs"``, an ``Outer`` (holding an ``Inner``) at
    ``("deep", "o")`` of a plain ``"deep"`` TensorDict; row ``i`` holds ``pos == i``,
    ``a == 10 * i``."""
    i = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(
        obs=Obs(pos=i[:, None].expand(n, 2).clone(), vel=-i[:, None].expand(n, 2).clone(),
                batch_size=[n]),
        deep=TensorDict(o=Outer(inner=Inner(a=i[:, None] * 10, batch_size=[n]), b=i + 0.5,
                                batch_size=[n]), batch_size=[n]),
        r=i, batch_size=[n])


def obs(n: int, value: float, cls: type = Obs) -> Any:
    return cls(pos=torch.full((n, 2), value), vel=torch.full((n, 2), value), batch_size=[n])


def classes(td: Any) -> dict[str, str]:
    """The class of every nested level of ``td``, by dotted path."""
    out = {}
    stack = [((), td)]
    while stack:
        path, node = stack.pop()
        for name, value in node.items():
            if not is_tensor_collection(value) or isinstance(value, (NonTensorData,
                                                                     NonTensorStack)):
                continue
            out[".".join((*path, name))] = type(value).__name__
            stack.append(((*path, name), value))
    return dict(sorted(out.items()))


def summary(td: Any) -> tuple[dict[str, str], Any, Any]:
    return (classes(td), td["obs", "pos"][..., 0].tolist(),
            td["deep", "o", "inner", "a"][..., 0].tolist())


#: TorchRL 0.14.1: the classes of every read of ``steps`` data from LazyTensorStorage,
#: LazyMemmapStorage and TensorStorage (get of an int, a slice, a tensor; indexing; samples)
TORCHRL_CLASSES = {"deep": "TensorDict", "deep.o": "Outer", "deep.o.inner": "Inner",
                   "obs": "Obs"}
#: what tdreplay read back before (and reads back from a checkpoint without a record)
PLAIN_CLASSES = {"deep": "TensorDict", "deep.o": "TensorDict", "deep.o.inner": "TensorDict",
                 "obs": "TensorDict"}
#: TorchRL 0.14.1, storage of ``steps(5)``: (read, (classes, pos[..., 0], a[..., 0]))
TORCHRL_READS: list[tuple[str, Callable[[Any], Any], tuple[dict[str, str], Any, Any]]] = [
    ("get(3)", lambda s: s.get(3), (TORCHRL_CLASSES, 3.0, 30.0)),
    ("get(slice(1, 3))", lambda s: s.get(slice(1, 3)), (TORCHRL_CLASSES, [1.0, 2.0],
                                                         [10.0, 20.0])),
    ("get(tensor([4, 0, 2]))", lambda s: s.get(torch.tensor([4, 0, 2])),
     (TORCHRL_CLASSES, [4.0, 0.0, 2.0], [40.0, 0.0, 20.0])),
    ("s[:]", lambda s: s[:], (TORCHRL_CLASSES, [0.0, 1.0, 2.0, 3.0, 4.0],
                              [0.0, 10.0, 20.0, 30.0, 40.0])),
    ("s[2]", lambda s: s[2], (TORCHRL_CLASSES, 2.0, 20.0)),
    ("s[1:3]", lambda s: s[1:3], (TORCHRL_CLASSES, [1.0, 2.0], [10.0, 20.0])),
    ("s[tensor([4, 1])]", lambda s: s[torch.tensor([4, 1])], (TORCHRL_CLASSES, [4.0, 1.0],
                                                              [40.0, 10.0])),
]

TENSOR_STORAGES = {
    "LazyTensorStorage": lambda: LazyTensorStorage(8),
    "LazyMemmapStorage": lambda: LazyMemmapStorage(8),
    "compilable": lambda: LazyTensorStorage(8, compilable=True),
    "shared_init": lambda: LazyTensorStorage(8, shared_init=True),
}


CHECKPOINTERS = {
    "tensor": TensorStorageCheckpointer,
    "flat": FlatStorageCheckpointer,
    "nested": NestedStorageCheckpointer,
    "h5": H5StorageCheckpointer,
}


def filled(make: Callable[[], Any] | type) -> Any:
    """A storage (made by ``make()``, or of 8 slots of class ``make``) holding ``steps(5)``."""
    storage = make(8) if isinstance(make, type) else make()
    storage.set(torch.arange(5), steps(5))
    return storage


# ---- reads ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("read, expected", [(r[1], r[2]) for r in TORCHRL_READS],
                         ids=[r[0] for r in TORCHRL_READS])
@pytest.mark.parametrize("make", TENSOR_STORAGES.values(), ids=TENSOR_STORAGES.keys())
def test_every_read_gives_the_nested_classes_back(make, read, expected):
    assert summary(read(filled(make))) == expected


@pytest.mark.parametrize("buffer_type", [ReplayBuffer, TensorDictReplayBuffer])
@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_buffer_samples_and_indexing(buffer_type, storage_type):
    rb = buffer_type(storage=storage_type(8), batch_size=3)
    rb.extend(steps(5))
    sample = rb.sample()
    assert classes(sample) == TORCHRL_CLASSES  # TorchRL 0.14.1
    r = sample["r"].tolist()
    assert sample["obs"].pos[:, 0].tolist() == r
    assert sample["deep", "o"].inner.a[:, 0].tolist() == [10 * v for v in r]
    assert summary(rb[1:3]) == (TORCHRL_CLASSES, [1.0, 2.0], [10.0, 20.0])
    assert summary(rb[2]) == (TORCHRL_CLASSES, 2.0, 20.0)


def test_wrapped_tensor_storage():
    storage = TensorStorage(steps(4))
    assert summary(storage.get(torch.tensor([3, 0]))) == (TORCHRL_CLASSES, [3.0, 0.0],
                                                          [30.0, 0.0])
    assert classes(storage[:]) == TORCHRL_CLASSES


def holder(n: int, value: float | None = None, cls: type = Obs) -> Holder:
    i = torch.arange(float(n)) if value is None else torch.full((n,), value)
    inner = cls(pos=i[:, None].expand(n, 2).clone(), vel=i[:, None].expand(n, 2).clone(),
                batch_size=[n])
    return Holder(td=TensorDict(o=inner, batch_size=[n]), x=i, batch_size=[n])


@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_top_level_tensorclass_with_a_tensorclass_in_its_tensordict_field(storage_type):
    storage = storage_type(8)
    storage.set(torch.arange(4), holder(4))
    for read, pos in [(storage.get(torch.tensor([2, 1])), [2.0, 1.0]),
                      (storage.get(1), 1.0), (storage[:], [0.0, 1.0, 2.0, 3.0])]:
        # TorchRL 0.14.1: Holder, its td a TensorDict, td["o"] an Obs
        assert (type(read).__name__, type(read.td).__name__,
                type(read.td["o"]).__name__) == ("Holder", "TensorDict", "Obs")
        assert read.td["o"].pos[..., 0].tolist() == pos


@pytest.mark.parametrize("checkpointer", CHECKPOINTERS.values(), ids=CHECKPOINTERS.keys())
@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_a_nested_tensorclass_keeps_its_own_batch_dims(storage_type, checkpointer, tmp_path):
    if checkpointer is H5StorageCheckpointer:
        pytest.importorskip("h5py")
    storage = storage_type(8, checkpointer=checkpointer())
    storage.set(torch.arange(4), TensorDict(obs=Obs(pos=torch.zeros(4, 3, 2),
                                                    vel=torch.zeros(4, 3, 2), batch_size=[4, 3]),
                                            batch_size=[4]))
    storage.dumps(tmp_path / "ck")
    loaded = storage_type(8, checkpointer=checkpointer())
    loaded.loads(tmp_path / "ck")
    restored = storage_type(8)
    restored.load_state_dict(storage.state_dict())
    for one in (storage, loaded, restored):
        reads = [one.get(torch.tensor([0, 1])), one.get(1), one[:]]
        assert [type(r["obs"]).__name__ for r in reads] == ["Obs"] * 3
        # TorchRL 0.14.1: (2, 3), (3,), (4, 3)
        assert [tuple(r["obs"].batch_size) for r in reads] == [(2, 3), (3,), (4, 3)]


def test_a_tensorclass_with_a_string_field(tmp_path):
    @tensorclass
    class Named:
        pos: torch.Tensor
        name: str

    storage = LazyTensorStorage(8)
    storage.set(torch.arange(2), TensorDict(o=Named(pos=torch.ones(2, 2), name="a",
                                                    batch_size=[2]), batch_size=[2]))
    storage.dumps(tmp_path / "ck")
    loaded = LazyTensorStorage(8)
    loaded.loads(tmp_path / "ck")
    restored = LazyTensorStorage(8)
    restored.load_state_dict(storage.state_dict())
    for one in (storage, loaded, restored):
        for read in (one.get(torch.tensor([1, 0])), one[0:2]):
            assert type(read["o"]) is Named
            assert read["o"].name == ["a", "a"]  # TorchRL 0.14.1: Named, ['a', 'a']


# ---- later writes --------------------------------------------------------------------------------
@pytest.mark.parametrize("written", ["TensorDict", "dict"])
@pytest.mark.parametrize("make", TENSOR_STORAGES.values(), ids=TENSOR_STORAGES.keys())
def test_a_tensordict_written_where_a_tensorclass_is_reads_back_as_that_class(make, written):
    storage = filled(make)
    data = steps(2, 5)
    data["obs"] = (TensorDict(pos=torch.full((2, 2), 7.0), vel=torch.full((2, 2), 7.0),
                              batch_size=[2]) if written == "TensorDict"
                   else {"pos": torch.full((2, 2), 7.0), "vel": torch.full((2, 2), 7.0)})
    storage.set(torch.arange(5, 7), data)
    out = storage.get(torch.arange(7))
    # TorchRL 0.14.1 accepts it: Obs, [0.0, 1.0, 2.0, 3.0, 4.0, 7.0, 7.0]
    assert type(out["obs"]) is Obs
    assert out["obs"].pos[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 7.0, 7.0]


@pytest.mark.parametrize("make", TENSOR_STORAGES.values(), ids=TENSOR_STORAGES.keys())
def test_a_plain_level_written_where_tensorclasses_are_nested(make):
    storage = filled(make)
    data = steps(2, 5)
    data["deep", "o"] = TensorDict(inner=TensorDict(a=torch.full((2, 1), 9.0), batch_size=[2]),
                                   b=torch.ones(2), batch_size=[2])
    storage.set(torch.arange(5, 7), data)
    out = storage.get(torch.arange(7))
    # TorchRL 0.14.1 accepts it: the classes as ever, a [0.0, 10.0, 20.0, 30.0, 40.0, 9.0, 9.0]
    assert classes(out) == TORCHRL_CLASSES
    assert out["deep", "o"].inner.a[:, 0].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 9.0, 9.0]


def assert_unchanged(storage: Any) -> None:
    assert len(storage) == 5
    assert summary(storage[:]) == (TORCHRL_CLASSES, [0.0, 1.0, 2.0, 3.0, 4.0],
                                   [0.0, 10.0, 20.0, 30.0, 40.0])


def with_other_obs(n: int = 2) -> TensorDict:
    data = steps(n, 5)
    data["obs"] = obs(n, 7.0, Other)
    return data


# TorchRL 0.14.1 accepts another tensorclass with the same fields and reads it back as Obs
# ([0.0, 1.0, 2.0, 3.0, 4.0, 7.0, 7.0]): the written rows silently change class. Refused here.
WRITES_OF_ANOTHER_CLASS = {
    "set(rows)": lambda s: s.set(torch.arange(5, 7), with_other_obs()),
    "set(int)": lambda s: s.set(5, with_other_obs(1)[0]),
    "set(slice)": lambda s: s.set(slice(5, 7), with_other_obs()),
    "s[index] =": lambda s: s.__setitem__((slice(0, 2),), with_other_obs()),
}


@pytest.mark.parametrize("write", WRITES_OF_ANOTHER_CLASS.values(),
                         ids=WRITES_OF_ANOTHER_CLASS.keys())
@pytest.mark.parametrize("make", TENSOR_STORAGES.values(), ids=TENSOR_STORAGES.keys())
def test_another_tensorclass_is_refused(make, write):
    storage = filled(make)
    with pytest.raises(TypeError, match=r"entry 'obs' is tensorclass Other, but this storage "
                                        r"holds Obs there"):
        write(storage)
    assert_unchanged(storage)


@tensorclass
class OtherInner:  # Inner's fields, another class
    a: torch.Tensor


@pytest.mark.parametrize("make", TENSOR_STORAGES.values(), ids=TENSOR_STORAGES.keys())
def test_another_tensorclass_deeper_is_refused(make):
    storage = filled(make)
    data = steps(2, 5)
    data["deep", "o"] = Outer(inner=OtherInner(a=torch.full((2, 1), 9.0), batch_size=[2]),
                              b=torch.ones(2), batch_size=[2])
    # TorchRL 0.14.1 accepts it and reads it back as Inner (a [0.0, 10.0, 20.0, 30.0, 40.0,
    # 9.0, 9.0]); a class of other fields there it refuses (ValueError: "__setitem__ is only
    # allowed for same-class or compatible class (i.e. same members) assignment")
    with pytest.raises(TypeError, match=r"entry \('deep', 'o', 'inner'\) is tensorclass "
                                        r"OtherInner, but this storage holds Inner there"):
        storage.set(torch.arange(5, 7), data)
    assert_unchanged(storage)


@pytest.mark.parametrize("make", TENSOR_STORAGES.values(), ids=TENSOR_STORAGES.keys())
def test_a_tensorclass_where_a_tensordict_is_is_refused(make):
    storage = make()
    plain = steps(5)
    plain["obs"] = plain["obs"].to_tensordict()
    storage.set(torch.arange(5), plain)
    # TorchRL 0.14.1 refuses it too, with an unrelated message (TypeError: Multiple dispatch
    # failed for 'torch.Tensor.__setitem__')
    with pytest.raises(TypeError, match=r"entry 'obs' is tensorclass Obs, but this storage "
                                        r"holds a TensorDict there"):
        storage.set(torch.arange(5, 7), steps(2, 5))
    assert len(storage) == 5
    assert classes(storage[:])["obs"] == "TensorDict"


@pytest.mark.parametrize("make", TENSOR_STORAGES.values(), ids=TENSOR_STORAGES.keys())
def test_another_tensorclass_inside_a_top_level_tensorclass_is_refused(make):
    storage = make()
    storage.set(torch.arange(2), holder(2, 1.0))
    # TorchRL 0.14.1 accepts it and reads it back as Obs ([1.0, 1.0, 7.0, 7.0])
    with pytest.raises(TypeError, match=r"entry \('td', 'o'\) is tensorclass Other"):
        storage.set(torch.arange(2, 4), holder(2, 7.0, Other))
    assert len(storage) == 2 and type(storage[:].td["o"]) is Obs
    storage.set(torch.arange(2, 4), holder(2, 7.0))  # the class it holds: written
    assert storage[:].td["o"].pos[:, 0].tolist() == [1.0, 1.0, 7.0, 7.0]


@pytest.mark.parametrize("buffer_type", [ReplayBuffer, TensorDictReplayBuffer])
def test_a_refused_extend_leaves_the_buffer_unchanged(buffer_type):
    rb = buffer_type(storage=LazyTensorStorage(8), batch_size=3)
    rb.extend(steps(5))
    with pytest.raises(TypeError, match="entry 'obs' is tensorclass Other"):
        rb.extend(with_other_obs())
    assert len(rb) == 5
    rb.extend(steps(2, 5))  # the next write goes where the refused one would have
    assert summary(rb[:]) == (TORCHRL_CLASSES, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                              [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0])


def test_an_entry_added_inside_a_tensorclass_is_refused():
    storage = filled(LazyTensorStorage)
    data = steps(2, 5)
    data["obs"] = TensorDict(pos=torch.ones(2, 2), vel=torch.ones(2, 2), acc=torch.ones(2),
                             batch_size=[2])
    # TorchRL 0.14.1 writes it, and every read of the storage then raises ValueError ("Keys
    # from the tensordict ... must correspond to the class attributes")
    with pytest.raises(ValueError, match=r"entry \('obs', 'acc'\) is not a field of "
                                         r"tensorclass Obs"):
        storage.set(torch.arange(5, 7), data)
    assert_unchanged(storage)


def test_a_new_tensorclass_entry_is_added():
    storage = LazyTensorStorage(8)
    storage.set(torch.arange(3), TensorDict(r=torch.arange(3.0), batch_size=[3]))
    storage.set(torch.arange(3, 5), TensorDict(r=torch.arange(3.0, 5.0), obs=obs(2, 7.0),
                                               batch_size=[2]))
    out = storage.get(torch.arange(5))
    # TorchRL 0.14.1: Obs, [0.0, 0.0, 0.0, 7.0, 7.0]
    assert type(out["obs"]) is Obs
    assert out["obs"].pos[:, 0].tolist() == [0.0, 0.0, 0.0, 7.0, 7.0]


# ---- checkpoints ---------------------------------------------------------------------------------
def check_restored(storage: Any) -> None:
    assert len(storage) == 5
    for read, expected in [(r[1], r[2]) for r in TORCHRL_READS]:
        assert summary(read(storage)) == expected


@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_state_dict_round_trip(storage_type):
    state = filled(storage_type).state_dict()
    assert state["nested_tensorclasses"] == [
        [["deep", "o", "inner"], f"{Inner.__module__}:Inner"],
        [["deep", "o"], f"{Outer.__module__}:Outer"], [["obs"], f"{Obs.__module__}:Obs"]]
    restored = storage_type(8)
    restored.load_state_dict(state)
    # TorchRL 0.14.1 reads back plain TensorDicts after state_dict / load_state_dict (its
    # state_dict records no class); its dumps / loads keeps them, as tdreplay does for both
    check_restored(restored)


@pytest.mark.parametrize("checkpointer", CHECKPOINTERS.values(), ids=CHECKPOINTERS.keys())
@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_dumps_loads_with_every_checkpointer(storage_type, checkpointer, tmp_path):
    if checkpointer is H5StorageCheckpointer:
        pytest.importorskip("h5py")
    saved = storage_type(8, checkpointer=checkpointer())
    saved.set(torch.arange(5), steps(5))
    saved.dumps(tmp_path / "ck")
    restored = storage_type(8, checkpointer=checkpointer())
    restored.loads(tmp_path / "ck")
    check_restored(restored)  # TorchRL 0.14.1 (dumps / loads): the classes


@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_buffer_dumps_loads(storage_type, tmp_path):
    rb = TensorDictReplayBuffer(storage=storage_type(8), batch_size=3)
    rb.extend(steps(5))
    rb.dumps(tmp_path / "rb")
    restored = TensorDictReplayBuffer(storage=storage_type(8), batch_size=3)
    restored.loads(tmp_path / "rb")
    assert classes(restored.sample()) == TORCHRL_CLASSES  # TorchRL 0.14.1
    assert summary(restored[1:3]) == (TORCHRL_CLASSES, [1.0, 2.0], [10.0, 20.0])


def test_memmap_storage_reopened_and_pickled(tmp_path):
    storage = LazyMemmapStorage(8, scratch_dir=tmp_path / "mm")
    storage.set(torch.arange(5), steps(5))
    layout = json.loads((tmp_path / "mm" / "tdreplay-memmap-layout.json").read_text())
    assert [name for _, name in layout["nested_tensorclasses"]] == [
        f"{Inner.__module__}:Inner", f"{Outer.__module__}:Outer", f"{Obs.__module__}:Obs"]
    # (TorchRL 0.14.1 cannot reopen a scratch_dir: "Cannot get elements out of a
    # non-initialized storage")
    check_restored(LazyMemmapStorage(8, scratch_dir=tmp_path / "mm", existsok=True))
    check_restored(pickle.loads(pickle.dumps(storage)))


def test_memmap_storage_naming_an_unknown_class_reads_as_an_error(tmp_path):
    storage = LazyMemmapStorage(8, scratch_dir=tmp_path / "mm")
    storage.set(torch.arange(5), steps(5))
    file = tmp_path / "mm" / "tdreplay-memmap-layout.json"
    layout = json.loads(file.read_text())
    layout["nested_tensorclasses"][-1][1] = "elsewhere:NeverDefined"  # another process's class
    file.write_text(json.dumps(layout))
    reopened = LazyMemmapStorage(8, scratch_dir=tmp_path / "mm", existsok=True)
    assert len(reopened) == 5  # mapped all the same
    with pytest.raises(RuntimeError, match="tensorclass 'elsewhere:NeverDefined' at 'obs', "
                                           "unknown in this process"):
        reopened.get(torch.tensor([0]))


def strip_record(path) -> None:
    """Make the checkpoint in ``path`` one written before nested classes were recorded."""
    file = path / "storage.json"
    meta = json.loads(file.read_text())
    assert "nested_tensorclasses" in meta
    del meta["nested_tensorclasses"]
    file.write_text(json.dumps(meta))


@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_a_checkpoint_without_the_record_still_loads(storage_type, tmp_path):
    saved = filled(storage_type)
    saved.write_files(tmp_path / "ck")  # (plain files: a manifest would refuse the edit)
    strip_record(tmp_path / "ck")
    fresh = storage_type(8)
    fresh.loads(tmp_path / "ck")
    assert summary(fresh[:]) == (PLAIN_CLASSES, [0.0, 1.0, 2.0, 3.0, 4.0],
                                 [0.0, 10.0, 20.0, 30.0, 40.0])  # as before this change
    state = saved.state_dict()
    del state["nested_tensorclasses"]
    fresh = storage_type(8)
    fresh.load_state_dict(state)
    assert classes(fresh.get(torch.tensor([0]))) == PLAIN_CLASSES
    laid_out = filled(storage_type)  # plain rows into a storage holding the classes: kept
    laid_out.loads(tmp_path / "ck")
    check_restored(laid_out)


def rename_class(path, name: str) -> None:
    file = path / "storage.json"
    meta = json.loads(file.read_text())
    meta["nested_tensorclasses"][-1][1] = name  # the record of "obs"
    file.write_text(json.dumps(meta))


@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_a_checkpoint_of_a_class_that_cannot_be_imported_is_refused(storage_type, tmp_path):
    filled(storage_type).write_files(tmp_path / "ck")  # (plain: the edit is not refused first)
    rename_class(tmp_path / "ck", f"{Obs.__module__}:NeverDefined")
    fresh = storage_type(8)
    with pytest.raises(CheckpointError, match="NeverDefined', which cannot be imported here"):
        fresh.loads(tmp_path / "ck")
    assert not fresh.initialized
    state = filled(storage_type).state_dict()
    state["nested_tensorclasses"][-1][1] = f"{Obs.__module__}:NeverDefined"
    with pytest.raises(ValueError, match="NeverDefined', which cannot be imported here"):
        fresh.load_state_dict(state)
    assert not fresh.initialized


@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_a_checkpoint_of_another_class_is_refused_by_a_laid_out_storage(storage_type,
                                                                         tmp_path):
    filled(storage_type).write_files(tmp_path / "ck")  # (plain: the edit is not refused first)
    rename_class(tmp_path / "ck", f"{Other.__module__}:Other")
    laid_out = filled(storage_type)
    with pytest.raises(CheckpointError, match=r"checkpoint entry 'obs' holds tensorclass "
                                              r".*:Other, this storage .*:Obs there"):
        laid_out.loads(tmp_path / "ck")
    assert_unchanged(laid_out)
    fresh = storage_type(8)  # Other has Obs's fields: a fresh storage reads it as Other
    fresh.loads(tmp_path / "ck")
    assert type(fresh.get(torch.tensor([1]))["obs"]) is Other


def test_a_checkpoint_whose_class_does_not_fit_its_rows_is_refused(tmp_path):
    filled(LazyTensorStorage).write_files(tmp_path / "ck")  # (plain: edited below)
    rename_class(tmp_path / "ck", f"{Inner.__module__}:Inner")  # "obs" has pos and vel, not a
    fresh = LazyTensorStorage(8)
    with pytest.raises(CheckpointError, match="nested tensorclasses do not fit its rows"):
        fresh.loads(tmp_path / "ck")
    assert not fresh.initialized


@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_a_local_nested_class_loads_in_the_same_process(storage_type, tmp_path):
    @tensorclass
    class Local:
        x: torch.Tensor

    saved = storage_type(8)
    saved.set(torch.arange(3), TensorDict(loc=Local(x=torch.arange(3), batch_size=[3]),
                                          batch_size=[3]))
    saved.dumps(tmp_path / "ck")
    fresh = storage_type(8)
    fresh.loads(tmp_path / "ck")
    out = fresh[:]
    assert type(out["loc"]) is Local and out["loc"].x.tolist() == [0, 1, 2]


# ---- compressed storage --------------------------------------------------------------------------
#: TorchRL 0.14.1's CompressedListStorage keeps these tensorclasses in every read (its
#: get of several rows is a list of TensorDicts, and a buffer stacks them lazily; tdreplay's
#: reads one TensorDict of the rows, as for any data: the classes are the same)
TORCHRL_COMPRESSED_CLASSES = {"deep.o": "Outer", "deep.o.inner": "Inner", "obs": "Obs"}


def tensorclasses(td: Any) -> dict[str, str]:
    return {path: name for path, name in classes(td).items()
            if name not in ("TensorDict", "LazyStackedTensorDict")}


def test_compressed_storage_reads():
    storage = CompressedListStorage(8)
    storage.set(torch.arange(5), steps(5))
    # TorchRL 0.14.1: get(3) and s[1] as below; get(tensor([4, 0])) a list of those rows
    assert summary(storage.get(3)) == (TORCHRL_CLASSES, 3.0, 30.0)
    assert summary(storage[1]) == (TORCHRL_CLASSES, 1.0, 10.0)
    rows = storage.get(torch.tensor([4, 0]))
    assert tensorclasses(rows) == TORCHRL_COMPRESSED_CLASSES
    assert rows["obs"].pos[:, 0].tolist() == [4.0, 0.0]
    assert tensorclasses(storage[:]) == TORCHRL_COMPRESSED_CLASSES


@pytest.mark.parametrize("buffer_type", [ReplayBuffer, TensorDictReplayBuffer])
def test_compressed_storage_in_a_buffer(buffer_type):
    rb = buffer_type(storage=CompressedListStorage(8), batch_size=3)
    rb.extend(steps(5))
    assert tensorclasses(rb.sample()) == TORCHRL_COMPRESSED_CLASSES
    assert tensorclasses(rb[1:3]) == TORCHRL_COMPRESSED_CLASSES


def mixed_compressed() -> CompressedListStorage:
    storage = CompressedListStorage(8)
    storage.set(torch.arange(2), steps(2))
    storage.set(torch.arange(2, 4), with_other_obs())
    return storage


def test_compressed_rows_keep_their_own_classes():
    # TorchRL 0.14.1: get(tensor([0, 3])) is a list of rows with "obs" an Obs and an Other
    # (each row keeps what it was written with, as in a list storage)
    rows = mixed_compressed().get(torch.tensor([0, 3]))
    assert [type(row["obs"]).__name__ for row in rows] == ["Obs", "Other"]


def test_compressed_state_dict_and_checkpoint(tmp_path):
    storage = mixed_compressed()
    restored = CompressedListStorage(8)
    restored.load_state_dict(storage.state_dict())
    # TorchRL 0.14.1: state_dict keeps them (['Obs', 'Obs', 'Other', 'Other']); its dumps
    # raises (TypeError: Object of type Obs is not JSON serializable)
    assert [type(restored.get(i)["obs"]).__name__ for i in range(4)] == ["Obs", "Obs", "Other",
                                                                         "Other"]
    storage.dumps(tmp_path / "ck")
    meta = json.loads((verify_checkpoint(tmp_path / "ck") / "storage.json").read_text())
    assert [layout["tensorclasses"][-1][1] for layout in meta["layouts"]] == [
        f"{Obs.__module__}:Obs", f"{Other.__module__}:Other"]
    loaded = CompressedListStorage(8)
    loaded.loads(tmp_path / "ck")
    assert [type(loaded.get(i)["obs"]).__name__ for i in range(4)] == ["Obs", "Obs", "Other",
                                                                       "Other"]
    assert summary(loaded.get(1)) == (TORCHRL_CLASSES, 1.0, 10.0)


def test_compressed_checkpoint_of_a_class_that_cannot_be_imported_is_refused(tmp_path):
    mixed_compressed().write_files(tmp_path / "ck")  # (plain files: edited below)
    file = tmp_path / "ck" / "storage.json"
    meta = json.loads(file.read_text())
    meta["layouts"][1]["tensorclasses"][-1][1] = f"{Other.__module__}:NeverDefined"
    file.write_text(json.dumps(meta))
    fresh = CompressedListStorage(8)
    with pytest.raises(CheckpointError, match="NeverDefined', which cannot be imported here"):
        fresh.loads(tmp_path / "ck")
    assert len(fresh) == 0
