"""Boolean arguments take a bool (or a numpy bool) and nothing else: ``"yes"``, ``1``,
``"False"`` (a non-empty string, truthy) or ``None`` raise a ``TypeError`` naming the argument
before anything changes (TorchRL takes them as truthy). Arguments where ``None`` means "the
default" (``delayed_init``, ``update_priority``, ``include_info``) still take ``None``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import (
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tdreplay.core.buffer_conditional import UpdateQueue
from tdreplay.core.buffer_sharing import check_shared_flag
from tdreplay.core.utils import check_flag

BAD = ["yes", "False", 1, 0, 1.0, None, torch.tensor(True), [True]]
BAD_OR_NONE = ["yes", "False", 1, 0, torch.tensor(False)]  # None: the default
GOOD = [True, False, np.bool_(True), np.bool_(False)]


# ---- the helper -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", GOOD)
def test_check_flag_returns_a_python_bool(value):
    out = check_flag(value, "flag")
    assert type(out) is bool and out == bool(value)


@pytest.mark.parametrize("value", BAD)
def test_check_flag_names_the_argument_and_the_value(value):
    with pytest.raises(TypeError, match=rf"^my_flag must be a bool, got {type(value).__name__} "):
        check_flag(value, "my_flag")


def test_check_flag_allow_none():
    assert check_flag(None, "flag", allow_none=True) is None
    assert check_flag(np.bool_(True), "flag", allow_none=True) is True
    with pytest.raises(TypeError, match="flag must be a bool or None, got int"):
        check_flag(1, "flag", allow_none=True)


def test_check_shared_flag_is_check_flag():
    assert check_shared_flag(np.bool_(True)) is True
    with pytest.raises(TypeError, match=r"^shared must be a bool, got int \(1\)\.$"):
        check_shared_flag(1)


# ---- constructors ------------------------------------------------------------------------------
CONSTRUCTORS: list[tuple[str, Callable[..., Any], str, Callable[[Any], Any] | None]] = [
    # (id, build(**{name: value}), name, read back the flag (None: not kept as such))
    ("ReplayBuffer", ReplayBuffer, "pin_memory", lambda rb: rb._pin_memory),
    ("ReplayBuffer", ReplayBuffer, "compilable", lambda rb: rb.compilable),
    ("ReplayBuffer", ReplayBuffer, "shared", lambda rb: rb.shared),
    ("TensorDictReplayBuffer", TensorDictReplayBuffer, "pin_memory", lambda rb: rb._pin_memory),
    ("ListStorage", lambda **kw: ListStorage(4, **kw), "compilable", lambda s: s.compilable),
    ("RoundRobinWriter", RoundRobinWriter, "compilable", lambda w: w.compilable),
    ("RoundRobinWriter", RoundRobinWriter, "track_generations",
     lambda w: w.tracks_generations),
    ("SamplerWithoutReplacement", SamplerWithoutReplacement, "drop_last",
     lambda s: s.drop_last),
    ("SamplerWithoutReplacement", SamplerWithoutReplacement, "shuffle", lambda s: s.shuffle),
    ("RandomSampler", RandomSampler, "replacement", None),
]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("owner, build, name, read", CONSTRUCTORS,
                         ids=[f"{c[0]}-{c[2]}" for c in CONSTRUCTORS])
def test_constructors_refuse_a_flag_that_is_not_a_bool(owner, build, name, read, value):
    if value is None and (owner, name) == ("ReplayBuffer", "compilable"):
        assert build(**{name: value}).compilable is False  # TorchRL's default is None
        return
    with pytest.raises(TypeError, match=f"{name} must be a bool, got"):
        build(**{name: value})


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("owner, build, name, read", CONSTRUCTORS,
                         ids=[f"{c[0]}-{c[2]}" for c in CONSTRUCTORS])
def test_constructors_take_bools_and_numpy_bools(owner, build, name, read, value):
    if name == "compilable" and owner.endswith("Buffer") and value:
        kwargs = {name: value, "storage": ListStorage(4, compilable=True)}
    else:
        kwargs = {name: value}
    obj = build(**kwargs)
    if read is not None:
        assert type(read(obj)) is bool and read(obj) == bool(value)


@pytest.mark.parametrize("value", GOOD)
def test_random_sampler_replacement_dispatches_as_before(value):
    assert isinstance(RandomSampler(replacement=value), SamplerWithoutReplacement) \
        is (not value)


@pytest.mark.parametrize("value", BAD_OR_NONE)
def test_delayed_init_refuses_what_is_not_a_bool_or_none(value):
    with pytest.raises(TypeError, match="delayed_init must be a bool or None, got"):
        ReplayBuffer(storage=ListStorage(4), delayed_init=value)


@pytest.mark.parametrize("value, delayed", [(None, False), (True, True), (False, False),
                                            (np.bool_(True), True)])
def test_delayed_init_takes_bools_and_none(value, delayed):
    rb = ReplayBuffer(storage=ListStorage(4), delayed_init=value)
    assert rb.initialized is not delayed
    rb.extend([1, 2])
    assert len(rb) == 2


# ---- methods of a filled buffer: refused, the buffer unchanged ----------------------------------
def filled() -> ReplayBuffer:
    rb = ReplayBuffer(storage=ListStorage(10), batch_size=3)
    rb.extend(list(range(6)))
    return rb


def filled_td() -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=ListStorage(10), batch_size=3)
    rb.extend(TensorDict({"x": torch.arange(6.0)}, [6]))
    return rb


METHODS: list[tuple[str, Callable[[], Any], Callable[[Any, Any], Any], str]] = [
    ("sample", filled, lambda rb, v: rb.sample(return_info=v), "return_info"),
    ("td-sample", filled_td, lambda rb, v: rb.sample(return_info=v), "return_info"),
    ("empty", filled, lambda rb, v: rb.empty(v), "empty_write_count"),
    ("append_transform", filled, lambda rb, v: rb.append_transform(torch.neg, invert=v),
     "invert"),
    ("insert_transform", filled, lambda rb, v: rb.insert_transform(0, torch.neg, invert=v),
     "invert"),
    ("update_", filled_td,
     lambda rb, v: rb.update_(TensorDict({"x": torch.zeros(6)}, [6]), clone=v), "clone"),
    ("storage.set", filled, lambda rb, v: rb.storage.set(0, -1, set_cursor=v), "set_cursor"),
    ("writer.empty", filled, lambda rb, v: rb.writer.empty(v), "empty_write_count"),
    ("share", filled, lambda rb, v: rb.share(v), "shared"),
]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("case, make, call, name", METHODS, ids=[m[0] for m in METHODS])
def test_methods_refuse_a_flag_that_is_not_a_bool(unchanged, case, make, call, name, value):
    rb = make()
    torch.manual_seed(0)
    expected = rb.sample()
    with unchanged(rb), pytest.raises(TypeError, match=f"{name} must be a bool, got"):
        call(rb, value)
    torch.manual_seed(0)
    after = rb.sample()
    assert (after == expected) if isinstance(after, list) else bool((after == expected).all())
    assert len(rb) == 6 and rb.write_count == 6


@pytest.mark.parametrize("value", BAD_OR_NONE)
def test_td_extend_refuses_an_update_priority_that_is_not_a_bool_or_none(unchanged, value):
    rb = filled_td()
    with unchanged(rb), pytest.raises(TypeError, match="update_priority must be a bool or None"):
        rb.extend(TensorDict({"x": torch.ones(2)}, [2]), update_priority=value)


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False), None])
def test_td_extend_takes_update_priority_bools_and_none(value):
    rb = filled_td()
    rb.extend(TensorDict({"x": torch.ones(2)}, [2]), update_priority=value)
    assert len(rb) == 8


@pytest.mark.parametrize("value", BAD_OR_NONE)
def test_td_sample_refuses_an_include_info_that_is_not_a_bool_or_none(unchanged, value):
    rb = filled_td()
    with unchanged(rb), pytest.raises(TypeError, match="include_info must be a bool or None"):
        rb.sample(include_info=value)


@pytest.mark.parametrize("value", GOOD)
def test_methods_take_bools_and_numpy_bools(value):
    rb = filled()
    out = rb.sample(return_info=value)
    assert isinstance(out, tuple) is bool(value)
    rb.append_transform(torch.neg, invert=value)
    rb.insert_transform(0, torch.neg, invert=value)
    rb.storage.set(0, 0, set_cursor=value)
    assert rb.attach_info([1], {"index": [0]}, only_missing=value) == [1]
    rb.empty(value)
    assert len(rb) == 0 and rb.write_count == (0 if value else 6)
    td = filled_td()
    with pytest.warns(DeprecationWarning, match="include_info"):
        assert td.sample(include_info=value).shape == (3,)
    with pytest.raises(TypeError, match="update_ needs a TensorStorage"):  # (as before)
        td.update_(TensorDict({"x": torch.zeros(6)}, [6]), clone=value)


@pytest.mark.parametrize("value", BAD)
def test_update_queue_wait_refuses_a_raise_errors_that_is_not_a_bool(value):
    queue = UpdateQueue()
    with pytest.raises(TypeError, match="raise_errors must be a bool, got"):
        queue.wait(raise_errors=value)
    queue.wait(raise_errors=np.bool_(True))
