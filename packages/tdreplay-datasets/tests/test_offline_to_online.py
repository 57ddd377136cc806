"""OfflineToOnlineReplayBuffer: exact offline/online splits, annealing, checkpoints.

Offline items have ``obs`` in ``[0, 100)``, online ones ``obs >= 1000``, so every row of a
batch tells where it came from.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import tdreplay.datasets
from tdreplay.core import (
    CheckpointError,
    ListStorage,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.core.checkpoint import write_checkpoint, write_json
from tdreplay.datasets import (
    MinariExperienceReplay,
    OfflineToOnlineReplayBuffer,
    load_dataset,
    register_dataset,
    registry,
)
from tdreplay.storages import LazyTensorStorage

CARTPOLE_ID = "cartpole/tiny-v0"  # the id the conftest's cartpole fixture builds
ONLINE = 1000.0


def offline_td(n: int = 100, **entries) -> TensorDictReplayBuffer:
    """A TensorDict dataset whose item ``i`` has ``obs == i`` (and stored at slot ``i``)."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n))
    rb.extend(TensorDict({"obs": torch.arange(float(n)), **entries}, [n]))
    return rb


def online_td(n: int = 10, start: float = ONLINE, **entries) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n), **entries}, [n])


def make(offline=None, **kwargs) -> OfflineToOnlineReplayBuffer:
    kwargs.setdefault("online_capacity", 50)
    return OfflineToOnlineReplayBuffer(offline if offline is not None else offline_td(), **kwargs)


def state_of(rb: OfflineToOnlineReplayBuffer) -> tuple:
    """What a failed call must leave as it was."""
    online = rb.online_buffer
    content = online[:] if len(online) else None
    if isinstance(content, TensorDict):
        content = content["obs"].tolist()
    elif isinstance(content, torch.Tensor):
        content = content.tolist()
    return (rb.offline_fraction, rb.state_dict()["base_offline_fraction"], len(online),
            online.write_count, content, len(rb.offline_buffer))


def test_public_names():
    for name in ("OfflineToOnlineReplayBuffer", "prefill_replay_buffer"):
        assert name in tdreplay.datasets.__all__


# ---- splits ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction, batch_size, n_offline", [
    (0.5, 8, 4), (0.3, 10, 3), (0.25, 8, 2), (0.5, 5, 2),  # round(2.5) == 2, as TorchRL
    (0.9, 7, 6), (0.1, 7, 1), (0.75, 32, 24), (0.99, 10, 10), (0.04, 10, 0),
])
def test_exactly_round_fraction_times_batch_offline_rows_first(fraction, batch_size, n_offline):
    rb = make(offline_fraction=fraction, batch_size=batch_size)
    rb.extend(online_td(20))
    for _ in range(20):
        obs = rb.sample()["obs"]
        assert obs.shape == (batch_size,)
        assert (obs[:n_offline] < 100).all() and (obs[n_offline:] >= ONLINE).all()
        assert int((obs < 100).sum()) == n_offline


def test_batch_size_of_sample_overrides_the_default():
    rb = make(offline_fraction=0.4, batch_size=8)
    rb.extend(online_td(5))
    obs = rb.sample(20)["obs"]
    assert obs.shape == (20,) and int((obs < 100).sum()) == 8
    assert rb.sample()["obs"].shape == (8,)


def test_all_offline_while_the_online_buffer_is_empty():
    rb = make(offline_fraction=0.1, batch_size=16)
    for _ in range(5):
        obs = rb.sample()["obs"]
        assert obs.shape == (16,) and (obs < 100).all()
    rb.anneal(10, 10)  # fraction 0 and still nothing online: offline
    assert rb.offline_fraction == 0.0 and (rb.sample()["obs"] < 100).all()


def test_extend_goes_to_the_online_buffer_and_returns_its_indices():
    offline = offline_td()
    before = offline[:]["obs"].clone()
    rb = make(offline, online_capacity=12)
    assert rb.extend(online_td(5)).tolist() == [0, 1, 2, 3, 4]
    assert rb.extend(online_td(4, start=2000)).tolist() == [5, 6, 7, 8]
    assert len(rb.online_buffer) == 9 and len(rb.offline_buffer) == 100 and len(rb) == 109
    assert torch.equal(offline[:]["obs"], before) and offline.write_count == 100
    assert rb.online_buffer[:]["obs"].tolist() == [*range(1000, 1005), *range(2000, 2004)]
    rb.extend(online_td(6, start=3000))  # the online buffer is a ring of 12
    assert len(rb) == 112 and rb.online_buffer.write_count == 15


def test_add_writes_one_item_to_the_online_buffer():
    # (extend of one item said "use add() for one item", which the class lacked)
    rb = make(offline_fraction=0.5, batch_size=4)
    assert rb.add(TensorDict({"obs": torch.tensor(ONLINE)}, [])) == 0
    assert rb.add(TensorDict({"obs": torch.tensor(ONLINE + 1)}, [])) == 1
    assert rb.online_buffer[:]["obs"].tolist() == [ONLINE, ONLINE + 1] and len(rb) == 102


def test_online_rows_of_another_shape_are_named_at_sample():
    # (torch.cat's "Sizes of tensors must match except in dimension 0" named no entry)
    offline = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    offline.extend(TensorDict({"obs": torch.zeros(10, 4)}, [10]))
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=10, offline_fraction=0.5,
                                     batch_size=4)
    rb.extend(TensorDict({"obs": torch.ones(3, 5)}, [3]))
    with pytest.raises(ValueError, match=r"entry 'obs' has rows of shape \(4,\) in the offline "
                                         r"dataset and \(5,\) in the online buffer"):
        rb.sample()


