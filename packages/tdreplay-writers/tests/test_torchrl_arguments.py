"""TorchRL's ``compilable`` argument accepted by the writers (issue 16)."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, RoundRobinWriter
from tdreplay.writers import (
    ImmutableDatasetWriter,
    TensorDictMaxValueWriter,
    TensorDictRoundRobinWriter,
)

WRITERS = {
    "round_robin": lambda **kw: RoundRobinWriter(**kw),
    "td_round_robin": lambda **kw: TensorDictRoundRobinWriter(**kw),
    "max_value": lambda **kw: TensorDictMaxValueWriter(rank_key="r", **kw),
    "immutable": lambda **kw: ImmutableDatasetWriter(**kw),
}


@pytest.mark.parametrize("kind", sorted(WRITERS))
@pytest.mark.parametrize("compilable", [False, True])
def test_compilable_is_accepted(kind, compilable):
    assert WRITERS[kind](compilable=compilable).compilable is compilable


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_compilable_must_be_a_bool(kind):
    with pytest.raises(TypeError, match="compilable"):
        WRITERS[kind](compilable=1)


@pytest.mark.parametrize("compilable", [False, True])
def test_rows_written_do_not_depend_on_compilable(compilable):
    rb = ReplayBuffer(storage=ListStorage(3),
                      writer=TensorDictMaxValueWriter(rank_key="r", compilable=compilable))
    rows = rb.extend(TensorDict({"r": torch.tensor([3.0, 1.0, 2.0, 5.0])}, [4]))
    assert rows[1] == -1 and sorted(rows[rows >= 0].tolist()) == [0, 1, 2]  # 1.0: not kept
    assert sorted(float(td["r"]) for td in rb[:]) == [2.0, 3.0, 5.0]
    rb = ReplayBuffer(storage=ListStorage(3), writer=RoundRobinWriter(compilable=compilable))
    assert rb.extend([1, 2, 3, 4]).tolist() == [0, 1, 2, 0]
    assert rb[:] == [4, 2, 3]


@pytest.mark.parametrize("data", [torch.zeros(3), {"r": torch.zeros(3)}])
def test_max_value_writer_refuses_non_tensordicts_as_torchrl(data):
    """TorchRL raises RuntimeError here: tdreplay's error is a TypeError and a RuntimeError."""
    rb = ReplayBuffer(storage=ListStorage(3), writer=TensorDictMaxValueWriter(rank_key="r"))
    for op in (rb.extend, rb.add):
        with pytest.raises(RuntimeError, match="tensor collection") as info:
            op(data)
        assert isinstance(info.value, TypeError)
    assert len(rb) == 0 and rb.write_count == 0
