"""``Compose`` slicing: ``compose[a:b]`` is a new ``Compose`` of copies of those transforms, as
TorchRL's (which clones them), callable and usable in a buffer; an int index is the transform
itself."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import Compose, ListStorage, ReplayBuffer, TensorDictReplayBuffer, Transform


class Add(Transform):
    """Adds ``amount`` to ``x`` on sample; subtracts it on extend when ``inverse``."""

    def __init__(self, amount: float, inverse: bool = False) -> None:
        super().__init__(in_keys=["x"], in_keys_inv=["x"] if inverse else None)
        self.amount = amount

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value + self.amount

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value - self.amount


class Counter(Transform):
    """A transform with state: counts the samples it saw."""

    has_state = True

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, data):
        self.calls += 1
        return data

    def state_dict(self):
        return {"calls": self.calls}

    def check_state_dict(self, state):
        int(state["calls"])

    def load_state_dict(self, state):
        self.calls = state["calls"]


def _compose() -> Compose:
    return Compose(Add(1.0), Add(10.0), Add(100.0))


def _td() -> TensorDict:
    return TensorDict({"x": torch.zeros(3)}, [3])


@pytest.mark.parametrize("index, amounts", [
    (slice(1, None), [10.0, 100.0]),
    (slice(None, -1), [1.0, 10.0]),
    (slice(None, None, 2), [1.0, 100.0]),
    (slice(None, None, -1), [100.0, 10.0, 1.0]),
    (slice(5, None), []),
])
def test_slice_is_a_compose_of_those_transforms(index, amounts):
    c = _compose()
    part = c[index]
    assert type(part) is Compose
    assert [t.amount for t in part] == amounts
    assert all(type(t) is Add for t in part)
    out = part(_td())
    assert out["x"].tolist() == [sum(amounts)] * 3
    assert len(c) == 3  # the original is untouched
    assert [t.amount for t in c] == [1.0, 10.0, 100.0]


def test_int_index_is_the_transform_itself():
    c = _compose()
    assert c[1] is c.transforms[1]
    assert c[-1] is c.transforms[2]
    with pytest.raises(IndexError):
        c[3]


def test_slice_holds_copies_with_independent_state():
    counter = Counter()
    c = Compose(Add(1.0), counter)
    tail = c[1:]
    assert tail[0] is not counter and type(tail[0]) is Counter
    tail(_td())
    tail(_td())
    assert tail[0].calls == 2 and counter.calls == 0
    assert tail.state_dict() == {"0:Counter": {"calls": 2}}
    assert c.state_dict() == {"1:Counter": {"calls": 0}}
    # editing the slice does not edit the original, and the reverse
    tail.append(Add(5.0))
    assert len(c) == 2 and len(tail) == 2


def test_slice_in_a_buffer_read_and_write_side():
    c = _compose()
    rb = TensorDictReplayBuffer(storage=ListStorage(10), transform=c[1:], batch_size=3)
    rb.extend(_td())
    assert rb.sample()["x"].tolist() == [110.0] * 3
    # as transform=, the slice's inverses run on extend (in reverse order), its forwards on sample
    c = Compose(Add(1.0, inverse=True), Add(10.0, inverse=True), Add(100.0, inverse=True))
    rb2 = TensorDictReplayBuffer(storage=ListStorage(10), transform=c[:2], batch_size=3)
    rb2.extend(_td())
    assert torch.stack(list(rb2.storage[:3]))["x"].tolist() == [-11.0] * 3
    assert rb2.sample()["x"].tolist() == [0.0] * 3
    # append_transform(invert=True): the slice's forward runs on extend
    rb3 = ReplayBuffer(storage=ListStorage(10), batch_size=3)
    rb3.append_transform(_compose()[:2], invert=True)
    rb3.extend(_td())
    assert torch.stack(list(rb3.storage[:3]))["x"].tolist() == [11.0] * 3