def test_ragged_rows_of_both_buffers_are_sampled_together():
    # (the entry-shape check read entries of lazy stacks of ragged rows: every sample raised)
    from tensordict import LazyStackedTensorDict

    from tdreplay.storages import LazyStackStorage

    def ragged(n, fill):
        return LazyStackedTensorDict.lazy_stack(
            [TensorDict({"obs": torch.full((i % 3 + 1,), float(fill))}, []) for i in range(n)])

    offline = TensorDictReplayBuffer(storage=LazyStackStorage(20))
    offline.extend(ragged(6, 0))
    rb = OfflineToOnlineReplayBuffer(offline, online_storage=LazyStackStorage(20),
                                     offline_fraction=0.5, batch_size=4)
    rb.extend(ragged(6, 1))
    for _ in range(10):
        batch = rb.sample()
        fills = [float(row["obs"][0]) for row in batch.unbind(0)]
        assert fills == [0.0, 0.0, 1.0, 1.0]


def test_the_online_buffer_is_a_tensordict_buffer_when_the_dataset_is_one():
    rb = make(offline_fraction=0.5, batch_size=8)
    assert type(rb.online_buffer) is TensorDictReplayBuffer
    assert isinstance(rb.online_buffer.storage, LazyTensorStorage)
    assert rb.online_buffer.storage.max_size == 50
    rb.extend(online_td(10))
    batch = rb.sample()
    assert sorted(batch.keys()) == ["index", "obs"]
    # each half's index refers to its own buffer
    assert torch.equal(batch["index"][:4].float(), batch["obs"][:4])
    assert torch.equal(batch["index"][4:].float(), batch["obs"][4:] - ONLINE)


def test_a_plain_dataset_gets_a_plain_online_buffer():
    offline = ReplayBuffer(storage=LazyTensorStorage(100))
    offline.extend(TensorDict({"obs": torch.arange(100.0)}, [100]))
    rb = make(offline, offline_fraction=0.5, batch_size=6)
    assert type(rb.online_buffer) is ReplayBuffer
    rb.extend(online_td(10))
    batch = rb.sample()
    assert list(batch.keys()) == ["obs"]
    assert (batch["obs"][:3] < 100).all() and (batch["obs"][3:] >= ONLINE).all()


def test_an_online_storage_is_used_as_given():
    storage = LazyTensorStorage(7)
    rb = make(online_capacity=None, online_storage=storage, batch_size=4)
    assert rb.online_buffer.storage is storage
    rb.extend(online_td(9))
    assert len(storage) == 7


def test_tensor_samples_are_concatenated():
    offline = ReplayBuffer(storage=LazyTensorStorage(100))
    offline.extend(torch.arange(100.0))
    rb = make(offline, offline_fraction=0.5, batch_size=6)
    rb.extend(torch.arange(ONLINE, ONLINE + 10))
    sample = rb.sample()
    assert isinstance(sample, torch.Tensor) and sample.shape == (6,)
    assert (sample[:3] < 100).all() and (sample[3:] >= ONLINE).all()


def test_list_samples_are_concatenated_as_lists():
    offline = ReplayBuffer(storage=ListStorage(100))
    offline.extend([{"obs": i} for i in range(100)])
    rb = make(offline, online_capacity=None, online_storage=ListStorage(10),
              offline_fraction=0.5, batch_size=4)
    rb.extend([{"obs": 1000 + i} for i in range(3)])
    sample = rb.sample()
    assert isinstance(sample, list) and len(sample) == 4
    assert [item["obs"] >= 1000 for item in sample] == [False, False, True, True]


def test_samples_of_other_kinds_are_a_type_error():
    offline = ReplayBuffer(storage=LazyTensorStorage(10))
    offline.extend(torch.arange(10.0))
    rb = make(offline, online_capacity=None, online_storage=ListStorage(10),
              offline_fraction=0.5, batch_size=4)
    rb.extend([1000, 1001])
    with pytest.raises(TypeError, match="offline sample of type Tensor with an online sample "
                                        "of type list"):
        rb.sample()
    assert len(rb.online_buffer) == 2


def test_samples_that_are_neither_tensordicts_tensors_nor_lists_are_a_type_error():
    offline = ReplayBuffer(storage=ListStorage(10), collate_fn=tuple)
    offline.extend(list(range(10)))
    rb = make(offline, online_capacity=None, online_storage=ListStorage(10),
              offline_fraction=0.5, batch_size=4)
    rb.extend([1000, 1001])
    with pytest.raises(TypeError, match="offline sample of type tuple with an online sample of "
                                        "type list: both must be TensorDicts, tensors or lists"):
        rb.sample()


def test_entries_only_one_side_has_are_a_key_error_naming_them():
    offline = offline_td(100, extra=torch.zeros(100), nested=TensorDict(
        {"a": torch.zeros(100)}, [100]))
    rb = make(offline, offline_fraction=0.5, batch_size=8)
    rb.extend(online_td(10, other=torch.ones(10)))
    with pytest.raises(KeyError) as err:
        rb.sample()
    message = err.value.args[0]
    assert "only the offline dataset's samples have [('nested', 'a'), 'extra']" in message
    assert "only the online buffer's ['other']" in message
    assert len(rb.online_buffer) == 10  # nothing changed


def test_a_minari_dataset_with_online_data_samples(cartpole, root):
    """TorchRL's online buffer has no "index": a KeyError there as soon as it holds data."""
    data = MinariExperienceReplay(CARTPOLE_ID, 4, root=root, load_from_local_minari=True)
    rb = OfflineToOnlineReplayBuffer(data, online_capacity=100, offline_fraction=0.25,
                                     batch_size=12)
    assert type(rb.online_buffer) is TensorDictReplayBuffer
    steps = data[:10]  # online steps of the same environment: the same entries
    steps["observation"] += ONLINE
    steps["next", "observation"] += ONLINE
    assert rb.extend(steps).tolist() == list(range(10))
    batch = rb.sample()
    assert batch.batch_size == (12,)
    assert sorted(batch.keys()) == ["action", "episode", "index", "next", "observation"]
    from_online = batch["observation"][:, 0] >= ONLINE / 2
    assert from_online.tolist() == [False] * 3 + [True] * 9
    # the offline rows are rows of the dataset, at their index
    stored = data.storage[batch["index"][:3]]
    assert torch.equal(stored["observation"], batch["observation"][:3])
    assert torch.equal(rb.online_buffer.storage[batch["index"][3:]]["observation"],
                       batch["observation"][3:])


