"""Sample units: Transition, Sequence windows and boundaries, sample_unit= on buffers."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    SampleUnit,
    Sequence,
    TensorDictReplayBuffer,
    Transition,
)
from tdreplay.core.testing import StackedListStorage


def _buffer(n=10, done_at=(4, 9), capacity=None, **kwargs):
    rb = TensorDictReplayBuffer(storage=StackedListStorage(capacity or n), batch_size=2, **kwargs)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[list(done_at)] = True
    rb.extend(TensorDict({"obs": torch.arange(n, dtype=torch.float32),
                          ("next", "done"): done}, [n]))
    return rb


def _expand(unit, rb, anchors):
    index, info = unit.expand(torch.tensor(anchors), {"w": torch.tensor([1.0] * len(anchors)),
                                                    "scalar": 3.0}, rb.storage)
    return index.tolist(), info


def test_transition_is_identity_and_default():
    for unit in (None, Transition()):
        gen = torch.Generator().manual_seed(0)
        rb = ReplayBuffer(storage=ListStorage(8), batch_size=3, generator=gen, sample_unit=unit)
        rb.extend([torch.tensor(i) for i in range(8)])
        batch, info = rb.sample(return_info=True)
        assert batch.tolist() == info["index"].tolist()
    with pytest.raises(TypeError, match="sample_unit"):
        ReplayBuffer(sample_unit="window")


def test_sequence_policies():
    rb = _buffer()
    index, info = _expand(Sequence(length=3), rb, [0, 6])
    assert index == [0, 1, 2, 6, 7, 8]
    assert info["sequence_id"].tolist() == [0, 0, 0, 1, 1, 1]
    assert info["w"].shape == (6,) and info["scalar"] == 3.0
    assert info["anchor_index"].tolist() == [0, 0, 0, 6, 6, 6]
    index, info = _expand(Sequence(length=3, episode_boundary="pad"), rb, [3])
    assert index == [3, 4, 4] and info["validity_mask"].tolist() == [True, True, False]
    index, info = _expand(Sequence(length=3, episode_boundary="stop"), rb, [3])
    assert index == [2, 3, 4] and bool(info["validity_mask"].all())
    index, info = _expand(Sequence(length=3, episode_boundary="include_reset"), rb, [3])
    assert index == [3, 4, 5] and bool(info["validity_mask"].all())


def test_burn_in_bootstrap_dilation():
    rb = _buffer()
    index, info = _expand(Sequence(length=2, burn_in=1, bootstrap=1), rb, [5])
    assert index == [5, 5, 6, 7]
    assert info["validity_mask"].tolist() == [False, True, True, True]
    assert info["learning_mask"].tolist() == [False, True, True, False]
    assert _expand(Sequence(length=3, dilation=2), _buffer(done_at=(9,)), [0])[0] == [0, 2, 4]


def test_full_ring_is_cut_at_the_newest_row():
    rb = _buffer(n=14, done_at=(), capacity=10)  # rows 0..3 hold steps 10..13, row 3 newest
    index, info = _expand(Sequence(length=4, episode_boundary="include_reset"), rb, [2])
    assert index == [2, 3, 3, 3]
    assert info["validity_mask"].tolist() == [True, True, False, False]
    index, _ = _expand(Sequence(length=4, episode_boundary="include_reset"), rb, [8])
    assert index == [8, 9, 0, 1]


def test_bad_arguments_and_storages():
    for kwargs, message in (({"length": 0}, "length must be >= 1, got 0"),
                            ({"length": 2, "burn_in": -1}, "burn_in must be >= 0, got -1"),
                            ({"length": 2, "dilation": 0}, "dilation must be >= 1, got 0"),
                            ({"length": 2, "episode_boundary": "teleport"}, "episode_boundary")):
        with pytest.raises(ValueError, match=message):
            Sequence(**kwargs)
    for kwargs, message in (({"length": None}, "length must be an int, got NoneType"),
                            ({"length": 2.0}, "length must be an int, got float"),
                            ({"length": 2, "bootstrap": True}, "bootstrap must be an int, got bool")):
        with pytest.raises(TypeError, match=message):
            Sequence(**kwargs)
    assert Sequence(length=torch.tensor(3).numpy()[()]).length == 3  # (a numpy integer)
    with pytest.raises(TypeError, match="TensorStorage"):
        Sequence(length=2).expand(torch.tensor([0]), {}, ListStorage(4))
    with pytest.raises(KeyError, match="done_key"):
        Sequence(length=2, done_key="nope").expand(torch.tensor([0]), {}, _buffer().storage)


def test_sampling_windows_and_anchor_priorities():
    rb = _buffer(sample_unit=Sequence(length=3, bootstrap=1))
    batch = rb.sample()
    assert batch.batch_size == (8,)
    assert int(batch["learning_mask"].sum()) == 6
    assert isinstance(rb.sample_unit, SampleUnit)
    data = TensorDict({"anchor_index": torch.tensor([7, 7, 7, 2, 2]),
                       "validity_mask": torch.tensor([True, True, False, True, True])}, [5])
    anchors, priority = Sequence(length=2).anchor_priority(
        data, torch.tensor([1.0, 2.0, 50.0, 4.0, 3.0]))
    assert anchors.tolist() == [2, 7] and priority.tolist() == [4.0, 2.0]


@pytest.mark.parametrize("done_key", [5, ("next", 5), ()])
def test_a_done_key_that_is_no_key_is_a_type_error_naming_it(done_key):
    # ("'int' object is not iterable")
    with pytest.raises(TypeError, match="done_key must be a str or a tuple of str or None"):
        Sequence(2, done_key=done_key)
    assert Sequence(2, done_key=["next", "done"]).done_key == ("next", "done")
