"""The state of a buffer's transforms (Transform.has_state) in state_dict / dumps."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import CheckpointError, Compose, ListStorage, ReplayBuffer, Transform


class Count(Transform):
    has_state = True

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def forward(self, data):
        self.n += 1
        return data

    def state_dict(self):
        return {"n": torch.tensor(self.n)}

    def check_state_dict(self, state):
        if set(state) != {"n"} or not isinstance(state["n"], torch.Tensor):
            raise ValueError("Count state_dict must be {'n': tensor}")

    def load_state_dict(self, state):
        self.check_state_dict(state)
        self.n = int(state["n"])


def _rb(*transforms):
    rb = ReplayBuffer(storage=ListStorage(8), transform=Compose(*transforms))
    rb.extend([torch.tensor(i) for i in range(4)])
    return rb


def test_no_state_no_entry():
    rb = _rb(lambda x: x)
    assert "_transform" not in rb.state_dict()
    assert Transform().state_dict() == {} and Transform.has_state is False


def test_state_dict_round_trip_and_refusals():
    rb = _rb(lambda x: x, Count())
    rb.sample(2)
    state = rb.state_dict()
    assert {k: {n: int(v) for n, v in s.items()} for k, s in state["_transform"].items()} == \
        {"1:Count": {"n": 1}}
    rb2 = _rb(lambda x: x, Count())
    rb2.load_state_dict(state)
    assert rb2.transform[1].n == 1
    # refused before anything changes: missing, other transforms, a bad state
    for bad, match in [({k: v for k, v in state.items() if k != "_transform"}, "no saved state"),
                       ({**state, "_transform": {"0:Count": {"n": torch.tensor(5)}}}, "1:Count"),
                       ({**state, "_transform": {"1:Count": {"n": 5}}}, "Count state_dict")]:
        rb3 = _rb(lambda x: x, Count())
        with pytest.raises(ValueError, match=match):
            rb3.load_state_dict({**bad, "_writer": {"cursor": 0, "write_count": 0}})
        assert rb3.transform[1].n == 0 and rb3.write_count == 4


def test_dumps_loads(tmp_path):
    rb = _rb(Count())
    rb.sample(2)
    rb.sample(2)
    rb.dumps(tmp_path / "c")
    rb2 = _rb(Count())
    rb2.loads(tmp_path / "c")
    assert rb2.transform[0].n == 2
    plain = _rb()
    plain.dumps(tmp_path / "p")
    rb3 = _rb(Count())
    with pytest.raises(CheckpointError, match="transforms with state"):
        rb3.loads(tmp_path / "p")
    assert rb3.transform[0].n == 0
    plain.extend([torch.tensor(9)])
    with pytest.raises(CheckpointError, match="which this buffer does not have"):
        plain.loads(tmp_path / "c")  # its reads would differ from the saved buffer's
    assert len(plain) == 5 and int(plain[4]) == 9


def test_a_saved_transform_state_is_refused_by_a_buffer_without_one():
    rb = _rb(Count())
    rb.sample(2)
    plain = _rb()
    plain.extend([torch.tensor(9)])
    with pytest.raises(ValueError, match=r"state_dict\['_transform'\] holds the state of "
                                         r"transforms with state .*which this buffer does "
                                         r"not have"):
        plain.load_state_dict(rb.state_dict())
    assert len(plain) == 5 and int(plain[4]) == 9