def test_a_string_dataset_is_built_with_load_dataset(cartpole, root):
    rb = OfflineToOnlineReplayBuffer(f"minari:{CARTPOLE_ID}", online_capacity=20, batch_size=6,
                                     root=root, load_from_local_minari=True)
    assert type(rb.offline_buffer) is MinariExperienceReplay
    assert rb.offline_buffer.batch_size == 6 and rb.offline_buffer.root == root
    assert rb.sample().batch_size == (6,)
    again = OfflineToOnlineReplayBuffer(f"MINARI:{CARTPOLE_ID}", online_capacity=20,
                                        batch_size=6, root=root, download=False)
    assert len(again) == len(rb.offline_buffer) == rb.offline_buffer.metadata["total_steps"]


def test_batch_size_and_dataset_kwargs_go_to_the_dataset():
    calls = []

    def factory(dataset_id, **kwargs):
        calls.append((dataset_id, kwargs))
        return offline_td()

    saved = dict(registry._REGISTRY)
    try:
        register_dataset("o2otoy", factory)
        rb = OfflineToOnlineReplayBuffer("o2otoy:abc", online_capacity=5, batch_size=8,
                                         root="r")
        assert calls == [("abc", {"batch_size": 8, "root": "r"})]
        assert rb.sample()["obs"].shape == (8,) and rb.sample(4)["obs"].shape == (4,)
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)


def test_transform_gets_the_concatenated_batch():
    seen = []

    def transform(batch):
        seen.append(batch["obs"].clone())
        return batch.set("doubled", batch["obs"] * 2)

    rb = make(offline_fraction=0.5, batch_size=6, transform=transform)
    rb.extend(online_td(10))
    batch = rb.sample()
    assert len(seen) == 1 and seen[0].shape == (6,)
    assert (seen[0][:3] < 100).all() and (seen[0][3:] >= ONLINE).all()
    assert torch.equal(batch["doubled"], batch["obs"] * 2)


def test_len_and_repr():
    rb = make(offline_fraction=0.3, batch_size=8)
    assert len(rb) == 100
    assert repr(rb) == ("OfflineToOnlineReplayBuffer(offline=TensorDictReplayBuffer, "
                        "offline_fraction=0.300, online_size=0, batch_size=8)")
    rb.extend(online_td(7))
    rb.anneal(1, 3)
    assert len(rb) == 107
    assert repr(rb) == ("OfflineToOnlineReplayBuffer(offline=TensorDictReplayBuffer, "
                        "offline_fraction=0.200, online_size=7, batch_size=8)")
    assert "batch_size=None" in repr(make())


# ---- annealing -------------------------------------------------------------------------------
def test_anneal_decays_linearly_from_the_base_fraction():
    rb = make(offline_fraction=0.8, batch_size=10)
    expected = {0: 0.8, 25: 0.6, 50: 0.4, 75: 0.2, 100: 0.0, 150: 0.0}
    for step, value in expected.items():
        rb.anneal(step, 100)
        assert rb.offline_fraction == pytest.approx(value, abs=1e-12)
    rb.anneal(50, 100)
    rb.anneal(50, 100)  # from the base, not compounding
    assert rb.offline_fraction == pytest.approx(0.4)
    rb.anneal(2.5, 10.0)  # float steps too
    assert rb.offline_fraction == pytest.approx(0.6)
    rb.anneal(np.int64(5), np.int64(10))
    assert rb.offline_fraction == pytest.approx(0.4)


def test_annealed_fraction_sets_the_split():
    rb = make(offline_fraction=0.5, batch_size=10)
    rb.extend(online_td(20))
    rb.anneal(3, 5)  # 0.2: 2 offline rows
    assert int((rb.sample()["obs"] < 100).sum()) == 2
    rb.anneal(5, 5)  # 0: all online
    obs = rb.sample()["obs"]
    assert obs.shape == (10,) and (obs >= ONLINE).all()


@pytest.mark.parametrize("step, total_steps, error, match", [
    (1, 0, ValueError, "total_steps must be > 0, got 0"),
    (1, -5, ValueError, "total_steps must be > 0, got -5"),
    (-1, 10, ValueError, "step must be >= 0, got -1"),
    (True, 10, TypeError, "step must be a number, got bool"),
    (1, True, TypeError, "total_steps must be a number, got bool"),
    ("1", 10, TypeError, "step must be a number, got str"),
    (1, None, TypeError, "total_steps must be a number, got NoneType"),
    (float("nan"), 10, ValueError, "step must be finite"),
    (1, float("inf"), ValueError, "total_steps must be finite"),
])
def test_bad_anneal_arguments_change_nothing(step, total_steps, error, match):
    rb = make(offline_fraction=0.6)
    rb.anneal(1, 4)
    with pytest.raises(error, match=match):
        rb.anneal(step, total_steps)
    assert rb.offline_fraction == pytest.approx(0.45)


