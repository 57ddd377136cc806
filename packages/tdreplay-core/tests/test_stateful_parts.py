"""Extra stateful parts (``register_stateful``): saved and restored with the buffer's state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tdreplay.core import CheckpointError, ListStorage, ReplayBuffer


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "t": torch.tensor([float(self.n)])}

    def check_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state.get("n"), int) or state["n"] < 0:
            raise ValueError(f"n must be an int >= 0, got {state.get('n')!r}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state_dict(state)
        self.n = state["n"]


def _rb(counter: Counter | None = None) -> ReplayBuffer:
    rb = ReplayBuffer(storage=ListStorage(8))
    rb.extend([1, 2, 3])
    if counter is not None:
        rb.register_stateful("counter", counter)
    return rb


def test_state_dict_round_trip() -> None:
    src, c1 = Counter(), Counter()
    rb = _rb(src)
    src.n = 4
    state = rb.state_dict()
    assert state["_stateful"]["counter"]["n"] == 4
    rb2 = _rb(c1)
    rb2.load_state_dict(state)
    assert c1.n == 4


def test_no_part_no_entry() -> None:
    assert "_stateful" not in _rb().state_dict()


def test_dumps_loads_round_trip(tmp_path: Path) -> None:
    src, dst = Counter(), Counter()
    rb = _rb(src)
    src.n = 9
    rb.dumps(tmp_path)
    rb2 = ReplayBuffer(storage=ListStorage(8))
    rb2.register_stateful("counter", dst)
    rb2.loads(tmp_path)
    assert dst.n == 9 and rb2[:] == [1, 2, 3]


def test_missing_state_refused_buffer_unchanged(tmp_path: Path) -> None:
    _rb().dumps(tmp_path)                       # saved without the part
    c = Counter()
    c.n = 2
    rb = ReplayBuffer(storage=ListStorage(8))
    rb.register_stateful("counter", c)
    with pytest.raises(CheckpointError, match="'counter'"):
        rb.loads(tmp_path)
    assert len(rb) == 0 and c.n == 2
    with pytest.raises(ValueError, match="'counter'"):
        rb.load_state_dict(_rb().state_dict())
    assert len(rb) == 0 and c.n == 2


class Optional(Counter):
    missing_ok = True  # (a part added after checkpoints were written without it)


def test_a_part_that_may_be_missing_is_left_as_it_is(tmp_path: Path) -> None:
    old = _rb()  # saved without the part
    old.dumps(tmp_path)
    part = Optional()
    part.n = 2
    rb = ReplayBuffer(storage=ListStorage(8))
    rb.register_stateful("counter", part)
    rb.loads(tmp_path)
    assert rb[:] == [1, 2, 3] and part.n == 2
    rb.load_state_dict(old.state_dict())
    assert rb[:] == [1, 2, 3] and part.n == 2
    saved = Optional()
    saved.n = 5
    rb.load_state_dict(_rb(saved).state_dict())  # a state that holds it: restored, checked
    assert part.n == 5
    bad = _rb(saved).state_dict()
    bad["_stateful"]["counter"]["n"] = -1
    with pytest.raises(ValueError, match="counter.*n must be"):
        rb.load_state_dict(bad)
    assert part.n == 5


def test_bad_state_refused_before_anything_changes() -> None:
    state = _rb(Counter()).state_dict()
    state["_stateful"]["counter"]["n"] = -1
    c = Counter()
    rb = ReplayBuffer(storage=ListStorage(8))
    rb.register_stateful("counter", c)
    with pytest.raises(ValueError, match="_stateful.*counter.*n must be"):
        rb.load_state_dict(state)
    assert len(rb) == 0 and c.n == 0


def test_saved_parts_not_registered_are_ignored(tmp_path: Path) -> None:
    rb = _rb(Counter())
    rb.dumps(tmp_path)
    plain = ReplayBuffer(storage=ListStorage(8))
    plain.loads(tmp_path)
    plain.load_state_dict(rb.state_dict())
    assert plain[:] == [1, 2, 3]


def test_register_checks_and_unregister() -> None:
    rb = _rb()
    with pytest.raises(ValueError, match="name"):
        rb.register_stateful("../x", Counter())
    with pytest.raises(TypeError, match="state_dict"):
        rb.register_stateful("x", object())  # type: ignore[arg-type]
    rb.register_stateful("x", Counter())
    rb.register_stateful("x", None)
    assert "_stateful" not in rb.state_dict()
