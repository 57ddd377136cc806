"""The bookkeeping of ``StateGraphs`` (which calls run eagerly, when a recording is tried, what a
failed one does), on the host: recording itself needs CUDA, and fails here as it would on a
device without graphs. The recorded and replayed calls are checked on a GPU in
``test_prioritized_cuda.py``."""

from __future__ import annotations

import warnings

import pytest
import torch

from tdreplay.samplers._priority_graphs import StateGraphs
from tdreplay.samplers._priority_state import new_state

CPU = torch.device("cpu")


@pytest.fixture
def state():
    return new_state(8, "torch", CPU, within_buffer=False)


def scaled(calls: list[float]):
    """A body that records the scale it was called with and returns ``x * scale``."""

    def body(state, x, scale):
        calls.append(scale)
        return (x * scale,)

    return body


def test_the_first_call_of_a_key_runs_eagerly_without_recording(state):
    graphs, calls = StateGraphs(), []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recording tried: no warning
        outs = [graphs.run(scaled(calls), state, (torch.arange(3.0), 2.0), (k,))
                for k in ("a", "b", "c")]  # a new key each time
    assert calls == [2.0, 2.0, 2.0]
    assert all(out[0].tolist() == [0.0, 2.0, 4.0] for out in outs)


def test_a_failed_recording_warns_once_and_every_call_still_runs(state):
    graphs, calls = StateGraphs(), []
    body, x = scaled(calls), torch.arange(4.0)
    first = graphs.run(body, state, (x, 2.0), ("k",))
    assert graphs.serves(CPU) is False
    with pytest.warns(RuntimeWarning, match="CUDA graph failed on cpu"):
        second = graphs.run(body, state, (x, 3.0), ("k",))  # the key ran once: recording
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # graphs are off on that device now: no second try
        third = graphs.run(body, state, (x, 4.0), ("k",))
    assert calls == [2.0, 3.0, 4.0]  # each call ran, with its own inputs
    assert [out[0].tolist() for out in (first, second, third)] == [
        [0.0, 2.0, 4.0, 6.0], [0.0, 3.0, 6.0, 9.0], [0.0, 4.0, 8.0, 12.0]]


def test_a_call_that_raises_does_not_count_as_run(state):
    graphs = StateGraphs()

    def refusing(state, x):
        raise ValueError("bad input")

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # never a recording: its key was never seen to succeed
        for _ in range(3):
            with pytest.raises(ValueError, match="bad input"):
                graphs.run(refusing, state, (torch.zeros(2),), ())


def test_serves_cuda_devices_unless_switched_off(monkeypatch):
    graphs = StateGraphs()
    assert graphs.serves(torch.device("cuda", 0))
    monkeypatch.setenv("TDREPLAY_CUDA_GRAPHS", "0")
    assert not graphs.serves(torch.device("cuda", 0))
    monkeypatch.setenv("TDREPLAY_CUDA_GRAPHS", "1")
    assert graphs.serves(torch.device("cuda", 0)) and not graphs.serves(CPU)


def test_call_runs_a_host_state_eagerly_and_never_records(state):
    graphs, calls = StateGraphs(), []
    body, x = scaled(calls), torch.arange(3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not served: no recording tried, no warning
        outs = [graphs.call(body, state, (x, float(k)), ("k",)) for k in (2, 3, 4)]
    assert calls == [2.0, 3.0, 4.0]
    assert [out[0].tolist() for out in outs] == [[0.0, 2.0, 4.0], [0.0, 3.0, 6.0],
                                                 [0.0, 4.0, 8.0]]