# ---- arguments -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    ({"online_storage": LazyTensorStorage(3)}, ValueError, "online_storage OR online_capacity"),
    ({"online_capacity": None}, ValueError, "one of online_storage or online_capacity"),
    ({"online_capacity": 0}, ValueError, "online_capacity must be >= 1, got 0"),
    ({"online_capacity": "10"}, TypeError, "online_capacity must be an int, got str"),
    ({"online_capacity": True}, TypeError, "online_capacity must be an int, got bool"),
    ({"online_capacity": None, "online_storage": object()}, TypeError,
     "online_storage must be a Storage instance, got object"),
    ({"offline_fraction": 0.0}, ValueError, r"offline_fraction must be in \(0, 1\), got 0.0"),
    ({"offline_fraction": 1}, ValueError, r"offline_fraction must be in \(0, 1\), got 1"),
    ({"offline_fraction": 1.5}, ValueError, r"offline_fraction must be in \(0, 1\)"),
    ({"offline_fraction": -0.2}, ValueError, r"offline_fraction must be in \(0, 1\)"),
    ({"offline_fraction": float("nan")}, ValueError, r"offline_fraction must be in \(0, 1\)"),
    ({"offline_fraction": True}, TypeError, "offline_fraction must be a number .* got bool"),
    ({"offline_fraction": "0.5"}, TypeError, "offline_fraction must be a number .* got str"),
    ({"offline_fraction": None}, TypeError, "offline_fraction must be a number"),
    ({"batch_size": 0}, ValueError, "batch_size must be a positive int, got 0"),
    ({"batch_size": -3}, ValueError, "batch_size must be a positive int"),
    ({"batch_size": True}, ValueError, "batch_size must be a positive int, got True"),
    ({"batch_size": 2.0}, ValueError, "batch_size must be a positive int, got 2.0"),
    ({"transform": 3}, TypeError, "transform must be callable, got int"),
    ({"root": "/tmp/x"}, ValueError, r"dataset_kwargs \(\['root'\]\) are only forwarded when "
                                     "offline_dataset is a string"),
])
def test_bad_arguments_name_the_argument(kwargs, error, match):
    kwargs = {"online_capacity": 10, **kwargs}
    with pytest.raises(error, match=match):
        OfflineToOnlineReplayBuffer(offline_td(), **kwargs)


def test_a_string_dataset_needs_a_batch_size_and_is_not_built_without_one():
    calls = []
    saved = dict(registry._REGISTRY)
    try:
        register_dataset("o2onobs", lambda dataset_id, **kw: calls.append(kw) or offline_td())
        with pytest.raises(ValueError, match="batch_size must be provided when offline_dataset "
                                             "is a string"):
            OfflineToOnlineReplayBuffer("o2onobs:x", online_capacity=10)
        with pytest.raises(ValueError, match="offline_fraction"):  # checked before loading
            OfflineToOnlineReplayBuffer("o2onobs:x", online_capacity=10, batch_size=4,
                                        offline_fraction=2.0)
        assert calls == []
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)


@pytest.mark.parametrize("offline", [42, object(), [1, 2, 3], None])
def test_an_offline_dataset_that_cannot_sample_is_a_type_error(offline):
    with pytest.raises(TypeError, match="offline_dataset must be a replay buffer"):
        OfflineToOnlineReplayBuffer(offline, online_capacity=10)


def test_fraction_accepts_numpy_and_int_like_numbers():
    rb = make(offline_fraction=np.float32(0.25), batch_size=np.int64(8))
    assert type(rb.offline_fraction) is float and rb.offline_fraction == 0.25
    rb.extend(online_td(10))
    assert int((rb.sample()["obs"] < 100).sum()) == 2


@pytest.mark.parametrize("batch_size", [0, -1, True, 1.5, "4"])
def test_bad_sample_batch_size_changes_nothing(batch_size):
    rb = make(batch_size=8)
    rb.extend(online_td(5))
    before = state_of(rb)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        rb.sample(batch_size)
    assert state_of(rb) == before


def test_sample_without_any_batch_size_is_a_value_error():
    rb = make()
    with pytest.raises(ValueError, match="batch_size must be provided either in __init__ or "
                                         "sample()"):
        rb.sample()
    assert rb.sample(3)["obs"].shape == (3,)


def test_load_dataset_is_the_one_used_for_strings():
    with pytest.raises(NotImplementedError, match="tdreplay has no D4RLExperienceReplay"):
        OfflineToOnlineReplayBuffer("d4rl:halfcheetah-medium-v2", online_capacity=10,
                                    batch_size=4)
    with pytest.raises(ValueError, match="Unknown dataset source 'nope'"):
        OfflineToOnlineReplayBuffer("nope:x", online_capacity=10, batch_size=4)
    assert load_dataset is registry.load_dataset


# ---- state -----------------------------------------------------------------------------------
def annealed(**kwargs) -> OfflineToOnlineReplayBuffer:
    rb = make(offline_fraction=0.6, batch_size=8, **kwargs)
    rb.extend(online_td(12))
    rb.anneal(1, 4)  # 0.45
    return rb


def test_state_dict_round_trip_keeps_online_data_and_both_fractions():
    rb = annealed()
    state = rb.state_dict()
    assert set(state) == {"online_buffer", "offline_fraction", "base_offline_fraction",
                          "offline_sampler", "offline_dataset"}
    assert state["offline_dataset"] == {"dataset_id": None, "rows": 100}
    assert state["offline_fraction"] == pytest.approx(0.45)
    assert state["base_offline_fraction"] == 0.6
    again = make(offline_fraction=0.2, batch_size=8)
    again.load_state_dict(state)
    assert again.offline_fraction == pytest.approx(0.45)
    assert again.online_buffer[:]["obs"].tolist() == list(range(1000, 1012))
    assert again.online_buffer.write_count == 12 and len(again) == 112
    again.anneal(0, 4)  # the base came back too
    assert again.offline_fraction == 0.6
    assert int((again.sample()["obs"] < 100).sum()) == round(0.6 * 8)


