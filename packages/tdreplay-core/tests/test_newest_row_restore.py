"""A restored buffer cuts its ring where the saved one did: the storage's ``last_written_row``
is saved with the buffer (the writer's cursor does not tell it when writes go to freed slots,
e.g. consumed ones). Before, a restored consuming buffer took the row before the cursor as the
newest: HER drew "final" goals from an older lap and ``Sequence`` windows ran across the cut."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import HERReplayBuffer, Sequence, TensorDictReplayBuffer

storages = pytest.importorskip("tdreplay.storages")


def _steps(first: int, end: int) -> TensorDict:
    n = end - first
    return TensorDict({
        "x": torch.arange(first, end), "traj_ids": torch.zeros(n, dtype=torch.long),
        "desired_goal": torch.full((n, 1), -1.0),
        "achieved_goal": torch.arange(first, end, dtype=torch.float32).view(-1, 1),
        "next": {"reward": torch.zeros(n, 1), "done": torch.zeros(n, 1, dtype=torch.bool)},
    }, [n])


def _her() -> HERReplayBuffer:
    return HERReplayBuffer(reward_fn=lambda td: td["next", "reward"],
                           storage=storages.LazyTensorStorage(4), batch_size=1, her_ratio=1.0,
                           strategy="final", consume_after_n_samples=1,
                           generator=torch.Generator().manual_seed(0))


def _sequences() -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=storages.LazyTensorStorage(4), batch_size=1,
                                  consume_after_n_samples=1,
                                  sample_unit=Sequence(2, burn_in=1),
                                  generator=torch.Generator().manual_seed(0))


def _restore(rb, make, how, tmp_path):
    back = make()
    if how == "dumps":
        rb.dumps(tmp_path / "ckpt")
        back.loads(tmp_path / "ckpt")
    else:
        back.load_state_dict(copy.deepcopy(rb.state_dict()))
    return back


@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_restored_consuming_her_buffer_relabels_as_the_saved_one(how, tmp_path):
    rb = _her()
    rb.extend(_steps(0, 4))
    rb.sample(4)  # every slot consumed
    rb.extend(_steps(4, 5))  # step 4 goes to freed slot 0, not to the cursor's
    assert rb.storage.last_written_row == 0
    back = _restore(rb, _her, how, tmp_path)
    assert back.storage.last_written_row == 0  # (was 3, the row before the cursor)
    assert rb.sample()["desired_goal"].item() == 4.0
    assert back.sample()["desired_goal"].item() == 4.0  # (was 3.0, a step of the old lap)


@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_a_restored_consuming_buffer_cuts_sequence_windows_where_the_saved_one_did(how,
                                                                                    tmp_path):
    rb = _sequences()
    rb.extend(_steps(0, 4))
    rb.sample(4)
    rb.extend(_steps(4, 5))
    back = _restore(rb, _sequences, how, tmp_path)
    # time order, cut after the newest row (0): the writer's cursor (0) told row 3, and the
    # query joined step 4 before steps 1-3
    assert [t.x.tolist() for t in back.query()] == [t.x.tolist() for t in rb.query()] \
        == [[1, 2, 3, 4]]
    original, restored = rb.sample(), back.sample()
    assert restored["x"].tolist() == original["x"].tolist() == [3, 4, 4]  # (was [4, 4, 1])
    assert restored["validity_mask"].tolist() == original["validity_mask"].tolist()


def test_a_state_without_the_row_loads_with_the_row_the_writer_tells():
    rb = _sequences()
    rb.extend(_steps(0, 3))
    state = copy.deepcopy(rb.state_dict())
    del state["_last_written_row"]  # (a state saved before the row was)
    back = _sequences()
    back.load_state_dict(state)
    assert back.storage.last_written_row == 2


@pytest.mark.parametrize("row", [4, -1, 1.0, "0", True])
def test_a_saved_row_outside_the_storage_is_refused_and_nothing_changes(row):
    rb = _sequences()
    rb.extend(_steps(0, 3))
    state = copy.deepcopy(rb.state_dict())
    state["_last_written_row"] = row
    back = _sequences()
    back.extend(_steps(10, 12))
    with pytest.raises(ValueError, match=r"state_dict\['_last_written_row'\] must be None or a "
                                         r"row of the storage \(0 to 3\)"):
        back.load_state_dict(state)
    assert back[:]["x"].tolist() == [10, 11] and back.storage.last_written_row == 1
