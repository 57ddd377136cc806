"""rb.update_if_present on tensor storages (the storages that support conditional updates)."""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, RoundRobinWriter, TensorDictReplayBuffer
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


def _rb(size=6, storage=None):
    rb = TensorDictReplayBuffer(storage=storage if storage is not None else LazyTensorStorage(size),
                                batch_size=3,
                                writer=RoundRobinWriter(track_generations=True))
    data = TensorDict({"obs": torch.arange(size, dtype=torch.float32).unsqueeze(-1).expand(
        size, 2).clone(), "v": torch.full((size,), 5), "n": {"k": torch.zeros(size)}}, [size])
    index = rb.extend(data)
    return rb, data, index, rb.writer.generations_of(index)


def test_capabilities():
    assert LazyTensorStorage(2).supports_conditional_update is True
    assert ListStorage(2).supports_conditional_update is False


def test_live_rows_patched_stale_rows_untouched():
    rb, _, index, gen = _rb()
    rb.extend(TensorDict({"obs": -torch.ones(2, 2), "v": torch.zeros(2, dtype=torch.long),
                          "n": {"k": torch.ones(2)}}, [2]))
    result = rb.update_if_present(index=index, generation=gen,
                                  patch={"obs": torch.full((6, 2), 9.0),
                                         ("n", "k"): torch.full((6,), 3.0)})
    assert result.updated.tolist() == [False, False, True, True, True, True]
    assert (result.updated_count, result.stale_count, result.version_rejected) == (4, 2, None)
    assert rb[:]["obs"][:, 0].tolist() == [-1, -1, 9, 9, 9, 9]
    assert rb[:]["n", "k"].tolist() == [1, 1, 3, 3, 3, 3]
    # the handle keeps working after an update
    assert rb.update_if_present(index=index, generation=gen,
                                patch={"obs": torch.zeros(6, 2)}).updated_count == 4


def test_sampled_handles():
    rb, *_ = _rb()
    sample = rb.sample()
    result = rb.update_if_present(index=sample["index"], generation=sample["index_generation"],
                                  patch={"obs": torch.full((3, 2), 7.0)})
    assert result.updated.all()
    assert (rb[:]["obs"][sample["index"]] == 7).all()


@pytest.mark.parametrize("patch, error, match", [
    ({"missing": torch.zeros(6)}, KeyError, "missing"),
    ({"obs": torch.zeros(6, 3)}, ValueError, "shape"),
    ({"obs": torch.zeros(6, 2, dtype=torch.long)}, ValueError, "dtype"),
    ({"obs": [0.0] * 6}, ValueError, "tensor"),
])
def test_bad_patch_refused_before_any_write(patch, error, match):
    rb, data, index, gen = _rb()
    good = {("n", "k"): torch.ones(6)}
    with pytest.raises(error, match=match):
        rb.update_if_present(index=index, generation=gen, patch={**good, **patch})
    assert torch.equal(rb[:]["obs"], data["obs"]) and (rb[:]["n", "k"] == 0).all()


def test_bad_arguments_refused():
    rb, _, index, gen = _rb()
    with pytest.raises(ValueError, match="same records"):
        rb.update_if_present(index=index, generation=gen[:2], patch={})
    with pytest.raises(ValueError, match="together"):
        rb.update_if_present(index=index, generation=gen, patch={}, version=3)
    with pytest.raises(TypeError, match="patch"):
        rb.update_if_present(index=index, generation=gen, patch=[1])
    with pytest.raises(TypeError, match="require_newer"):
        rb.update_if_present(index=index, generation=gen, patch={}, require_newer=1)


def test_float_handles_are_refused_not_truncated():
    # a float index 0.5 would patch slot 0, a float generation 0.5 would match generation 0
    rb, data, index, gen = _rb()
    for kwargs, name in [({"index": torch.tensor([0.5]), "generation": gen[:1]}, "index"),
                         ({"index": index, "generation": gen.double() + 0.5}, "generation")]:
        with pytest.raises(TypeError, match=name):
            rb.update_if_present(patch={"obs": torch.ones(kwargs["generation"].numel(), 2)},
                                 **kwargs)
        with pytest.raises(TypeError, match=name):
            rb.submit_update_if_present(
                patch={"obs": torch.ones(kwargs["generation"].numel(), 2)}, **kwargs)
    assert torch.equal(rb[:]["obs"], data["obs"])
    rb.shutdown()


def test_versions():
    rb, _, index, gen = _rb()
    result = rb.update_if_present(index=index, generation=gen,
                                  patch={"obs": torch.ones(6, 2)}, version_key="v",
                                  version=torch.tensor([6, 6, 6, 4, 4, 5]), require_newer=True)
    assert result.updated.tolist() == [True] * 3 + [False] * 3
    assert result.version_rejected_count == 3 and result.stale_count == 0
    assert rb[:]["v"].tolist() == [6, 6, 6, 5, 5, 5]
    # duplicates: the highest version wins, whatever the order
    dup = rb.update_if_present(index=index[[4, 4]], generation=gen[[4, 4]],
                               patch={"obs": torch.tensor([[1.0, 1], [2, 2]])},
                               version_key="v", version=torch.tensor([8, 7]))
    assert dup.updated.tolist() == [True, False] and rb[:]["obs"][4].tolist() == [1, 1]
    with pytest.raises(TypeError, match="version must be a number"):
        rb.update_if_present(index=index, generation=gen, patch={}, version_key="v",
                             version="abc")
    for key, match in [("obs", "scalar"), ("v.x", "Dotted"), ("nope", "nope")]:
        with pytest.raises((ValueError, KeyError), match=match):
            rb.update_if_present(index=index, generation=gen, patch={}, version_key=key,
                                 version=9)
    with pytest.raises(ValueError, match="may not appear"):
        rb.update_if_present(index=index, generation=gen, patch={"v": torch.zeros(6).long()},
                             version_key="v", version=9)