@pytest.mark.parametrize("patch, error, match", [
    (lambda s: [1, 2], TypeError, "state_dict must be a dict, got list"),
    (lambda s: {k: v for k, v in s.items() if k != "base_offline_fraction"}, ValueError,
     r"state_dict is missing \['base_offline_fraction'\]"),
    (lambda s: {**s, "base_offline_fraction": 1.5}, ValueError,
     r"base_offline_fraction must be in \(0, 1\)"),
    (lambda s: {**s, "base_offline_fraction": True}, ValueError, "base_offline_fraction"),
    (lambda s: {**s, "offline_fraction": 0.7}, ValueError,
     r"offline_fraction must be in \[0, base_offline_fraction = 0.6\], got 0.7"),
    (lambda s: {**s, "offline_fraction": -0.1}, ValueError, "offline_fraction must be in"),
    (lambda s: {**s, "offline_fraction": "0.1"}, ValueError,
     "offline_fraction must be a number, got str"),
    (lambda s: {**s, "online_buffer": make(online_capacity=7).online_buffer.state_dict()},
     ValueError, r"state_dict\['online_buffer'\]: .*max_size"),
    (lambda s: {**s, "online_buffer": {"_storage": {}}}, ValueError,
     r"state_dict\['online_buffer'\]: state_dict is missing"),
])
def test_a_bad_state_dict_changes_nothing(patch, error, match):
    source = annealed()
    rb = make(offline_fraction=0.3, batch_size=8)
    rb.extend(online_td(3, start=5000))
    before = state_of(rb)
    with pytest.raises(error, match=match):
        rb.load_state_dict(patch(source.state_dict()))
    assert state_of(rb) == before


def test_dumps_loads_round_trip_samples_the_same(tmp_path):
    rb = annealed()
    rb.dumps(tmp_path / "ckpt")
    again = make(offline_fraction=0.2, batch_size=8)
    again.loads(tmp_path / "ckpt")
    assert state_of(again) == state_of(rb)
    assert again.online_buffer.storage.max_size == 50
    for _ in range(3):
        torch.manual_seed(7)
        expected = rb.sample()
        torch.manual_seed(7)
        got = again.sample()
        assert torch.equal(expected["obs"], got["obs"])
        assert torch.equal(expected["index"], got["index"])
    again.anneal(0, 1)
    assert again.offline_fraction == 0.6  # base restored


def _offline_with(sampler) -> OfflineToOnlineReplayBuffer:
    offline = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler)
    offline.extend(TensorDict({"obs": torch.arange(40.0)}, [40]))
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=50, offline_fraction=0.5,
                                     batch_size=8)
    rb.extend(online_td(20))
    return rb


@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_restored_buffer_goes_on_with_the_offline_epoch(tmp_path, how):
    # (only the online buffer and the fractions were saved: a restored buffer began a new
    # offline epoch, drawing again rows the saved one had drawn and skipping others)
    rb = _offline_with(SamplerWithoutReplacement())
    for _ in range(3):
        rb.sample()  # 12 of the 40 offline rows of this epoch
    again = _offline_with(SamplerWithoutReplacement())
    if how == "dumps":
        rb.dumps(tmp_path / "ckpt")
        again.loads(tmp_path / "ckpt")
    else:
        again.load_state_dict(rb.state_dict())
    rest = [rb.sample()["obs"][:4].tolist() for _ in range(7)]
    assert [again.sample()["obs"][:4].tolist() for _ in range(7)] == rest
    assert sorted(sum(rest, [])) == sorted(set(sum(rest, [])))  # 28 rows, none twice


def test_offline_priorities_come_back_and_a_state_that_does_not_fit_is_refused(tmp_path):
    from tdreplay.samplers import PrioritizedSampler

    rb = _offline_with(PrioritizedSampler(40, 1.0, 1.0))
    rb.offline_buffer.update_priority(torch.arange(8), torch.full((8,), 50.0))
    rb.dumps(tmp_path / "ckpt")
    again = _offline_with(PrioritizedSampler(40, 1.0, 1.0))
    again.loads(tmp_path / "ckpt")
    assert again.offline_buffer.sampler.max_priority == 50.0
    assert torch.equal(again.offline_buffer.sampler.state_dict()["priorities"],
                       rb.offline_buffer.sampler.state_dict()["priorities"])
    # a checkpoint of another offline sampler: refused, nothing changes
    other = _offline_with(SamplerWithoutReplacement())
    other.extend(online_td(3, start=7000))
    before = (state_of(other), other.offline_buffer.sampler.state_dict())
    with pytest.raises(CheckpointError, match="offline_sampler.pt"):
        other.loads(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"state_dict\['offline_sampler'\]"):
        other.load_state_dict(rb.state_dict())
    after = (state_of(other), other.offline_buffer.sampler.state_dict())
    assert after[0] == before[0] and after[1].keys() == before[1].keys()
    assert all(torch.equal(torch.as_tensor(after[1][k]), torch.as_tensor(before[1][k]))
               for k in before[1])


def test_dumps_writes_one_atomic_checkpoint_with_the_fractions(tmp_path):
    rb = annealed()
    rb.dumps(tmp_path / "ckpt")
    snapshots = [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("snapshot-")]
    assert len(snapshots) == 1
    meta = json.loads((snapshots[0] / "offline_to_online.json").read_text())
    assert meta == {"format": 1, "kind": "OfflineToOnlineReplayBuffer",
                    "offline_fraction": pytest.approx(0.45), "base_offline_fraction": 0.6,
                    "offline_sampler": True, "online_buffer": "TensorDictReplayBuffer",
                    "offline_dataset": {"dataset_id": None, "rows": 100}}
    assert (snapshots[0] / "online" / "tdreplay-checkpoint.json").is_file()
    # a second save replaces the first
    rb.extend(online_td(2, start=7000))
    rb.dumps(tmp_path / "ckpt")
    again = make(batch_size=8)
    again.loads(tmp_path / "ckpt")
    assert len(again.online_buffer) == 14


