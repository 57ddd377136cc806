"""LazyMemmapStorage in one process: files, layout, values, existsok, pickling, cleanup."""

from __future__ import annotations

import gc
import json
import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, RoundRobinWriter
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def make_td(n: int, start: int = 0) -> TensorDict:
    base = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": base.float().unsqueeze(-1).expand(n, 3).clone(),
            "action": (base % 4).to(torch.int8),
            ("next", "obs"): (base + 1).float().unsqueeze(-1).expand(n, 3).clone(),
            ("next", "done"): (base % 5 == 4).unsqueeze(-1),
            ("next", "reward"): base.to(torch.bfloat16).unsqueeze(-1),
        },
        [n],
    )


def test_files_are_laid_out_on_first_write(tmp_path):
    storage = LazyMemmapStorage(20, scratch_dir=tmp_path / "rb")
    assert not storage.initialized
    assert not list((tmp_path / "rb").rglob("*.memmap"))
    storage.set(slice(0, 4), make_td(4))
    files = sorted(p.relative_to(tmp_path / "rb").as_posix()
                   for p in (tmp_path / "rb").rglob("*.memmap"))
    assert files == ["action.memmap", "next/done.memmap", "next/obs.memmap",
                     "next/reward.memmap", "obs.memmap"]
    # full capacity preallocated: 20 rows of 3 float32
    assert (tmp_path / "rb" / "obs.memmap").stat().st_size == 20 * 3 * 4
    layout = json.loads((tmp_path / "rb" / "tdreplay-memmap-layout.json").read_text())
    assert layout["shape"] == [20]
    assert {tuple(leaf["key"]): leaf["dtype"] for leaf in layout["leaves"]}[("next", "reward")] \
        == "torch.bfloat16"


def test_values_dtypes_and_nested_keys_round_trip(tmp_path):
    storage = LazyMemmapStorage(10, scratch_dir=tmp_path)
    data = make_td(6)
    storage.set(slice(0, 6), data)
    out = storage.get(torch.tensor([5, 0, 3]))
    assert out.batch_size == torch.Size([3])
    for key in data.keys(True, True):
        assert out.get(key).dtype == data.get(key).dtype
        assert torch.equal(out.get(key), data.get(key)[torch.tensor([5, 0, 3])])
    assert len(storage) == 6
    assert isinstance(storage.get(0)["obs"], torch.Tensor)


def test_buffer_writes_wrap_and_match_lazy_tensor_storage(tmp_path):
    memmap = ReplayBuffer(storage=LazyMemmapStorage(7, scratch_dir=tmp_path))
    plain = ReplayBuffer(storage=LazyTensorStorage(7))
    for start in range(0, 20, 3):
        assert torch.equal(memmap.extend(make_td(3, start)), plain.extend(make_td(3, start)))
    assert len(memmap) == len(plain) == 7
    assert memmap.write_count == plain.write_count == 21
    assert memmap.writer.cursor == plain.writer.cursor == 0
    assert (memmap[:] == plain[:]).all()


def test_ndim2_storage(tmp_path):
    storage = LazyMemmapStorage(12, scratch_dir=tmp_path, ndim=2)
    rb = ReplayBuffer(storage=storage, dim_extend=0)  # rows as given: the storage's layout
    data = TensorDict({"x": torch.arange(8).reshape(2, 4)}, [2, 4])
    slots = rb.extend(data)
    assert storage.shape == torch.Size([3, 4])
    assert slots.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(rb) == 8
    assert storage.get(torch.tensor([[7, 0]]))["x"].tolist() == [[7, 0]]


def test_tensor_data(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(5, scratch_dir=tmp_path))
    rb.extend(torch.arange(12.).reshape(6, 2))
    assert torch.equal(rb[:], torch.tensor([[10., 11.], [2., 3.], [4., 5.], [6., 7.], [8., 9.]]))


def test_existsok_false_refuses_a_used_scratch_dir(tmp_path):
    LazyMemmapStorage(5, scratch_dir=tmp_path)
    with pytest.raises(FileExistsError, match="existsok=True"):
        LazyMemmapStorage(5, scratch_dir=tmp_path)


def test_existsok_true_opens_the_contents(tmp_path):
    first = ReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path))
    first.extend(make_td(4))
    second = ReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path, existsok=True))
    assert len(second) == 4 and second.write_count == 4 and second.writer.cursor == 4
    assert (second[:] == make_td(4)).all()
    # both continue from one cursor
    assert second.extend(make_td(2, 4)).tolist() == [4, 5]
    assert first.extend(make_td(1, 6)).tolist() == [6]
    assert len(first) == len(second) == 7
    assert (first[:] == make_td(7)).all()


