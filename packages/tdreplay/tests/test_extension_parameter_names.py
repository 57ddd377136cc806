"""The extension API takes TorchRL's parameter names, so that keyword calls written for TorchRL
work: ``Storage.set(cursor, data, *, set_cursor)``, ``Storage.get(index)``,
``Sampler.extend(index)`` / ``add(index)`` / ``mark_update(index)`` (and tdreplay's own
``mark_rewritten(index)``), on the base classes and on every storage and sampler that
``tdreplay.data`` serves."""

from __future__ import annotations

import inspect

import pytest
import torch

from tdreplay.core import (
    ConsumingSampler,
    ListStorage,
    RandomSampler,
    Sampler,
    SamplerWithoutReplacement,
    Storage,
)

#: method -> the name of its first parameter after ``self`` (TorchRL 0.14's)
STORAGE_NAMES = {"set": "cursor", "get": "index", "get_trusted": "index"}
SAMPLER_NAMES = {"extend": "index", "add": "index", "mark_update": "index",
                 "mark_rewritten": "index", "extend_with_priority": "index"}


def _first_parameters(cls: type) -> dict[str, str]:
    names = STORAGE_NAMES if issubclass(cls, Storage) else SAMPLER_NAMES
    out = {}
    for method in names:
        params = list(inspect.signature(getattr(cls, method)).parameters)
        out[method] = params[1]  # params[0] is self
    return out


def _check(cls: type) -> None:
    expected = STORAGE_NAMES if issubclass(cls, Storage) else SAMPLER_NAMES
    assert _first_parameters(cls) == expected, cls.__qualname__
    if issubclass(cls, Sampler):  # TorchRL's keyword-only storage of mark_update
        storage = inspect.signature(cls.mark_update).parameters["storage"]
        assert storage.kind is inspect.Parameter.KEYWORD_ONLY and storage.default is None
    if issubclass(cls, Storage):  # TorchRL's keyword-only set_cursor, as well
        set_params = inspect.signature(cls.set).parameters
        assert set_params["data"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert set_params["set_cursor"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("cls", [Storage, ListStorage, Sampler, RandomSampler,
                                 SamplerWithoutReplacement, ConsumingSampler],
                         ids=lambda cls: cls.__name__)
def test_core_classes_take_torchrl_names(cls):
    _check(cls)


def test_every_exported_storage_and_sampler_takes_torchrl_names():
    import tdreplay.data as data

    checked = []
    for name in data.__all__:
        try:
            obj = getattr(data, name)
        except ImportError:  # a component that is not installed
            continue
        if inspect.isclass(obj) and issubclass(obj, (Storage, Sampler)):
            _check(obj)
            checked.append(name)
    # the core classes at least, and whatever the other installed components add
    assert {"Storage", "ListStorage", "Sampler", "RandomSampler"} <= set(checked), checked


def test_storage_keyword_calls():
    s = ListStorage(4)
    s.set(cursor=slice(0, 2), data=["a", "b"], set_cursor=True)
    assert s.get(index=torch.tensor([1, 0])) == ["b", "a"]
    assert s.get_trusted(index=torch.tensor([0])) == ["a"]
    storages = pytest.importorskip("tdreplay.storages")
    lazy = storages.LazyTensorStorage(8)
    lazy.set(cursor=torch.arange(3), data=torch.arange(3) * 10)
    lazy.set(cursor=3, data=torch.tensor(30), set_cursor=False)
    assert lazy.get(index=torch.tensor([3, 0])).tolist() == [30, 0]
    assert lazy.get_trusted(index=torch.tensor([2])).tolist() == [20]


def test_sampler_keyword_calls():
    s = RandomSampler()
    s.extend(index=torch.arange(3))
    s.add(index=3)
    s.mark_update(index=torch.tensor([0]), storage=ListStorage(4))
    s.mark_rewritten(index=torch.tensor([1]))
    samplers = pytest.importorskip("tdreplay.samplers")
    p = samplers.PrioritizedSampler(8, alpha=1.0, beta=1.0, eps=0.0)
    p.extend(index=torch.arange(2))
    p.add(index=2)
    p.update_priority(torch.arange(3), torch.tensor([1.0, 4.0, 2.0]))
    p.mark_rewritten(index=torch.tensor([0]))  # keeps the priority
    assert p.state_dict()["priorities"][:3].tolist() == [1.0, 4.0, 2.0]
    p.mark_update(index=torch.tensor([0]), storage=None)  # the max priority
    assert p.state_dict()["priorities"][:3].tolist() == [4.0, 4.0, 2.0]
    p.extend_with_priority(index=torch.tensor([3]), priority=p.check_priority(torch.tensor([3.0])))
    assert p.state_dict()["priorities"][3].item() == 3.0