def test_a_failed_dumps_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    rb = annealed()
    rb.dumps(tmp_path / "ckpt")
    rb.extend(online_td(5, start=8000))
    rb.anneal(3, 4)

    def broken(path):
        Path(path).mkdir(parents=True)
        (Path(path) / "half-written").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(rb.online_buffer, "dumps", broken)
    with pytest.raises(OSError, match="disk full"):
        rb.dumps(tmp_path / "ckpt")
    again = make(batch_size=8)
    again.loads(tmp_path / "ckpt")
    assert len(again.online_buffer) == 12 and again.offline_fraction == pytest.approx(0.45)


def loaded_target() -> tuple[OfflineToOnlineReplayBuffer, tuple]:
    rb = make(offline_fraction=0.3, batch_size=8)
    rb.extend(online_td(3, start=5000))
    rb.anneal(1, 3)
    return rb, state_of(rb)


def snapshot_of(path: Path) -> Path:
    (snap,) = [p for p in path.iterdir() if p.name.startswith("snapshot-")]
    return snap


def test_loads_of_a_damaged_json_changes_nothing(tmp_path):
    annealed().dumps(tmp_path / "ckpt")
    meta = snapshot_of(tmp_path / "ckpt") / "offline_to_online.json"
    meta.write_text(meta.read_text().replace("0.6", "0.9"))  # same size, other bytes
    rb, before = loaded_target()
    with pytest.raises(CheckpointError, match="offline_to_online.json' is corrupted"):
        rb.loads(tmp_path / "ckpt")
    assert state_of(rb) == before


@pytest.mark.parametrize("meta, match", [
    ({"offline_fraction": 0.2, "base_offline_fraction": 1.2}, "is damaged: base_offline_frac"),
    ({"offline_fraction": 0.5, "base_offline_fraction": 0.4}, "is damaged: offline_fraction"),
    ({"offline_fraction": None, "base_offline_fraction": 0.4}, "is damaged: offline_fraction"),
    ({"kind": "Something"}, "is not an OfflineToOnlineReplayBuffer checkpoint"),
    ({"format": 99}, "of format 1 .*format 99"),
    ({"online_buffer": "ReplayBuffer"}, "online buffer was saved as a ReplayBuffer, but this "
                                        "buffer's is a TensorDictReplayBuffer"),
])
def test_loads_checks_its_json_before_anything_changes(tmp_path, meta, match):
    """A checkpoint whose files are intact (checksums) but whose content does not fit."""
    source = annealed()
    with write_checkpoint(tmp_path / "ckpt") as snap:
        write_json(snap / "offline_to_online.json", {
            "format": 1, "kind": "OfflineToOnlineReplayBuffer", "offline_fraction": 0.1,
            "base_offline_fraction": 0.2, "online_buffer": "TensorDictReplayBuffer", **meta})
        source.online_buffer.dumps(snap / "online")
    rb, before = loaded_target()
    with pytest.raises(CheckpointError, match=match) as err:
        rb.loads(tmp_path / "ckpt")
    assert "offline_to_online.json" in str(err.value)
    assert state_of(rb) == before


def test_loads_without_the_online_part_changes_nothing(tmp_path):
    with write_checkpoint(tmp_path / "ckpt") as snap:
        write_json(snap / "offline_to_online.json", {
            "format": 1, "kind": "OfflineToOnlineReplayBuffer", "offline_fraction": 0.1,
            "base_offline_fraction": 0.2, "online_buffer": "TensorDictReplayBuffer"})
    rb, before = loaded_target()
    with pytest.raises(CheckpointError, match="/online': the path does not exist"):
        rb.loads(tmp_path / "ckpt")
    assert state_of(rb) == before
    # and a real checkpoint whose online part was removed
    annealed().dumps(tmp_path / "real")
    shutil.rmtree(snapshot_of(tmp_path / "real") / "online")
    with pytest.raises(CheckpointError, match=r"/online/\S* is missing"):
        rb.loads(tmp_path / "real")
    assert state_of(rb) == before


def test_loads_of_another_buffer_class_checkpoint_changes_nothing(tmp_path):
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(50))
    plain.extend(online_td(4))
    plain.dumps(tmp_path / "plain")
    rb, before = loaded_target()
    with pytest.raises(CheckpointError, match="is not a checkpoint of an "
                                              "OfflineToOnlineReplayBuffer.*holds a "
                                              "TensorDictReplayBuffer checkpoint"):
        rb.loads(tmp_path / "plain")
    assert state_of(rb) == before


def test_loads_of_a_plain_dataset_buffer_into_a_tensordict_one_changes_nothing(tmp_path):
    offline = ReplayBuffer(storage=LazyTensorStorage(100))
    offline.extend(TensorDict({"obs": torch.arange(100.0)}, [100]))
    plain = make(offline, offline_fraction=0.5)
    plain.extend(online_td(4))
    plain.dumps(tmp_path / "ckpt")
    rb, before = loaded_target()
    with pytest.raises(CheckpointError, match="saved as a ReplayBuffer"):
        rb.loads(tmp_path / "ckpt")
    assert state_of(rb) == before


def test_loads_into_an_online_buffer_of_another_capacity_changes_nothing(tmp_path):
    annealed().dumps(tmp_path / "ckpt")
    rb = make(offline_fraction=0.3, online_capacity=7, batch_size=8)
    rb.extend(online_td(3, start=5000))
    before = state_of(rb)
    with pytest.raises(CheckpointError, match="max_size=50 but this storage has max_size=7"):
        rb.loads(tmp_path / "ckpt")
    assert state_of(rb) == before


def test_loads_of_a_missing_path_is_a_file_not_found_error(tmp_path):
    rb, before = loaded_target()
    with pytest.raises(FileNotFoundError):
        rb.loads(tmp_path / "nothing")
    with pytest.raises(CheckpointError):
        rb.loads(tmp_path / "nothing")
    assert state_of(rb) == before