def test_existsok_true_checks_the_configuration(tmp_path):
    LazyMemmapStorage(10, scratch_dir=tmp_path)
    with pytest.raises(ValueError, match="max_size=10"):
        LazyMemmapStorage(11, scratch_dir=tmp_path, existsok=True)
    with pytest.raises(ValueError, match="ndim=1"):
        LazyMemmapStorage(10, scratch_dir=tmp_path, existsok=True, ndim=2)


def test_foreign_files_in_scratch_dir_are_not_overwritten(tmp_path):
    (tmp_path / "obs.memmap").write_bytes(b"keep me")
    storage = LazyMemmapStorage(5, scratch_dir=tmp_path)
    with pytest.raises(FileExistsError, match="obs.memmap"):
        storage.set(slice(0, 2), TensorDict({"obs": torch.ones(2)}, [2]))
    assert (tmp_path / "obs.memmap").read_bytes() == b"keep me"
    assert not storage.initialized and len(storage) == 0


def test_bad_write_leaves_storage_unchanged(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path))
    rb.extend(make_td(3))
    bad = make_td(2).exclude("action")
    with pytest.raises(KeyError, match="action"):
        rb.extend(bad)
    assert len(rb) == 3 and rb.write_count == 3 and rb.writer.cursor == 3
    assert (rb[:] == make_td(3)).all()


def test_pickled_storage_maps_the_same_files(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path), batch_size=2)
    rb.extend(make_td(3))
    payload = pickle.dumps(rb)
    assert len(payload) < 20_000  # the data is not in the pickle
    clone = pickle.loads(payload)
    assert len(clone) == 3 and clone.write_count == 3
    clone.extend(make_td(2, 3))
    assert len(rb) == 5 and rb.write_count == 5 and rb.writer.cursor == 5
    assert (rb[:] == make_td(5)).all()


def test_a_pickle_of_a_storage_whose_files_are_gone_says_so():
    # a pickle maps the files of the storage it came from; once that storage (built without
    # scratch_dir) is freed, its temporary directory is gone and the pickle says so
    rb = ReplayBuffer(storage=LazyMemmapStorage(10), batch_size=2)
    rb.extend(make_td(3))
    payload = pickle.dumps(rb)
    del rb
    gc.collect()
    with pytest.raises(FileNotFoundError, match="files of this LazyMemmapStorage are gone"
                       ".*rb.dumps"):
        pickle.loads(payload)


def test_pickle_before_first_write_sees_later_layout(tmp_path):
    storage = LazyMemmapStorage(10, scratch_dir=tmp_path)
    clone = pickle.loads(pickle.dumps(storage))
    clone.set(slice(0, 2), make_td(2))
    assert storage.initialized and len(storage) == 2
    assert (storage[:] == make_td(2)).all()


def test_temporary_scratch_dir_is_removed_with_the_storage():
    storage = LazyMemmapStorage(4)
    storage.set(slice(0, 2), make_td(2))
    path = storage.scratch_dir
    assert path.is_dir()
    del storage
    gc.collect()
    assert not path.exists()


def test_given_scratch_dir_is_kept(tmp_path):
    storage = LazyMemmapStorage(4, scratch_dir=tmp_path / "keep")
    storage.set(slice(0, 2), make_td(2))
    del storage
    gc.collect()
    assert (tmp_path / "keep" / "obs.memmap").is_file()


def test_empty_resets_shared_counters(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path))
    rb.extend(make_td(4))
    other = LazyMemmapStorage(10, scratch_dir=tmp_path, existsok=True)
    rb.empty()
    assert len(other) == 0 and len(rb) == 0 and rb.write_count == 0


def test_writer_counters_live_in_the_storage(tmp_path):
    storage = LazyMemmapStorage(10, scratch_dir=tmp_path)
    writer = RoundRobinWriter()
    writer.register_storage(storage)
    writer.extend(torch.arange(3))
    assert storage.shared_writer_counters().tolist() == [3, 3]
    assert writer.state_dict() == {"cursor": 3, "write_count": 3}


def test_process_lock_is_reentrant(tmp_path):
    storage = LazyMemmapStorage(10, scratch_dir=tmp_path)
    with storage.process_lock, storage.process_lock:
        storage.set(slice(0, 1), make_td(1))
    assert len(storage) == 1


def test_repr_names_scratch_dir(tmp_path):
    storage = LazyMemmapStorage(10, scratch_dir=tmp_path)
    assert str(tmp_path) in repr(storage)
