"""TorchRL call forms that tdreplay refused or read otherwise: ``i in storage`` (TorchRL's
``contains``, not a scan of the values), ``iter(storage)``, ``ListStorage.get(slice)``,
``compilable=None`` (TorchRL's default), ``use_ray_service=`` (TorchRL's older spelling of
``service_backend="ray"``), ``compilable`` passed positionally to the base classes."""

from __future__ import annotations

import warnings

import pytest
import torch

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    RoundRobinWriter,
    Storage,
    Writer,
    service_backends,
)


def test_in_asks_whether_a_slot_is_written_not_for_a_value():
    storage = ListStorage(10)
    storage.set(torch.arange(3), ["a", "b", "c"])
    assert 1 in storage and -1 in storage and 3 not in storage
    tensor_items = ListStorage(10)
    tensor_items.set(torch.arange(3), [torch.tensor(10), torch.tensor(20), torch.tensor(30)])
    assert 2 in tensor_items and 20 not in tensor_items


def test_in_of_a_string_names_the_argument():
    storage = ListStorage(4)
    storage.set(0, "a")
    with pytest.raises(TypeError, match="index must be an int or an integer tensor, got str"):
        "a" in storage  # noqa: B015


def test_iterating_a_storage_gives_its_written_items_in_slot_order():
    storage = ListStorage(3)
    rb = ReplayBuffer(storage=storage)
    rb.extend(["a", "b", "c", "d"])  # "d" overwrites slot 0
    assert list(storage) == ["d", "b", "c"]
    assert list(ListStorage(3)) == []


def test_list_storage_get_takes_a_slice_of_the_written_items():
    storage = ListStorage(10)
    storage.set(torch.arange(4), ["a", "b", "c", "d"])
    assert storage.get(slice(1, 3)) == ["b", "c"]
    assert storage.get(slice(None, None, 2)) == ["a", "c"]
    assert storage.get(slice(2, 100)) == ["c", "d"]


def test_compilable_none_is_the_default():
    rb = ReplayBuffer(storage=ListStorage(4), compilable=None)
    assert rb.compilable is False and rb.writer.compilable is False
    with pytest.raises(TypeError, match="compilable must be a bool"):
        ReplayBuffer(compilable="yes")


def test_base_classes_take_compilable_positionally():
    class Counting(RoundRobinWriter):
        def __init__(self, compilable: bool = False) -> None:
            Writer.__init__(self, compilable)  # as TorchRL's signature allows
            self.extra = 1

    assert Counting(True).compilable is True

    class Items(ListStorage):
        def __init__(self) -> None:
            Storage.__init__(self, 5, None, True)
            self._storage = []

    items = Items()
    assert items.max_size == 5 and items.compilable is True


def _served(buffer_cls, options, transport, transport_options, kwargs):
    served = buffer_cls(**kwargs)
    served.served_by = "ray"
    return served


def test_use_ray_service_is_service_backend_ray(monkeypatch):
    monkeypatch.setitem(service_backends._registry, "ray", _served)
    with pytest.warns(FutureWarning, match="use_ray_service is deprecated.*service_backend='ray'"):
        rb = ReplayBuffer(storage=ListStorage(4), use_ray_service=True)
    assert rb.served_by == "ray"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        direct = ReplayBuffer(storage=ListStorage(4), use_ray_service=False)
    assert not hasattr(direct, "served_by")


def test_use_ray_service_conflicting_with_service_backend_is_refused():
    with pytest.raises(ValueError, match="use_ray_service=True conflicts with "
                                         "service_backend='direct'"):
        ReplayBuffer(storage=ListStorage(4), use_ray_service=True, service_backend="direct")
    with pytest.raises(TypeError, match="use_ray_service must be a bool"):
        ReplayBuffer(storage=ListStorage(4), use_ray_service="ray")


def test_max_size_cannot_be_changed_after_the_storage_is_built():
    # (assigned, it was kept and saved while the storage still wrapped at the old size)
    storage = ListStorage(4)
    rb = ReplayBuffer(storage=storage)
    rb.extend([1, 2, 3])
    with pytest.raises(AttributeError, match=r"max_size is fixed when a storage is built \(4 "
                                             r"here, got 8\)"):
        storage.max_size = 8
    storage.max_size = 4  # the same value: nothing changes
    assert storage.max_size == 4 and rb.state_dict()["_storage"]["max_size"] == 4
    rb.extend([4, 5])
    assert storage.items() == [5, 2, 3, 4]


def test_dim_extend_takes_its_own_value_and_refuses_another():
    rb = ReplayBuffer(storage=ListStorage(4))
    rb.dim_extend = 0
    rb.dim_extend = None
    with pytest.raises(RuntimeError, match=r"dim_extend cannot be reset \(it is 0, got 1\)"):
        rb.dim_extend = 1
    assert rb.dim_extend == 0
    rb.extend([1, 2])
    assert rb.storage.items() == [1, 2]


def test_compose_takes_a_list_or_transforms_as_torchrl():
    from tdreplay.core import Compose

    def add_one(x):
        return x + 1

    def double(x):
        return x * 2

    for compose in (Compose(add_one, double), Compose([add_one, double]),
                    Compose((add_one, double)), Compose(transforms=[add_one, double])):
        assert len(compose) == 2 and compose(torch.ones(1)).tolist() == [4.0]
    assert len(Compose()) == 0 and len(Compose(transforms=[])) == 0


def test_compose_refuses_what_it_cannot_chain_naming_it():
    from tdreplay.core import Compose

    with pytest.raises(TypeError, match="as arguments or as transforms=, not both"):
        Compose(abs, transforms=[abs])
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['fns'\]"):
        Compose(fns=[abs])
    with pytest.raises(TypeError, match="transforms must be a list of transforms, got builtin"):
        Compose(transforms=abs)
    with pytest.raises(TypeError, match="a Transform or a callable, got int"):
        Compose([abs, 3])


def test_max_size_of_a_storage_pickled_before_it_was_a_property_is_fixed_too():
    storage = ListStorage(4)
    storage.__dict__["max_size"] = storage.__dict__.pop("_max_size")  # the older layout
    assert storage.max_size == 4
    with pytest.raises(AttributeError, match="max_size is fixed"):
        storage.max_size = 8
    assert storage.max_size == 4


def test_bad_extend_input_raises_what_torchrl_raises_there_too():
    # ValueError for a 0-d tensor (TorchRL: TypeError) and for a [B] batch into an ndim=2
    # storage (TorchRL: IndexError), TypeError for a tuple into a ListStorage (TorchRL:
    # ValueError): an except clause written for TorchRL missed them
    from tdreplay.core import ListStorage, ReplayBuffer
    from tdreplay.core.testing import StackedListStorage

    rb = ReplayBuffer(storage=ListStorage(10))
    rb.extend(torch.zeros(3, 2))
    for kind in (TypeError, ValueError):
        with pytest.raises(kind, match="got a 0-d tensor; use add"):
            rb.extend(torch.tensor(1.0))
    for kind in (TypeError, ValueError):
        with pytest.raises(kind, match="extend got a tuple"):
            rb.extend((torch.zeros(4, 3), torch.ones(4)))
    assert len(rb) == 3
    two_dims = ReplayBuffer(storage=StackedListStorage(6), dim_extend=1)
    for kind in (IndexError, ValueError):
        with pytest.raises(kind, match="dim_extend=1 but the data has 1 batch dims"):
            two_dims.extend(torch.arange(3))
    assert len(two_dims) == 0
