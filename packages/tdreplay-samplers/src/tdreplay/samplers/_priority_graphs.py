"""Draws and priority updates of CUDA trees, replayed from CUDA graphs.

On CUDA trees, a prioritized draw (:meth:`~._priority_kernels.TorchKernels.draw`) is about 12
small kernels and a priority update (:meth:`~._priority_kernels.TorchKernels.update`) about 35:
the two that decide which entries apply, the leaf writes, one refresh per tree level. At a batch
of 65,536 they run in ~0.1 ms on the device each, but launching them from Python takes several
times that: both are bound by the host. :class:`StateGraphs` records such a call once in a CUDA
graph and then replays it in one call, after copying the new inputs (uniforms and ``beta``;
indices, priorities and write generations) into the graph's input tensors, and hands back copies
of its outputs.

A graph holds, as constants, everything its kernels were launched with: the addresses and sizes
of the state's tensors, the inputs' sizes, the settings (``alpha``, ``eps``, the number of
written slots...). So a graph is recorded for one key of all of them and one state object (held
weakly: a graph whose state is gone is dropped), the second time a call with that key runs (the
first runs eagerly, and counts once it has succeeded: it also compiles the kernels, and a call
whose key never comes back, as while a buffer fills, is never recorded), and replayed while the
key is the same. A graph is never recorded while the stream is already being captured (in the
caller's own graph, the call runs eagerly into it), nor with ``TDREPLAY_CUDA_GRAPHS=0`` set
(read at each call). Where recording fails, the call runs eagerly and graphs stay off on that
device (with one warning).
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ._priority_state import PriorityState

__all__ = ["GraphBody", "StateGraphs"]

#: ``body(state, *inputs) -> outputs``: the eager call, as recorded and replayed (it must not
#: wait for the device, and must read nothing but the state, its inputs and its constants).
GraphBody = Callable[..., tuple[torch.Tensor, ...]]

#: An input of a recorded call: a tensor, a float (a 0-d float64 tensor in the graph, so that
#: a value that changes at every call, as an annealed ``beta``, needs no new graph), or ``None``.
Input = torch.Tensor | float | None

Key = tuple[object, ...]


@dataclass
class _Recorded:
    """A recorded call: its graph, the state it writes, the input tensors the graph reads and the
    output tensors it writes at each replay."""

    graph: torch.cuda.CUDAGraph
    owner: weakref.ref[PriorityState]
    inputs: list[torch.Tensor | None]
    outputs: tuple[torch.Tensor, ...]

    def replay(self, inputs: Sequence[Input]) -> tuple[torch.Tensor, ...]:
        """Replay the graph on ``inputs`` (of the key it was recorded for): copies of its
        outputs."""
        for static, given in zip(self.inputs, inputs):
            if isinstance(given, torch.Tensor):
                static.copy_(given, non_blocking=True)  # type: ignore[union-attr]
            elif given is not None:
                static.fill_(given)  # type: ignore[union-attr]  # no copy from the host
        self.graph.replay()
        return tuple(out.clone() for out in self.outputs)


class StateGraphs:
    """Recorded calls on CUDA priority states, by key (at most ``size`` graphs, the least
    recently replayed dropped first; see the module docstring). Safe to share between threads:
    its bookkeeping is locked (two threads may record the same key at once: one graph is kept).

    Examples
    --------
    >>> graphs = StateGraphs()
    >>> graphs.serves(torch.device("cpu"))  # host states run eagerly
    False
    """

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._graphs: OrderedDict[Key, _Recorded] = OrderedDict()
        self._seen: OrderedDict[Key, None] = OrderedDict()
        self._failed: set[torch.device] = set()
        self._lock = threading.Lock()

    def serves(self, device: torch.device) -> bool:
        """Whether calls on ``device`` may be replayed from graphs."""
        return (device.type == "cuda" and device not in self._failed
                and os.environ.get("TDREPLAY_CUDA_GRAPHS", "1") != "0")

    def call(self, body: GraphBody, state: PriorityState, inputs: Sequence[Input],
             constants: tuple[object, ...]) -> tuple[torch.Tensor, ...]:
        """``body(state, *inputs)``: through :meth:`run` where the state's device is served
        (:meth:`serves`; there the call is bound by its kernel launches), else eagerly."""
        if self.serves(state.device):
            return self.run(body, state, inputs, constants)
        return body(state, *inputs)

    def run(self, body: GraphBody, state: PriorityState, inputs: Sequence[Input],
            constants: tuple[object, ...]) -> tuple[torch.Tensor, ...]:
        """``body(state, *inputs)``: replayed from its graph where one is recorded for this key
        (``inputs``: contiguous tensors on the state's device, floats, or ``None``;
        ``constants``: the other values ``body`` reads, which the key must hold), recorded now if
        the key ran once before, else run eagerly. Returns ``body``'s outputs (copies, from a
        graph)."""
        key = _key(state, inputs, constants)
        recorded, seen = self._lookup(key, state)
        if (recorded is None and seen and state.device not in self._failed
                and not _capturing(state.device)):
            recorded = self._record(key, body, state, inputs)
        if recorded is None:
            outputs = body(state, *inputs)
            self._remember(key)  # after it ran: a call that raises is never recorded
            return outputs
        return recorded.replay(inputs)

    def _lookup(self, key: Key, state: PriorityState) -> tuple[_Recorded | None, bool]:
        """The graph recorded for ``key`` on ``state`` (now the most recently used), and
        whether the key ran before."""
        with self._lock:
            recorded = self._graphs.get(key)
            if recorded is not None and recorded.owner() is not state:  # that id's state died
                del self._graphs[key]
                recorded = None
            if recorded is not None:
                self._graphs.move_to_end(key)
            return recorded, key in self._seen

    def _remember(self, key: Key) -> None:
        with self._lock:
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > 4 * self._size:
                self._seen.popitem(last=False)

    def _record(self, key: Key, body: GraphBody, state: PriorityState,
                inputs: Sequence[Input]) -> _Recorded | None:
        """Record ``body`` on tensors shaped as ``inputs`` (nothing runs: the caller replays
        it), or ``None`` where recording failed (graphs are then off on the state's device)."""
        device = state.device
        try:
            graph = torch.cuda.CUDAGraph()
            static = [torch.empty_like(given) if isinstance(given, torch.Tensor) else
                      None if given is None else
                      torch.empty((), dtype=torch.float64, device=device) for given in inputs]
            with torch.cuda.device(device):
                stream = torch.cuda.Stream(device)
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    graph.capture_begin(capture_error_mode="thread_local")
                    try:
                        outputs = body(state, *static)
                    finally:
                        graph.capture_end()
                torch.cuda.current_stream(device).wait_stream(stream)
        except Exception as err:  # the call cannot be recorded here: eager from now on
            with self._lock:
                self._failed.add(device)
            warnings.warn(f"recording a prioritized sampler's call in a CUDA graph failed on "
                          f"{device} ({type(err).__name__}: {err}); its calls there run "
                          f"eagerly", RuntimeWarning, stacklevel=5)
            return None
        recorded = _Recorded(graph, weakref.ref(state), static, outputs)
        with self._lock:
            self._graphs[key] = recorded
            while len(self._graphs) > self._size:
                self._graphs.popitem(last=False)
        return recorded


def _capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is being captured (by the caller's own graph)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _key(state: PriorityState, inputs: Sequence[Input], constants: tuple[object, ...]) -> Key:
    """What a recorded call holds as constants: the state (its id; the owner check tells a
    state that reuses the id of a dead one), where its tensors are, the inputs' sizes and
    dtypes, and ``constants``."""
    nodes = [state.sum_tree.nodes, state.min_tree.nodes]
    if state.max_tree is not None:
        nodes.append(state.max_tree.nodes)
    tensors = [t for t in nodes if isinstance(t, torch.Tensor)]  # all of them on CUDA
    tensors += [state.generation, state.max_priority]
    return (id(state), *((t.data_ptr(), t.numel()) for t in tensors),
            *((t.shape, t.dtype) if isinstance(t, torch.Tensor) else t is None for t in inputs),
            *constants)
