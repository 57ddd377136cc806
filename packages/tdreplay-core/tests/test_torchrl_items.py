"""TorchRL's items and batches, stats() and saved prefetch queues (issue 16)."""

import collections
import json
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import CheckpointError, ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.core.checkpoint import CheckpointNotFoundError
from tdreplay.core.prefetch import PrefetchStateError


# ---- extend takes any iterable of items -------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: range(5),
    lambda: (i for i in range(5)),
    lambda: collections.deque(range(5)),
    lambda: np.arange(5),
], ids=["range", "generator", "deque", "ndarray"])
def test_extend_takes_any_iterable_of_items_into_a_list_storage(make):
    rb = ReplayBuffer(storage=ListStorage(10))
    slots = rb.extend(make())
    assert slots.tolist() == [0, 1, 2, 3, 4]
    assert [int(x) for x in rb[:]] == [0, 1, 2, 3, 4]
    assert rb.write_count == 5


def test_extend_of_a_range_past_the_default_capacity_keeps_the_last_items():
    rb = ReplayBuffer()  # ListStorage(1000), as TorchRL's default
    rb.extend(range(2000))
    assert len(rb) == 1000 and rb.write_count == 2000
    assert rb[0] == 1000 and rb[999] == 1999  # round robin: the second half overwrote the first


def test_extend_of_a_set_writes_each_item_once():
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend({3, 1, 2})
    assert sorted(rb[:]) == [1, 2, 3]


def test_extend_of_an_empty_generator_writes_nothing():
    rb = ReplayBuffer(storage=ListStorage(10))
    assert rb.extend(iter([])).numel() == 0
    assert len(rb) == 0


@pytest.mark.parametrize("data", [7, "abc", b"ab", 1.5])
def test_extend_of_one_item_is_refused_naming_add(data):
    rb = ReplayBuffer(storage=ListStorage(10))
    with pytest.raises(TypeError, match=r"use add\(\) to write one item"):
        rb.extend(data)
    assert len(rb) == 0 and rb.write_count == 0


# ---- items keep their batch dims (list storage) ----------------------------------------------
def test_add_of_a_batched_tensordict_keeps_its_batch_dims():
    rb = ReplayBuffer(storage=ListStorage(10))
    td = TensorDict({"obs": torch.arange(10)}, [10])
    with pytest.warns(UserWarning, match=r"Using `add\(\)` with a TensorDict that has batch_size"):
        assert rb.add(td) == 0  # one item, with a hint that extend() stores rows
    assert rb[0].batch_size == (10,)
    sample = rb.sample(1)
    assert sample.batch_size == (1, 10)
    assert sample["obs"].tolist() == [list(range(10))]


def test_extend_of_a_list_of_tensordicts_stacks_them_with_their_batch_dims():
    rb = ReplayBuffer(storage=ListStorage(10))
    td = TensorDict({"obs": torch.arange(10)}, [10])
    rb.extend([td])
    assert len(rb) == 1 and rb[:].batch_size == (1, 10)
    assert rb.sample(3).batch_size == (3, 10)


# ---- ListStorage default --------------------------------------------------------------------
def test_list_storage_default_is_unbounded_as_torchrl():
    storage = ListStorage()
    assert storage.max_size == 2**63 - 1
    rb = ReplayBuffer(storage=storage)
    rb.extend(range(1500))
    assert len(rb) == 1500 and rb[0] == 0 and rb[1499] == 1499
    assert ReplayBuffer().storage.max_size == 1000


# ---- stats() ---------------------------------------------------------------------------------
def test_stats_counts_and_is_json_ready():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2)
    assert rb.stats() == {"size": 0, "write_count": 0, "prefetch_queue_size": 0,
                          "initialized": True, "capacity": 10, "utilization": 0.0}
    rb.extend(range(15))
    stats = rb.stats()
    assert (stats["size"], stats["write_count"], stats["utilization"]) == (10, 15, 1.0)
    assert json.loads(json.dumps(stats)) == stats
    rb.sample()
    assert rb.stats() == stats  # sampling counts nothing
    rb.empty(empty_write_count=False)
    assert (rb.stats()["size"], rb.stats()["write_count"]) == (0, 15)


