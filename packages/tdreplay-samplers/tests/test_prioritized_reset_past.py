"""A prioritized buffer whose storage is restored past it (``rb.storage.loads(path)`` /
``load_state_dict``, as TorchRL programs do): its sampler and writer follow at once, so a
sample draws only the restored rows and a save made after it loads."""

from __future__ import annotations

import pytest

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.samplers import PrioritizedSampler


def _prioritized() -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(10), batch_size=4,
                        sampler=PrioritizedSampler(10, alpha=0.7, beta=0.5))


@pytest.mark.parametrize("how", ["loads", "load_state_dict"])
def test_a_state_saved_after_a_sample_past_a_restore_loads(how, tmp_path):
    source = ListStorage(10)
    source.set(range(3), [0, 1, 2])
    source.dumps(tmp_path / "storage")
    rb = _prioritized()
    rb.extend(list(range(10, 19)))
    rb.update_priority(list(range(9)), [float(p) for p in range(1, 10)])
    if how == "loads":
        rb.storage.loads(tmp_path / "storage")
    else:
        rb.storage.load_state_dict(source.state_dict())
    drawn = rb.sample(200, return_info=True)[1]["index"]
    assert set(drawn.tolist()) == {0, 1, 2}  # the restored rows only
    # the sample learnt the restored storage; the save then kept the writer's cursor past the
    # 3 rows (9): a state no buffer loaded ("the next write would leave a gap")
    state = rb.state_dict()
    assert state["_writer"]["cursor"] == 3
    restored = _prioritized()
    restored.load_state_dict(state)
    assert restored[:] == [0, 1, 2]
    restored.extend([7])
    assert restored[:] == [0, 1, 2, 7]
