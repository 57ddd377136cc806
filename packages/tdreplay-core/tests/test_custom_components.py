"""Components written against the extension API the way TorchRL's are: a storage with ``set``,
``get``, ``__len__``, ``empty`` and its state, a writer with ``add`` / ``extend``, a sampler
with ``sample``, each used by a ReplayBuffer."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from tdreplay.core import ReplayBuffer, Sampler, Storage, Writer


class DictStorage(Storage):
    """Items in a dict keyed by row (no __getitem__ of its own: the base reads through get)."""

    def __init__(self, max_size: int) -> None:
        super().__init__(max_size)
        self.data: dict[int, torch.Tensor] = {}

    def set(self, cursor, data, *, set_cursor=True):
        if isinstance(cursor, int):
            self.data[cursor] = data
            return
        if isinstance(cursor, slice):  # (contiguous rows: how tdreplay's writers write them)
            cursor = torch.arange(self.max_size)[cursor]
        for row, item in zip(torch.as_tensor(cursor).tolist(), data):
            self.data[row] = item

    def get(self, index):
        if isinstance(index, int):
            return self.data[index]
        return [self.data[i] for i in torch.as_tensor(index).reshape(-1).tolist()]

    def __len__(self):
        return len(self.data)

    def empty(self):
        self.data.clear()

    def state_dict(self):
        return {"data": dict(self.data)}

    def load_state_dict(self, state_dict):
        self.data = dict(state_dict["data"])


class CountingWriter(Writer):
    """Writes round robin with a cursor of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.next_row = 0

    def add(self, data):
        row = self.next_row % self.storage.max_size
        self.storage.set(row, data)
        self.next_row += 1
        return row

    def extend(self, data):
        rows = (torch.arange(len(data)) + self.next_row) % self.storage.max_size
        self.storage.set(rows, data)
        self.next_row += len(data)
        return rows

    def empty(self, empty_write_count: bool = True) -> None:
        super().empty(empty_write_count)
        self.next_row = 0


class FirstItems(Sampler):
    """Samples the first written rows, in order."""

    def sample(self, storage, batch_size):
        return torch.arange(min(batch_size, len(storage))), {}


def _buffer(**parts) -> ReplayBuffer:
    return ReplayBuffer(batch_size=3, collate_fn=torch.stack, **parts)


def test_a_storage_without_getitem_reads_through_get():
    rb = _buffer(storage=DictStorage(10))
    rb.extend([torch.tensor(float(i)) for i in range(5)])
    assert rb.storage[1:4] == [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)]
    assert rb.storage[4] == torch.tensor(4.0)
    assert rb.sample().shape == (3,)
    restored = _buffer(storage=DictStorage(10))
    restored.load_state_dict(rb.state_dict())
    assert restored.storage.data == rb.storage.data


def test_custom_writer_and_sampler_with_the_custom_storage():
    rb = _buffer(storage=DictStorage(4), writer=CountingWriter(), sampler=FirstItems())
    rb.extend([torch.tensor(float(i)) for i in range(6)])  # rows 0..3, then 0, 1 again
    assert sorted(rb.storage.data) == [0, 1, 2, 3]
    assert rb.sample().tolist() == [4.0, 5.0, 2.0]
    rb.empty()
    assert len(rb) == 0 and rb.writer.next_row == 0
    assert rb.add(torch.tensor(7.0)) == 0


def test_a_storage_must_still_say_how_it_empties():
    class NoEmpty(DictStorage):
        empty = Storage.empty  # the abstract one

    with pytest.raises(TypeError, match="empty"):
        NoEmpty(3)