def test_stats_reports_the_prefetch_queue():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=2, prefetch=2)
    rb.extend(torch.arange(10))
    rb.sample()
    assert rb.stats()["prefetch_queue_size"] == 2


# ---- missing checkpoints ---------------------------------------------------------------------
def test_loading_a_missing_checkpoint_path_raises_file_not_found(tmp_path):
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend([1, 2])
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        rb.loads(tmp_path / "nowhere")
    assert isinstance(info.value, CheckpointError)
    assert isinstance(info.value, CheckpointNotFoundError)
    with pytest.raises(FileNotFoundError):
        rb.loads(tmp_path)  # an existing directory that holds no checkpoint
    assert rb[:] == [1, 2]


def test_loading_a_storage_from_a_missing_path_raises_file_not_found(tmp_path):
    storage = ListStorage(10)
    with pytest.raises(FileNotFoundError, match="storage.json"):
        storage.loads(tmp_path / "nowhere")


# ---- a restored buffer with a prefetch queue samples as the saved one -----------------------
def _prefetching(seed, prefetch=2, storage=None):
    rb = ReplayBuffer(storage=ListStorage(20) if storage is None else storage, batch_size=3,
                      prefetch=prefetch, generator=torch.Generator().manual_seed(seed))
    rb.extend(torch.arange(20))
    return rb


def _assert_same_next_samples(source, restored, n=5):
    for _ in range(n):
        a, a_info = source.sample(return_info=True)
        b, b_info = restored.sample(return_info=True)
        assert torch.equal(a, b)
        assert torch.equal(a_info["index"], b_info["index"])


def test_state_dict_carries_the_batches_drawn_ahead():
    source = _prefetching(0)
    source.sample()
    state = source.state_dict()
    assert len(state["_prefetch_state"]["queue"]) == 2
    restored = _prefetching(1)
    restored.sample()
    restored.load_state_dict(state)
    _assert_same_next_samples(source, restored)


def test_saved_queue_does_not_alias_the_buffer():
    source = _prefetching(0)
    source.sample()
    state = source.state_dict()
    data, _ = state["_prefetch_state"]["queue"][0]
    expected = data.clone()
    data.fill_(-1)  # the saved copy is the caller's to change
    assert torch.equal(source.sample(), expected)


def test_dumps_carries_the_batches_drawn_ahead(tmp_path):
    source = _prefetching(0)
    source.sample()
    source.dumps(tmp_path)
    restored = _prefetching(1)
    restored.sample()
    restored.loads(tmp_path)
    _assert_same_next_samples(source, restored)


def test_pickle_carries_the_batches_drawn_ahead():
    source = _prefetching(0)
    source.sample()
    restored = pickle.loads(pickle.dumps(source))
    _assert_same_next_samples(source, restored)


def test_autograd_batches_drawn_ahead_are_saved_by_value():
    def make(seed):
        rb = TensorDictReplayBuffer(storage=ListStorage(20), batch_size=3, prefetch=2,
                                    generator=torch.Generator().manual_seed(seed))
        rb.extend(TensorDict({"v": torch.arange(20.0, requires_grad=True) * 2}, [20]))
        return rb

    source = make(0)
    source.sample()
    restored = make(1)
    restored.load_state_dict(source.state_dict())
    for _ in range(4):
        a, b = source.sample(), restored.sample()
        assert torch.equal(a["v"], b["v"]) and torch.equal(a["index"], b["index"])
        assert b["v"].requires_grad


def test_another_prefetch_depth_refuses_a_saved_queue_and_changes_nothing():
    source = _prefetching(0, prefetch=2)
    source.sample()
    state = source.state_dict()
    restored = _prefetching(1, prefetch=1)
    restored.extend(torch.arange(5))
    before = restored[:].clone()
    with pytest.raises(RuntimeError, match="prefetch queue with capacity 2") as info:
        restored.load_state_dict(state)
    assert isinstance(info.value, (ValueError, PrefetchStateError))
    assert torch.equal(restored[:], before)


