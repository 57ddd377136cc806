"""Boolean arguments of the writers take a bool (or a numpy bool) and nothing else: ``"yes"``,
``1``, ``"False"`` (truthy in TorchRL) or ``None`` raise a ``TypeError`` naming the argument
before anything changes (``empty`` leaves the rows, the heap and the write count)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, TensorDictReplayBuffer, testing
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.writers import (
    ImmutableDatasetWriter,
    TensorDictMaxValueWriter,
    TensorDictRoundRobinWriter,
)

BAD = testing.NOT_BOOLS
GOOD = testing.BOOLS

CONSTRUCTORS: list[tuple[str, Callable[..., Any], str, Callable[[Any], Any]]] = [
    ("TensorDictRoundRobinWriter", TensorDictRoundRobinWriter, "compilable",
     lambda w: w.compilable),
    ("TensorDictRoundRobinWriter", TensorDictRoundRobinWriter, "track_generations",
     lambda w: w.tracks_generations),
    ("TensorDictMaxValueWriter", lambda **kw: TensorDictMaxValueWriter(rank_key="r", **kw),
     "compilable", lambda w: w.compilable),
    ("ImmutableDatasetWriter", ImmutableDatasetWriter, "compilable", lambda w: w.compilable),
]
IDS = [f"{c[0]}-{c[2]}" for c in CONSTRUCTORS]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("owner, build, name, read", CONSTRUCTORS, ids=IDS)
def test_constructors_refuse_a_flag_that_is_not_a_bool(owner, build, name, read, value):
    testing.assert_flag_refused(build, name, value)


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("owner, build, name, read", CONSTRUCTORS, ids=IDS)
def test_constructors_take_bools_and_numpy_bools(owner, build, name, read, value):
    testing.assert_flag_taken(build, name, value, read)


def filled(writer: Any) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=ListStorage(4), writer=writer, batch_size=2)
    rb.extend(TensorDict({"r": torch.tensor([3.0, 1.0, 2.0, 5.0, 4.0])}, [5]))
    return rb


WRITERS = [("round_robin", TensorDictRoundRobinWriter),
           ("max_value", lambda: TensorDictMaxValueWriter(rank_key="r"))]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("kind, make", WRITERS, ids=[w[0] for w in WRITERS])
def test_empty_refuses_a_flag_that_is_not_a_bool(kind, make, value):
    rb = filled(make())
    before = buffer_snapshot(rb)
    with pytest.raises(TypeError, match="empty_write_count must be a bool, got"):
        rb.writer.empty(value)
    with pytest.raises(TypeError, match="empty_write_count must be a bool, got"):
        rb.empty(value)
    assert_same(buffer_snapshot(rb), before, "buffer state")


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("kind, make", WRITERS, ids=[w[0] for w in WRITERS])
def test_empty_takes_bools_and_numpy_bools(kind, make, value):
    rb = filled(make())
    count = rb.write_count
    rb.empty(value)
    assert len(rb) == 0 and rb.write_count == (0 if value else count)