class CountingSampler(Sampler):
    """Uniform draws, counting them per row in a numpy array (as a user might)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.counts = np.zeros(rows, dtype=np.int64)

    def sample(self, storage, batch_size):
        index = torch.randint(len(storage), (batch_size,))
        np.add.at(self.counts, index.numpy(), 1)
        return index, {}

    def state_dict(self):
        return {"counts": self.counts}  # (numpy unless a caller made it a tensor)

    def load_state_dict(self, state_dict):
        self.counts = np.array(state_dict["counts"])


def test_a_state_the_checkpoint_cannot_read_back_is_refused_before_it_is_written(tmp_path):
    # (dumps committed a checkpoint whose sampler state torch.load(weights_only=True) refuses:
    # every later loads failed with "state.pt is unreadable")
    from tdreplay.core import ListStorage

    rb = ReplayBuffer(storage=ListStorage(4), sampler=CountingSampler(4))
    rb.extend([1, 2, 3])
    rb.sampler.counts = torch.as_tensor(rb.sampler.counts)  # (a tensor: readable)
    rb.dumps(tmp_path)
    rb.sampler.counts = np.zeros(4, dtype=np.int64)
    rb.extend([4])
    with pytest.raises(TypeError, match=r"CountingSampler.state_dict\(\)\['counts'\] is a "
                                        r"numpy.ndarray.*weights_only=True"):
        rb.dumps(tmp_path)
    restored = ReplayBuffer(storage=ListStorage(4), sampler=CountingSampler(4))
    restored.loads(tmp_path)  # (the checkpoint before it, whole)
    assert restored.storage[:] == [1, 2, 3]


@pytest.mark.parametrize("value, name", [
    (collections.deque([1]), "collections.deque"), (np.int64(3), "numpy.int64"),
    (frozenset({1}), "frozenset"), (range(3), "range"),
])
def test_loadable_state_names_the_entry(value, name):
    from tdreplay.core.loadable_state import check_loadable_state

    with pytest.raises(TypeError, match=rf"S\['a'\]\[1\]\['b'\] is a {name}, "):
        check_loadable_state({"a": [0, {"b": value}]}, "S")
    check_loadable_state({"a": [0, {"b": torch.ones(1)}], "c": (1.5, None, "x", b"y", {2}),
                          "d": torch.Size([2]), "e": torch.float16, "f": collections.Counter()},
                         "S")


class EverySecondItem(Writer):
    """Keeps every second item it is given; ``add`` returns ``None`` for the others, as
    TorchRL's writers do for an item they do not keep."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0
        self.kept = 0

    def add(self, data):
        self.seen += 1
        if self.seen % 2:
            return None
        row = self.kept % self.storage.max_size
        self.storage.set(row, data)
        self.kept += 1
        return row

    def extend(self, data):
        return torch.tensor([row for item in data if (row := self.add(item)) is not None],
                            dtype=torch.long)


def test_an_item_the_writer_does_not_keep_adds_nothing():
    # (rb.add raised TypeError "'NoneType' object cannot be interpreted as an integer" after
    # the writer had counted the item)
    from tdreplay.core import ListStorage

    rb = ReplayBuffer(storage=ListStorage(4), writer=EverySecondItem(),
                      sampler=FirstItems())
    assert rb.add("a") is None and rb.add("b") == 0 and rb.add("c") is None
    assert len(rb) == 1 and rb.storage[:] == ["b"] and rb.writer.seen == 3
    assert rb.sample(1) == ["b"]


class StrictDictStorage(DictStorage):
    """Checks its state's keys exactly (as ListStorage does)."""

    def state_dict(self):
        return {"data": dict(self.data), "max_size": self.max_size}

    def check_state_dict(self, state_dict):
        if set(state_dict) != {"data", "max_size"}:
            raise ValueError(f"unexpected keys {sorted(state_dict)}")

    def load_state_dict(self, state_dict):
        self.check_state_dict(state_dict)
        self.data = dict(state_dict["data"])


def test_a_storage_s_own_state_methods_see_only_its_own_entries():
    # (the base added "last_written_row" to the state and passed it back to the class's own
    # check_state_dict / load_state_dict: a storage checking its keys refused its own state)
    storage = StrictDictStorage(4)
    rb = _buffer(storage=storage)
    rb.extend([torch.tensor(float(i)) for i in range(6)])
    storage.last_written_row = 1  # (a wrapped ring: row 1 is the newest; this set records none)
    state = storage.state_dict()
    assert set(state) == {"data", "max_size", "last_written_row"} and state["last_written_row"] == 1
    copy = StrictDictStorage(4)
    copy.check_state_dict(state)
    copy.load_state_dict(state)
    assert copy.data == storage.data and copy.last_written_row == 1
    restored = _buffer(storage=StrictDictStorage(4))
    restored.load_state_dict(rb.state_dict())
    assert restored.storage.data == storage.data
    with pytest.raises(ValueError, match=r"last_written_row'\] must be None or a row"):
        copy.check_state_dict({**state, "last_written_row": 9})


def test_a_storage_of_your_own_is_saved_by_its_state_dict(tmp_path):
    # (dumps raised NotImplementedError('') unless the storage came with a checkpointer)
    from tdreplay.core import CheckpointError, StateDictCheckpointer

    rb = _buffer(storage=StrictDictStorage(4))
    rb.extend([torch.tensor(float(i)) for i in range(6)])
    assert isinstance(rb.storage.checkpointer, StateDictCheckpointer)
    rb.dumps(tmp_path / "ckpt")
    restored = _buffer(storage=StrictDictStorage(4))
    restored.loads(tmp_path / "ckpt")
    assert restored.storage.data == rb.storage.data and restored.write_count == 6
    snapshot = next((tmp_path / "ckpt").glob("snapshot-*"))
    other = _buffer(storage=DictStorage(4))  # (another class: refused, nothing changed)
    other.extend([torch.tensor(9.0)])
    with pytest.raises(CheckpointError, match="checkpoint storage is a StrictDictStorage, but "
                                              "this buffer's storage is a DictStorage"):
        other.loads(tmp_path / "ckpt")
    assert other.storage.data == {0: torch.tensor(9.0)} and snapshot.is_dir()