def test_a_state_without_a_queue_loads_into_any_depth():
    source = _prefetching(0, prefetch=0)
    source.sample()
    state = source.state_dict()
    assert "_prefetch_state" not in state
    restored = _prefetching(1, prefetch=2)
    restored.sample()
    restored.load_state_dict(state)
    _assert_same_next_samples(source, restored)


# ---- save hooks with TorchRL's shift / is_full ------------------------------------------------
class _ShiftHook:
    shift = None
    is_full = None

    def __init__(self):
        self.seen = []

    def __call__(self, data):
        self.seen.append((self.shift, self.is_full, list(data)))
        return data


def test_save_hooks_learn_shift_and_is_full_before_they_run(tmp_path):
    rb = ReplayBuffer(storage=ListStorage(10))
    hook = _ShiftHook()
    rb.register_save_hook(hook)
    rb.extend(range(5))
    rb.dumps(tmp_path / "a")
    assert hook.seen == [(5, False, [0, 1, 2, 3, 4])]
    rb.extend(range(5, 12))  # wraps: rows 0 and 1 hold 10 and 11, the next write goes to 2
    rb.dumps(tmp_path / "b")
    assert hook.seen[-1] == (2, True, [10, 11, 2, 3, 4, 5, 6, 7, 8, 9])


def test_save_hooks_without_the_attributes_are_left_alone(tmp_path):
    seen = []
    rb = ReplayBuffer(storage=ListStorage(10))
    rb.register_save_hook(lambda items: seen.append(list(items)) or items)
    rb.extend(range(3))
    rb.dumps(tmp_path)
    assert seen == [[0, 1, 2]]


# ---- ListStorage.set with ranges, TorchRL's error wording -------------------------------------
def test_list_storage_set_takes_a_range_of_rows_and_a_range_of_items():
    storage = ListStorage(5)
    storage.set(range(5), range(10, 15))
    assert len(storage) == 5
    assert [storage.get(i) for i in range(5)] == [10, 11, 12, 13, 14]
    storage.set(range(1, 3), range(2))
    assert [storage.get(i) for i in range(5)] == [10, 0, 1, 13, 14]


def test_list_storage_set_refuses_a_tuple_and_keeps_its_items():
    storage = ListStorage(3)
    storage.set(range(3), [1, 2, 3])
    with pytest.raises(TypeError, match="expects a list, a range"):
        storage.set([0, 1], (7, 8))
    assert [storage.get(i) for i in range(3)] == [1, 2, 3]


def test_sampling_an_empty_buffer_raises_torchrls_message():
    rb = ReplayBuffer(storage=ListStorage(3))
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        rb.sample(2)


def test_sampling_without_a_batch_size_raises_torchrls_message():
    rb = ReplayBuffer(storage=ListStorage(3))
    rb.extend([1, 2])
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        rb.sample()
    assert len(rb) == 2


def test_add_of_an_unbatched_tensordict_or_of_a_tensor_does_not_warn():
    import warnings
    rb = ReplayBuffer(storage=ListStorage(10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.add(TensorDict({"obs": torch.arange(3)}, []))
        rb.add(torch.arange(3))
    assert len(rb) == 2


def test_an_item_added_twice_is_stored_without_its_index_entry():
    # an item read back carries "index"; adding it again (after empty()) writes the keys it
    # was written with, so a storage that refuses new keys takes it
    from tdreplay.core import TensorDictReplayBuffer
    rb = TensorDictReplayBuffer(storage=ListStorage(5))
    item = TensorDict({"obs": torch.tensor([1.0, 2.0])}, [])
    rb.add(item)
    item["index"] = torch.tensor(0)  # as a sample of it carries it
    rb.empty()
    assert rb.add(item) == 0
    assert set(rb.storage.get(0).keys()) == {"obs"}
    assert set(rb.sample(1).keys()) == {"obs", "index"}
