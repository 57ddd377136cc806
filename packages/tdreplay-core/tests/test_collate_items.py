"""``stack_items``: how a list storage's items become one batch. Flat dicts and tuples of
tensors (the common item) are stacked entry by entry; anything that does not stack stays a
list of the items (a later item whose entry is no tensor crashed the sample before)."""

from __future__ import annotations

from collections import namedtuple

import torch

from tdreplay.core import ListStorage, ReplayBuffer, SamplerWithoutReplacement
from tdreplay.core.collate import stack_items


def test_flat_dicts_stack_entry_by_entry():
    items = [{"obs": torch.full((3,), float(i)), "r": torch.tensor(i)} for i in range(4)]
    out = stack_items(items)
    assert list(out) == ["obs", "r"]
    assert out["obs"].shape == (4, 3) and out["obs"][:, 0].tolist() == [0, 1, 2, 3]
    assert out["r"].dtype == torch.int64 and out["r"].tolist() == [0, 1, 2, 3]


def test_dicts_of_the_same_keys_in_another_order_stack_by_key():
    out = stack_items([{"a": torch.tensor(1), "b": torch.tensor(2)},
                       {"b": torch.tensor(4), "a": torch.tensor(3)}])
    assert out["a"].tolist() == [1, 3] and out["b"].tolist() == [2, 4]


def test_flat_tuples_stack_entry_by_entry():
    out = stack_items([(torch.tensor([i, i]), torch.tensor(float(i))) for i in range(3)])
    assert type(out) is tuple and out[0].shape == (3, 2) and out[1].tolist() == [0.0, 1.0, 2.0]


def test_nested_and_named_items_stack_as_pytrees():
    nested = stack_items([{"a": {"b": torch.tensor(i)}} for i in range(3)])
    assert nested["a"]["b"].tolist() == [0, 1, 2]
    Pair = namedtuple("Pair", "x y")
    pairs = stack_items([Pair(torch.tensor(i), torch.tensor(-i)) for i in range(2)])
    assert type(pairs) is Pair and pairs.y.tolist() == [0, -1]


def test_items_that_do_not_stack_stay_a_list():
    cases = [
        [{"a": torch.zeros(2)}, {"a": "x"}],  # a later item's entry is no tensor
        [{"a": torch.zeros(2)}, {"b": torch.zeros(2)}],  # other keys
        [{"a": torch.zeros(2)}, {"a": torch.zeros(3)}],  # other shapes
        [(torch.zeros(2),), (torch.zeros(2), torch.zeros(2))],  # other lengths
        [{"a": {"b": torch.zeros(2)}}, {"a": {"b": "s"}}],  # nested, a later leaf no tensor
        [(), ()],
    ]
    for items in cases:
        assert stack_items(items) is items


def test_a_sample_of_mixed_dict_items_is_the_list_of_them():
    rb = ReplayBuffer(storage=ListStorage(4), sampler=SamplerWithoutReplacement(), batch_size=2)
    rb.extend([{"a": torch.zeros(2)}, {"a": "x"}])
    batch = rb.sample()  # both items: an epoch of 2
    assert isinstance(batch, list) and sorted(str(type(x["a"]).__name__) for x in batch) == [
        "Tensor", "str"]