def test_a_minari_backed_buffer_checkpoints_without_the_dataset(cartpole, root, tmp_path):
    data = MinariExperienceReplay(CARTPOLE_ID, 4, root=root, load_from_local_minari=True)
    rb = OfflineToOnlineReplayBuffer(data, online_capacity=30, batch_size=8)
    steps = data[:6]
    steps["observation"] += ONLINE
    rb.extend(steps)
    rb.anneal(1, 2)
    rb.dumps(tmp_path / "ckpt")
    files = [p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file()]
    assert "tdreplay-dataset.json" not in files  # the dataset's own files are not copied
    again = OfflineToOnlineReplayBuffer(
        MinariExperienceReplay(CARTPOLE_ID, 4, root=root, download=False),
        online_capacity=30, batch_size=8)
    again.loads(tmp_path / "ckpt")
    assert again.offline_fraction == 0.25 and len(again) == len(rb)
    torch.manual_seed(3)
    expected = rb.sample()
    torch.manual_seed(3)
    assert (again.sample() == expected).all()


def _minari_o2o(dataset_id: str, root: Path) -> OfflineToOnlineReplayBuffer:
    data = MinariExperienceReplay(dataset_id, 4, root=root, load_from_local_minari=True,
                                  sampler=SamplerWithoutReplacement())
    rb = OfflineToOnlineReplayBuffer(data, online_capacity=30, batch_size=4)
    return rb


def _offline_epoch(rb: OfflineToOnlineReplayBuffer) -> tuple:
    """What a refused load must leave as it was: the fractions, the online buffer's rows and
    the offline sampler's state."""
    online = rb.online_buffer
    rows = online[:] if len(online) else TensorDict()
    state = rb.offline_buffer.sampler.state_dict()
    return (rb.offline_fraction, rb.state_dict()["base_offline_fraction"], len(online),
            online.write_count,
            {key: value.tolist() for key, value in rows.items(True, True)},
            {key: torch.as_tensor(value).tolist() for key, value in state.items()})


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
@pytest.mark.parametrize("other", ["same rows, other id", "other rows, other id"])
def test_a_state_saved_over_another_dataset_is_refused(cartpole, cartpole_maker, root,
                                                       tmp_path, how, other):
    # (accepted: the sampler dropped the saved epoch without a word, or went on with it over
    # another dataset's rows)
    seeds = (0, 1, 2, 3, 4) if other.startswith("same") else (5, 6, 7)
    cartpole_maker("cartpole/other-v0", seeds)
    saved = _minari_o2o(CARTPOLE_ID, root)
    saved.sample()  # an offline epoch under way
    target = _minari_o2o("cartpole/other-v0", root)
    target.extend(target.offline_buffer[:3])
    target.sample()
    assert (len(target.offline_buffer) == len(saved.offline_buffer)) == \
        other.startswith("same")
    before = _offline_epoch(target)
    rows = len(saved.offline_buffer)
    match = (f"the state was saved over the offline dataset {CARTPOLE_ID!r} \\({rows} rows\\), "
             f"but this buffer's offline dataset is 'cartpole/other-v0' "
             f"\\({len(target.offline_buffer)} rows\\)")
    if how == "dumps":
        saved.dumps(tmp_path / "ckpt")
        with pytest.raises(CheckpointError, match="offline_to_online.json': " + match):
            target.loads(tmp_path / "ckpt")
    else:
        with pytest.raises(ValueError, match=r"state_dict\['offline_dataset'\]: " + match):
            target.load_state_dict(saved.state_dict())
    assert _offline_epoch(target) == before


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_state_saved_over_the_same_dataset_goes_on_with_its_epoch(cartpole, root, tmp_path,
                                                                    how):
    saved = _minari_o2o(CARTPOLE_ID, root)
    saved.sample()
    again = _minari_o2o(CARTPOLE_ID, root)
    if how == "dumps":
        saved.dumps(tmp_path / "ckpt")
        again.loads(tmp_path / "ckpt")
    else:
        again.load_state_dict(saved.state_dict())
    rest = [saved.sample()["index"].tolist() for _ in range(3)]
    assert [again.sample()["index"].tolist() for _ in range(3)] == rest


def test_a_state_without_the_dataset_record_still_loads(tmp_path):
    # (saved by an earlier version: no "offline_dataset" entry, no check of the dataset)
    rb = _offline_with(SamplerWithoutReplacement())
    rb.sample()
    state = rb.state_dict()
    state.pop("offline_dataset", None)
    again = _offline_with(SamplerWithoutReplacement())
    again.load_state_dict(state)
    with write_checkpoint(tmp_path / "ckpt") as snap:
        write_json(snap / "offline_to_online.json", {
            "format": 1, "kind": "OfflineToOnlineReplayBuffer", "offline_fraction": 0.5,
            "base_offline_fraction": 0.5, "offline_sampler": True,
            "online_buffer": "TensorDictReplayBuffer"})
        torch.save(rb.offline_buffer.sampler.state_dict(), snap / "offline_sampler.pt")
        rb.online_buffer.dumps(snap / "online")
    third = _offline_with(SamplerWithoutReplacement())
    third.loads(tmp_path / "ckpt")
    rest = [rb.sample()["obs"][:4].tolist() for _ in range(4)]
    assert [again.sample()["obs"][:4].tolist() for _ in range(4)] == rest
    assert [third.sample()["obs"][:4].tolist() for _ in range(4)] == rest


@pytest.mark.parametrize("record", [{"rows": "40"}, {"rows": True}, {"rows": -1},
                                    {"rows": 40, "dataset_id": 3}, [40]])
