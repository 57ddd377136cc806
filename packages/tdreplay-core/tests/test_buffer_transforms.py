"""Transforms in a buffer: read side by default, write side with ``invert=True``."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    CallableTransform,
    Compose,
    InvertedTransform,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    Transform,
)


class Scale(Transform):
    """Writes ``in_key * factor`` to ``out_key`` (read side); divides back on the write side."""

    def __init__(self, factor: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.factor = factor

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value * self.factor

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value / self.factor


def test_reference_example_inverted_in_place_callable_runs_on_extend():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=4)
    data = TensorDict({"a": torch.zeros(10)}, [10])

    def t(data):
        data += 1
        return data

    assert rb.append_transform(t, invert=True) is rb
    rb.extend(data)
    assert (data["a"] == 1).all()  # the callable ran in place on the caller's data
    assert (rb[:]["a"] == 1).all()  # and that is what was stored
    assert (rb.sample()["a"] == 1).all()  # nothing runs on the read side
    assert isinstance(rb.transform[0], InvertedTransform)


def test_read_side_callable_changes_samples_not_storage():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=5)
    rb.append_transform(lambda x: x * 10)
    rb.extend([torch.tensor(1.0)] * 3)
    assert rb.sample().tolist() == [10.0] * 5
    assert rb[:].tolist() == [10.0] * 3  # reads go through the transform too
    assert [float(x) for x in rb.storage[:]] == [1.0, 1.0, 1.0]  # storage holds raw items


def test_transform_given_to_constructor():
    rb = ReplayBuffer(storage=ListStorage(10), transform=lambda x: x + 1, batch_size=2)
    rb.extend([torch.tensor(0.0)] * 2)
    assert rb.sample().tolist() == [1.0, 1.0]
    composed = Compose(lambda x: x * 3)
    rb = ReplayBuffer(storage=ListStorage(10), transform=composed, batch_size=2)
    assert rb.transform is composed


def test_insert_transform_sets_the_order():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=1)
    rb.extend([torch.tensor(1.0)])
    rb.append_transform(lambda x: x + 1)
    assert rb.insert_transform(0, lambda x: x * 10) is rb  # runs first
    assert rb.sample().tolist() == [11.0]  # (1 * 10) + 1
    rb.insert_transform(2, lambda x: -x)
    assert rb.sample().tolist() == [-11.0]
    with pytest.raises(TypeError, match="index"):
        rb.insert_transform("0", lambda x: x)


def test_inverted_transform_with_keys_writes_on_extend_without_touching_caller_data():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=3)
    rb.append_transform(Scale(10.0, in_keys=["a"], out_keys=["b"]), invert=True)
    data = TensorDict({"a": torch.arange(3.0)}, [3])
    rb.extend(data)
    assert "b" not in data.keys()  # set on a shallow copy
    stored = rb[:]
    assert stored["b"].tolist() == [0.0, 10.0, 20.0] and stored["a"].tolist() == [0.0, 1.0, 2.0]


def test_non_inverted_transform_with_inverse_keys_runs_inverse_on_extend():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=3)
    rb.append_transform(Scale(10.0, in_keys=["a"], out_keys=["a"],
                              in_keys_inv=["a"], out_keys_inv=["a"]))
    data = TensorDict({"a": torch.tensor([10.0, 20.0, 30.0])}, [3])
    rb.extend(data)
    assert [float(x["a"]) for x in rb.storage[:]] == [1.0, 2.0, 3.0]  # written divided
    assert set(rb.sample()["a"].tolist()) <= {10.0, 20.0, 30.0}  # read multiplied back
    assert rb[:]["a"].tolist() == [10.0, 20.0, 30.0]
    assert data["a"].tolist() == [10.0, 20.0, 30.0]


def test_missing_transform_key_names_it():
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=1)
    rb.append_transform(Scale(2.0, in_keys=["missing"]))
    rb.extend(TensorDict({"a": torch.zeros(2)}, [2]))
    with pytest.raises(KeyError, match="missing"):
        rb.sample()


def test_non_callable_transform_is_refused():
    with pytest.raises(TypeError, match="callable"):
        ReplayBuffer(transform=3)
    rb = ReplayBuffer()
    with pytest.raises(TypeError, match="callable"):
        rb.append_transform("not a transform")
    assert len(rb.transform) == 0


def test_transform_key_lengths_must_match():
    with pytest.raises(ValueError, match="same length"):
        Transform(in_keys=["a", "b"], out_keys=["c"])
    with pytest.raises(TypeError, match="in_keys"):
        Transform(in_keys=[3])


def test_callable_transform_returning_none_keeps_data():
    seen = []
    t = CallableTransform(lambda x: seen.append(x))
    x = torch.ones(2)
    assert t(x) is x and seen == [x]


class DropAll(Transform):
    """A write-side filter that keeps nothing (``inv`` returns ``None``, as TorchRL's
    filters do)."""

    def inv(self, data):
        return None


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("tensordict_buffer", [False, True])
def test_extend_of_a_batch_a_transform_drops_writes_nothing(ndim, tensordict_buffer):
    # (it raised "every leaf of a pytree passed to extend must share the same leading
    # dimension, got leading sizes ['None']"; TorchRL returns zeros((0, storage.ndim)))
    from tdreplay.core import TensorDictReplayBuffer
    from tdreplay.storages import LazyTensorStorage

    cls = TensorDictReplayBuffer if tensordict_buffer else ReplayBuffer
    rb = cls(storage=LazyTensorStorage(8, ndim=ndim), transform=DropAll())
    batch = TensorDict({"a": torch.arange(4.0).reshape(2, 2)}, [2, 2][:ndim])
    slots = rb.extend(batch)
    assert slots.shape == (0, ndim) and slots.dtype == torch.long
    assert len(rb) == 0 and rb.write_count == 0
    assert rb.add(batch[(0,) * ndim]).shape == (0, ndim)
    assert len(rb) == 0


class _RenameAndUnsqueeze(Transform):
    """A read transform setting new entries into the TensorDict it is given (as TorchRL's
    RenameTransform and UnsqueezeTransform do)."""

    def forward(self, data):
        data.set("obs", data.get("obs").unsqueeze(-1))
        return data.rename_key_("r", "rr")


@pytest.mark.parametrize("buffer_class", [ReplayBuffer, TensorDictReplayBuffer])
def test_reading_one_list_storage_item_leaves_the_stored_item_as_it_was(buffer_class):
    # rb[i] handed the stored TensorDict itself to the read transforms: it came back renamed
    # and a dim larger at every read (then sample() could not stack, rb[i] raised KeyError)
    rb = buffer_class(storage=ListStorage(10), batch_size=2, transform=_RenameAndUnsqueeze())
    given = TensorDict({"obs": torch.tensor(5.0), "r": torch.tensor(1.0)}, [])
    rb.add(given)
    rb.extend(TensorDict({"obs": torch.arange(2.0), "r": torch.ones(2)}, [2]))
    for _ in range(2):
        item = rb[0]
        assert sorted(item.keys()) == ["obs", "rr"] and item["obs"].shape == (1,)
    assert sorted(rb.storage[0].keys()) == ["obs", "r"] and rb.storage[0]["obs"].shape == ()
    assert sorted(given.keys()) == ["obs", "r"] and given["obs"].shape == ()
    assert rb.sample()["obs"].shape == (2, 1)
