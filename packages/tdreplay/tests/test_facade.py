"""tdreplay.data re-exports the public API of every component, as the same objects."""

import importlib

import pytest

import tdreplay.data

COMPONENTS = ["core", "storages", "samplers", "writers", "transforms", "ensembles", "datasets",
              "trainers", "distributed"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_public_name_of_a_component_is_in_the_facade(component):
    module = importlib.import_module(f"tdreplay.{component}")
    missing = [name for name in module.__all__ if name not in tdreplay.data.__all__]
    assert missing == []
    for name in module.__all__:
        assert getattr(tdreplay.data, name) is getattr(importlib.import_module(
            tdreplay.data._EXPORTS[name]), name)


def test_torchrl_style_imports_work():
    from tdreplay.data import (  # noqa: F401
        LazyMemmapStorage,
        LazyTensorStorage,
        PrioritizedSampler,
        ReplayBuffer,
        SliceSampler,
        TensorDictPrioritizedReplayBuffer,
        TensorDictReplayBuffer,
    )


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchStorage"):
        tdreplay.data.NoSuchStorage  # noqa: B018
    assert "ReplayBuffer" in dir(tdreplay.data)


def test_consuming_sampler_is_served_where_torchrl_has_it():
    import tdreplay.core
    import tdreplay.samplers
    from tdreplay.data.replay_buffers import ConsumingSampler as from_buffers
    from tdreplay.data.replay_buffers.samplers import ConsumingSampler as from_samplers
    from tdreplay.data.replay_buffers.samplers.random import ConsumingSampler as from_random

    assert (tdreplay.data.ConsumingSampler is from_buffers is from_samplers is from_random
            is tdreplay.core.ConsumingSampler is tdreplay.samplers.ConsumingSampler)
    rb = tdreplay.data.ReplayBuffer(storage=tdreplay.data.ListStorage(3),
                                    consume_after_n_samples=1)
    rb.extend([1, 2, 3])
    assert sorted(rb.sample(5)) == [1, 2, 3] and len(rb) == 0
