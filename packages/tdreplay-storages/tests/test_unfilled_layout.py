"""A lazy tensor storage laid out in unfilled memory (no zero fill, huge pages for large CPU
leaves) never exposes a row it did not write, and reads drawn slots without checking them again
only for samplers that draw written slots."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import RandomSampler, ReplayBuffer, Sampler
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage, _allocation


def _rows(n: int, value: float) -> TensorDict:
    return TensorDict({"a": torch.full((n, 3), value), "b": {"c": torch.full((n,), int(value))}},
                      [n])


@pytest.fixture(params=[False, True], ids=["torch-empty", "numpy-huge-pages"])
def policy(request, monkeypatch):
    """Both allocation paths: ``torch.empty``, and numpy's allocator (threshold lowered)."""
    if request.param:
        monkeypatch.setattr(_allocation, "HUGE_PAGE_MIN_BYTES", 1)
    return request.param


def test_a_slice_write_past_a_gap_is_refused_and_skips_no_row(policy):
    # (rows skipped by it were zeroed and counted as data: a gap is refused, see _row_gaps)
    s = LazyTensorStorage(64)
    s.set(slice(0, 2), _rows(2, 1.0))
    with pytest.raises(IndexError, match=r"filled without gaps: .*rows 2 to 4 would be left"):
        s.set(slice(5, 7), _rows(2, 2.0))
    assert len(s) == 2
    s.set(slice(2, 7), _rows(5, 2.0))
    got = s.get(torch.arange(7))
    assert got["a"][:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert got["b", "c"].tolist() == [1, 1, 2, 2, 2, 2, 2]
    assert got["b", "c"].dtype == torch.int64


def test_index_and_single_writes_past_a_gap_are_refused(policy):
    s = LazyTensorStorage(64)
    with pytest.raises(IndexError, match="filled without gaps"):
        s.set(torch.tensor([9, 4]), _rows(2, 3.0))
    assert not s.initialized  # (refused before the first write laid it out)
    s.set(torch.tensor([1, 0]), _rows(2, 3.0))
    with pytest.raises(IndexError, match="filled without gaps"):
        s.set(12, _rows(1, 5.0)[0])
    s.set(2, _rows(1, 5.0)[0])
    assert s.get(torch.arange(3))["a"][:, 0].tolist() == [3.0, 3.0, 5.0]
    assert len(s) == 3


def test_a_write_reaching_the_top_row_leaves_no_row_unfilled(policy):
    s = LazyTensorStorage(8)
    s.set(slice(0, 2), _rows(2, 1.0))
    # rows in any order up to the top one: every row written, none left unfilled
    s.set(torch.tensor([7, 2, 6, 3, 5, 4]), _rows(6, 2.0))
    s.set(slice(3, 4), _rows(1, 3.0))  # a later write below: the rows around it keep theirs
    got = s.get(torch.arange(8))
    assert got["a"][:, 0].tolist() == [1.0, 1.0, 2.0, 3.0, 2.0, 2.0, 2.0, 2.0]
    assert got["b", "c"].tolist() == [1, 1, 2, 3, 2, 2, 2, 2]
    assert len(s) == 8


def test_a_new_entry_is_zero_in_rows_written_before(policy):
    s = LazyTensorStorage(16)
    s.set(slice(0, 3), TensorDict({"a": torch.ones(3)}, [3]))
    s.set(slice(3, 4), TensorDict({"a": torch.ones(1), "z": torch.full((1,), 9.0)}, [1]))
    assert s.get(torch.arange(4))["z"].tolist() == [0.0, 0.0, 0.0, 9.0]


def test_restored_rows_and_rows_after_them(policy):
    s = LazyTensorStorage(32)
    s.set(slice(0, 4), _rows(4, 6.0))
    t = LazyTensorStorage(32)
    t.load_state_dict(s.state_dict())
    with pytest.raises(IndexError, match="filled without gaps"):
        t.set(slice(8, 9), _rows(1, 8.0))
    t.set(slice(4, 9), _rows(5, 8.0))
    assert t.get(torch.arange(9))["a"][:, 0].tolist() == [6.0] * 4 + [8.0] * 5


def test_large_leaves_come_from_numpy_and_pickle_and_share(monkeypatch):
    monkeypatch.setattr(_allocation, "HUGE_PAGE_MIN_BYTES", 1024)
    s = LazyTensorStorage(1000)
    s.set(slice(0, 10), _rows(10, 4.0))
    # the float leaf (1000 x 3 x 4 bytes) is over the threshold: numpy-allocated, as a tensor
    assert s.get(torch.arange(10))["a"].sum().item() == 120.0
    back = pickle.loads(pickle.dumps(s))
    assert back.get(torch.tensor([3, 9]))["a"].tolist() == [[4.0] * 3] * 2
    rows = s.written_rows()
    rows.share_memory_()
    assert rows.is_shared() and rows["a"].sum().item() == 120.0


def test_allocate_unfilled_shapes_and_dtypes(monkeypatch):
    cpu = torch.device("cpu")
    for threshold in (1, 1 << 40):
        monkeypatch.setattr(_allocation, "HUGE_PAGE_MIN_BYTES", threshold)
        for dtype in (torch.bool, torch.uint8, torch.float16, torch.int64, torch.complex128):
            x = _allocation.allocate_unfilled(torch.Size([5, 3]), dtype, cpu)
            assert x.shape == (5, 3) and x.dtype is dtype and x.is_contiguous()
            x.fill_(1)
            assert bool((x == 1).all())
        assert _allocation.allocate_unfilled(torch.Size([0, 4]), torch.float32, cpu).numel() == 0


def test_numpy_allocated_leaves_start_on_a_cache_line(monkeypatch):
    # numpy's own large arrays start 16 bytes past a page: every 128-byte row would span
    # three cache lines, and copies into the storage run misaligned
    monkeypatch.setattr(_allocation, "HUGE_PAGE_MIN_BYTES", 1)
    cpu = torch.device("cpu")
    for shape in ([1 << 20, 32], [7, 3], [1]):
        for dtype in (torch.float32, torch.bool, torch.float64):
            x = _allocation.allocate_unfilled(torch.Size(shape), dtype, cpu)
            assert x.data_ptr() % _allocation.CACHE_LINE == 0
            assert x.storage_offset() == 0
            assert x.untyped_storage().nbytes() == x.numel() * x.element_size()
    s = LazyTensorStorage(1 << 16)
    s.set(slice(0, 4), _rows(4, 2.0))
    assert all(leaf.data_ptr() % 64 == 0 for leaf in s.written_rows().values(True, True))


def test_memmap_storage_refuses_a_first_write_past_a_gap(tmp_path):
    s = LazyMemmapStorage(16, scratch_dir=tmp_path / "s")
    with pytest.raises(IndexError, match="filled without gaps"):
        s.set(slice(3, 4), _rows(1, 2.0))
    assert len(s) == 0 and not s.initialized
    s.set(slice(0, 4), _rows(4, 2.0))
    assert s.get(torch.arange(4))["a"][:, 0].tolist() == [2.0] * 4


class _OutOfRange(RandomSampler):
    """A sampler that draws slots past the written ones (a bug the storage must catch)."""

    def sample(self, storage, batch_size):
        return torch.full((batch_size,), len(storage) + 1), {}


def test_only_samplers_that_draw_written_slots_skip_the_check():
    assert RandomSampler().draws_written_slots
    assert not _OutOfRange().draws_written_slots  # overrides sample: not taken on trust
    assert not Sampler.draws_written_slots
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=_OutOfRange())
    rb.extend(torch.arange(4))
    with pytest.raises(IndexError, match="written slots"):
        rb.sample(2)


def test_get_trusted_reads_as_get():
    s = LazyTensorStorage(10, ndim=2)
    s.set(slice(0, 2), TensorDict({"x": torch.arange(10).reshape(2, 5)}, [2, 5]))
    slots = torch.tensor([[1, 7], [9, 0]])
    assert (s.get_trusted(slots)["x"] == s.get(slots)["x"]).all()
    assert s.get_trusted(slots)["x"].tolist() == [[1, 7], [9, 0]]
    assert s.get_trusted(3)["x"].item() == 3  # not a tensor of slots: goes through get
    with pytest.raises(IndexError, match="written slots"):
        s.get(torch.tensor([10]))
