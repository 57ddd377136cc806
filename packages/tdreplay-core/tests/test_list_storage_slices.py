"""``ListStorage.set`` with a slice reads it as ``get`` does (TorchRL's list storages): an
open end and negative bounds count from the written items, a bound past them appends. It
counted an open end against ``max_size`` (``set(slice(2, None), two_items)`` on 4 of 8 items
was refused as 6 rows)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer


def _storage() -> ListStorage:
    storage = ListStorage(8)
    storage.set(range(4), [0, 1, 2, 3])
    return storage


@pytest.mark.parametrize(("cursor", "items", "expected"), [
    (slice(2, None), [70, 80], [0, 1, 70, 80]),
    (slice(None, None, 2), [50, 60], [50, 1, 60, 3]),
    (slice(-2, None), [7, 8], [0, 1, 7, 8]),
    (slice(1, -1), [7, 8], [0, 7, 8, 3]),
    (slice(None, None, -1), [9, 8, 7, 6], [6, 7, 8, 9]),
    (slice(4, 6), [4, 5], [0, 1, 2, 3, 4, 5]),  # appends
    (slice(2, 6), [7, 8, 9, 10], [0, 1, 7, 8, 9, 10]),
    (slice(4, None), [4, 5], [0, 1, 2, 3, 4, 5]),  # (TorchRL: a list's slice assignment)
    (slice(2, None), [7, 8, 9], [0, 1, 7, 8, 9]),
    (slice(4, 12), [4, 5], [0, 1, 2, 3, 4, 5]),
    (slice(-1, None), [7, 8], [0, 1, 2, 7, 8]),
])
def test_a_slice_counts_as_get_reads_it(cursor, items, expected):
    storage = _storage()
    storage.set(cursor, items)
    assert storage.get(slice(None)) == expected


def test_a_slice_that_leaves_a_gap_or_passes_max_size_is_refused():
    storage = _storage()
    with pytest.raises(IndexError, match="without gaps"):
        storage.set(slice(6, 8), [6, 7])
    with pytest.raises(ValueError, match="got 6 items for 5 rows"):
        storage.set(slice(3, None), [0] * 6)  # (the rows stop at max_size)
    with pytest.raises(ValueError, match="got 1 items for 2 rows"):
        storage.set(slice(2, None), [9])  # (a list would drop an item: refused)
    assert storage.get(slice(None)) == [0, 1, 2, 3]


@pytest.mark.parametrize("data", [TensorDict({"x": torch.tensor(1.0)}, []), torch.tensor(3.0)])
def test_one_item_without_dims_for_several_rows_is_a_shape_error(data):
    storage = _storage()
    with pytest.raises(RuntimeError, match="several rows needs data batched along dim 0"):
        storage.set([0, 1], data)  # (TorchRL raises RuntimeError there)
    assert storage.get(slice(None)) == [0, 1, 2, 3]


def test_update_tensordict_priority_of_no_tensordict_raises_what_torchrl_programs_catch():
    from tdreplay.core.utils import NotATensorDictError

    rb = TensorDictReplayBuffer(storage=ListStorage(4))
    rb.set_sampler(_prioritized())
    rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))
    with pytest.raises(AttributeError, match="data must be a TensorDict, got NoneType") as err:
        rb.update_tensordict_priority(None)
    assert isinstance(err.value, (TypeError, NotATensorDictError))


def _prioritized():
    from tdreplay.core import Sampler

    class Prioritized(Sampler):  # a minimal prioritized sampler of core's extension API
        is_prioritized = True

        def sample(self, storage, batch_size):
            return torch.zeros(batch_size, dtype=torch.long), {}

        def update_priority(self, index, priority, **kwargs):
            pass

        def empty(self):
            pass

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            pass

    return Prioritized()


def test_a_plain_buffer_reads_the_appended_items():
    rb = ReplayBuffer(storage=ListStorage(8))
    rb.extend([0, 1, 2, 3])
    rb.storage.set(slice(2, None), [70, 80])
    assert rb[:] == [0, 1, 70, 80] and len(rb) == 4


def test_a_list_storage_has_the_shape_of_its_capacity_as_torchrl():
    # it was None
    storage = ListStorage(5)
    assert storage.shape == torch.Size([5])
    ReplayBuffer(storage=storage).extend([1, 2])
    assert storage.shape == torch.Size([5])