def test_a_damaged_dataset_record_is_refused(record):
    rb = _offline_with(SamplerWithoutReplacement())
    target = _offline_with(SamplerWithoutReplacement())
    target.sample()
    before = _offline_epoch(target)
    with pytest.raises(ValueError, match=r"state_dict\['offline_dataset'\]: the record of the "
                                         "offline dataset the state was saved over is damaged"):
        target.load_state_dict({**rb.state_dict(), "offline_dataset": record})
    assert _offline_epoch(target) == before


def test_a_state_saved_over_a_buffer_of_other_rows_is_refused():
    small = _offline_with(SamplerWithoutReplacement())
    small.sample()
    offline = TensorDictReplayBuffer(storage=LazyTensorStorage(60),
                                     sampler=SamplerWithoutReplacement())
    offline.extend(TensorDict({"obs": torch.arange(60.0)}, [60]))
    big = OfflineToOnlineReplayBuffer(offline, online_capacity=50, batch_size=8)
    big.sample()
    before = _offline_epoch(big)
    with pytest.raises(ValueError, match="saved over the offline dataset one without a "
                                         r"dataset_id \(40 rows\), but this buffer's offline "
                                         r"dataset is one without a dataset_id \(60 rows\)"):
        big.load_state_dict(small.state_dict())
    assert _offline_epoch(big) == before


# ---- threads ---------------------------------------------------------------------------------
def test_concurrent_extend_sample_and_anneal():
    rb = make(offline_fraction=0.5, online_capacity=10_000, batch_size=10)
    rb.extend(online_td(1))
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def writer(k):
        barrier.wait()
        try:
            for i in range(50):
                rb.extend(online_td(4, start=ONLINE + 1000 * k + 4 * i))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    def reader():
        barrier.wait()
        try:
            for i in range(100):
                rb.anneal(i % 3, 4)
                obs = rb.sample()["obs"]
                n_offline = int((obs < 100).sum())
                assert obs.shape == (10,) and n_offline in (5, 4, 2)
                assert (obs[:n_offline] < 100).all() and (obs[n_offline:] >= ONLINE).all()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    threads.append(threading.Thread(target=reader))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(rb.online_buffer) == 1 + 3 * 50 * 4
    assert sorted(rb.online_buffer[:]["obs"].tolist()) == sorted(
        [ONLINE] + [ONLINE + 1000 * k + j for k in range(3) for j in range(200)])


def test_a_sampler_without_replacement_offline_keeps_the_split():
    offline = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                     sampler=SamplerWithoutReplacement())
    offline.extend(TensorDict({"obs": torch.arange(20.0)}, [20]))
    rb = make(offline, offline_fraction=0.5, batch_size=8)
    rb.extend(online_td(10))
    seen = torch.cat([rb.sample()["obs"][:4] for _ in range(5)])
    assert sorted(seen.tolist()) == [float(i) for i in range(20)]




@pytest.mark.parametrize("failing", ["online", "join", "transform"])
def test_a_batch_refused_after_the_offline_draw_consumes_nothing(failing):
    # the offline rows are drawn first (without replacement); the online part (its buffer's
    # transform), the join (entries that differ) or the transform then raises: the offline
    # draw is given back, so its epoch still holds all 20 rows, each drawn once
    from tdreplay.core import testing

    offline = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                     sampler=SamplerWithoutReplacement())
    offline.extend(TensorDict({"obs": torch.arange(20.0)}, [20]))
    transform = testing.FailOnce(at=0) if failing == "transform" else None
    rb = make(offline, offline_fraction=0.5, batch_size=8, transform=transform)
    rb.extend(online_td(10, extra=torch.zeros(10)) if failing == "join" else online_td(10))
    if failing == "online":
        rb.online_buffer.append_transform(testing.FailOnce(at=0))
    before = offline.sampler.state_dict()
    with pytest.raises((RuntimeError, KeyError)):
        rb.sample()
    testing.assert_same(offline.sampler.state_dict(), before)
    if failing != "join":
        rows = torch.cat([rb.sample()["obs"][:4] for _ in range(5)])
        assert sorted(rows.tolist()) == [float(i) for i in range(20)]


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copy_keeps_both_buffers_and_both_fractions_and_samples_alone(how):
    import copy
    import pickle

    rb = make(offline_fraction=0.5, batch_size=8)
    rb.extend(online_td(10))
    rb.anneal(1, 4)
    twin = pickle.loads(pickle.dumps(rb)) if how == "pickle" else copy.deepcopy(rb)
    assert (twin.offline_fraction, twin.state_dict()["base_offline_fraction"]) == (0.375, 0.5)
    assert state_of(twin) == state_of(rb)
    assert int((twin.sample()["obs"] < ONLINE).sum()) == 3  # round(0.375 * 8) offline rows
    twin.extend(online_td(2, start=ONLINE + 50))
    twin.anneal(3, 4)  # the copy has a lock and buffers of its own
    assert len(twin.online_buffer) == 12 and len(rb.online_buffer) == 10
    assert rb.offline_fraction == 0.375


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes came with 3.11")
def test_an_error_of_a_share_of_the_batch_says_which_share():
    # (a slice sampler refused "batch_size=5" for a batch of 16: the 5 was round(0.3 * 16))
    from tdreplay.samplers import SliceSampler

    offline = TensorDictReplayBuffer(storage=LazyTensorStorage(40),
                                     sampler=SliceSampler(slice_len=4, traj_key="episode"))
    offline.extend(TensorDict({"obs": torch.arange(40.0),
                               "episode": torch.arange(40) // 10}, [40]))
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=50, offline_fraction=0.3,
                                     batch_size=16)
    rb.extend(online_td(13, episode=torch.full((13,), 9)))
    with pytest.raises(ValueError, match="divisible by slice_len") as caught:
        rb.sample()
    assert caught.value.__notes__ == [
        "(sampling the offline share, round(0.3 * 16) = 5 rows of an OfflineToOnlineReplayBuffer"
        " batch)"]