def test_empty_invalidates_and_checkpoint_keeps_handles(tmp_path):
    rb, data, index, gen = _rb(storage=LazyMemmapStorage(6))
    rb.dumps(tmp_path / "c")
    fresh = TensorDictReplayBuffer(storage=LazyMemmapStorage(6), batch_size=3,
                                   writer=RoundRobinWriter(track_generations=True))
    fresh.loads(tmp_path / "c")  # a buffer that handed out no handle keeps the saved stamps
    assert fresh.update_if_present(index=index, generation=gen,
                                   patch={"obs": torch.zeros(6, 2)}).updated.all()
    rb2, _, _, own = _rb(storage=LazyMemmapStorage(6))
    rb2.empty()
    rb2.loads(tmp_path / "c")  # its own handles, and those of the saved stamps, are stale now
    for handles in (own, gen):
        assert rb2.update_if_present(index=index, generation=handles,
                                     patch={"obs": torch.zeros(6, 2)}).stale_count == 6
    rb.empty()
    rb.extend(data)
    assert rb.update_if_present(index=index, generation=gen,
                                patch={"obs": torch.zeros(6, 2)}).stale_count == 6


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_an_emptied_storage_still_checks_the_patch(storage):
    rb, _, index, gen = _rb(storage=storage(6))
    rb.empty()  # laid out, nothing live: a patch is checked against the layout all the same
    for patch, error in [({"missing": torch.zeros(6)}, KeyError),
                         ({"obs": torch.zeros(6, 3)}, ValueError)]:
        with pytest.raises(error):
            rb.update_if_present(index=index, generation=gen, patch=patch)
        with pytest.raises(error):
            rb.submit_update_if_present(index=index, generation=gen, patch=patch)
    with pytest.raises(KeyError, match="nope"):
        rb.update_if_present(index=index, generation=gen, patch={}, version_key="nope",
                             version=1)
    result = rb.update_if_present(index=index, generation=gen, patch={"obs": torch.ones(6, 2)},
                                  version_key="v", version=9)
    assert not result.updated.any() and len(rb) == 0
    never_written = TensorDictReplayBuffer(storage=storage(6),
                                           writer=RoundRobinWriter(track_generations=True))
    # no layout to check against: nothing is live, nothing raises
    assert not never_written.update_if_present(index=index, generation=gen,
                                               patch={"missing": torch.zeros(6)}).updated.any()
    rb.shutdown()


def test_ndim2_storage():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(6, ndim=2),
                                writer=RoundRobinWriter(track_generations=True))
    data = TensorDict({"obs": torch.arange(6.0).reshape(2, 3)}, [2, 3])
    index = rb.extend(data)
    gen = rb.writer.generations_of(index)
    result = rb.update_if_present(index=index, generation=gen,
                                  patch={"obs": torch.full((2, 3), 4.0)})
    assert result.updated.all() and (rb[:]["obs"] == 4).all()


def test_untracked_writer_or_plain_tensors_refused():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    index = rb.extend(TensorDict({"x": torch.zeros(4)}, [4]))
    with pytest.raises(RuntimeError, match="conditional") as refused:
        rb.update_if_present(index=index, generation=torch.zeros(4), patch={})
    # the message names what is lacking: the writer here, not the storage
    assert "writer must track generations" in str(refused.value)
    assert "storage must hold" not in str(refused.value)
    listed = TensorDictReplayBuffer(storage=ListStorage(4),
                                    writer=RoundRobinWriter(track_generations=True))
    with pytest.raises(RuntimeError, match="storage must hold TensorDicts in columns") as refused:
        listed.update_if_present(index=index, generation=torch.zeros(4, dtype=torch.long),
                                 patch={})
    assert "writer must" not in str(refused.value)
    rb = ReplayBuffer(storage=LazyTensorStorage(4),
                      writer=RoundRobinWriter(track_generations=True))
    index = rb.extend(torch.arange(4))
    with pytest.raises(RuntimeError, match="conditional"):
        rb.update_if_present(index=index, generation=rb.writer.generations_of(index),
                             patch={})


def test_concurrent_writes_and_updates():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(32), batch_size=4,
                                writer=RoundRobinWriter(track_generations=True))
    rb.extend(TensorDict({"a": torch.zeros(32), "b": torch.zeros(32)}, [32]))
    stop, errors = threading.Event(), []

    def write():
        value = 1.0
        while not stop.is_set():
            try:
                rb.extend(TensorDict({"a": torch.full((4,), value),
                                      "b": torch.full((4,), value)}, [4]))
            except Exception as err:  # pragma: no cover - reported below
                errors.append(err)
                return
            value += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        for step in range(100):
            s = rb.sample()
            rb.update_if_present(index=s["index"], generation=s["index_generation"],
                                 patch={"a": torch.full((4,), -step - 1.0),
                                        "b": torch.full((4,), -step - 1.0)})
            with rb.locked():
                content = rb.storage.get(torch.arange(32))
                assert torch.equal(content["a"], content["b"])
    finally:
        stop.set()
        thread.join()
    assert not errors