def test_a_tensordict_buffer_over_a_storage_that_reads_lists_says_what_to_give_it():
    # (the sample came back as a list of TensorDicts without "index": a priority update from
    # it did nothing, silently)
    from tensordict import TensorDict

    from tdreplay.core import TensorDictReplayBuffer, stack_items

    data = TensorDict({"x": torch.arange(5.0)}, [5])
    rb = TensorDictReplayBuffer(storage=DictStorage(8), batch_size=3)
    rb.extend(data)
    with pytest.raises(TypeError, match="sampled a list from its DictStorage, not a TensorDict"
                                        ".*default_collate"):
        rb.sample()
    rb = TensorDictReplayBuffer(storage=DictStorage(8), batch_size=3, collate_fn=stack_items)
    rb.extend(data)
    sample = rb.sample()
    assert sample["x"].tolist() == sample["index"].float().tolist()


class Pairs(Sampler):
    """Draws ``batch_size`` pairs of consecutive slots: an index of shape ``[batch_size, 2]``."""

    def sample(self, storage, batch_size):
        start = torch.randint(len(storage) - 1, (batch_size, 1), generator=self.generator)
        return start + torch.arange(2), {}


def test_a_list_storage_read_at_a_multi_dim_index_gives_a_batch_of_its_shape():
    # (ListStorage read the slots flat: the TensorDict batch was [6] for a [3, 2] index, and
    # "index" was dropped with a warning)
    from tensordict import TensorDict

    from tdreplay.core import ListStorage, TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=ListStorage(8), sampler=Pairs(), batch_size=3)
    rb.extend(TensorDict({"x": torch.arange(5.0)}, [5]))
    sample = rb.sample()
    assert sample.batch_size == (3, 2) and sample["index"].shape == (3, 2)
    assert sample["x"].tolist() == sample["index"].float().tolist()
    storage = ListStorage(4)
    storage.set(torch.arange(4), ["a", "b", "c", "d"])
    assert storage.get(torch.tensor([[0, 1], [3, 2]])) == [["a", "b"], ["d", "c"]]
    assert storage.default_collate(storage.get(torch.tensor([[0], [1]]))) == [["a"], ["b"]]
    plain = ReplayBuffer(storage=ListStorage(4))
    plain.extend([[torch.zeros(2), torch.ones(2)]])  # (an item that is a list stays one)
    assert isinstance(plain.sample(2), list)


@pytest.mark.parametrize("drawn, got", [
    (torch.tensor([0, 1]), "a Tensor"), ((torch.tensor([0]), {}, 1), "a tuple of 3"),
    ((torch.tensor([0]), [1]), "info of type list"),
])
def test_a_sampler_that_returns_no_draw_is_named(drawn, got):
    # (IndexError "too many indices for tensor of dimension 0", or "list indices must be
    # integers": nothing said which part was wrong)
    class Returns(Sampler):
        def sample(self, storage, batch_size):
            return drawn

    rb = _buffer(storage=DictStorage(4), sampler=Returns())
    rb.extend([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(TypeError, match=rf"Returns.sample\(storage, batch_size\) must return "
                                        rf"\(index, info\), info a dict, got {got}"):
        rb.sample()


@pytest.mark.parametrize("drawn", [[1, 0], np.array([1, 0])])
def test_a_sampler_drawing_a_list_or_array_gives_a_sample_with_its_index(drawn):
    # (the TensorDict sample had no "index": a priority update from it found nothing)
    from tensordict import TensorDict

    from tdreplay.core import ListStorage, TensorDictReplayBuffer

    class Draws(Sampler):
        def sample(self, storage, batch_size):
            return drawn, {}

    rb = TensorDictReplayBuffer(storage=ListStorage(4), sampler=Draws(), batch_size=2)
    rb.extend(TensorDict({"x": torch.tensor([5.0, 6.0])}, [2]))
    sample, info = rb.sample(return_info=True)
    assert sample["index"].tolist() == [1, 0] and sample["index"].dtype == torch.long
    assert sample["x"].tolist() == [6.0, 5.0] and info["index"].tolist() == [1, 0]
