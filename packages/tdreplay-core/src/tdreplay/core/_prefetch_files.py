"""The batches a prefetching buffer drew ahead, in a checkpoint's snapshot.

``ReplayBuffer.dumps`` saves them beside the components (see :mod:`~tdreplay.core.prefetch`
for what is saved). Batches of tensors and plain TensorDicts (every tensor storage's samples,
with their info dicts) go to ``prefetch.pt``, written with ``torch.save`` as plain containers
of tensors and loaded with ``torch.load(weights_only=True)``: loading such a checkpoint runs
no pickled code. Anything else (a list storage's items, tensorclasses, lazy stacks) is pickled
to ``prefetch.pkl``, as a list storage's items are: load only checkpoints you trust.

Examples
--------
>>> import tempfile
>>> from pathlib import Path
>>> from tensordict import TensorDict
>>> state = {"version": 1, "capacity": 1, "batch_size": 2,
...          "queue": [(TensorDict({"a": torch.ones(2)}, [2]), {"index": torch.tensor([3, 0])})]}
>>> with tempfile.TemporaryDirectory() as d:
...     save_prefetched(Path(d), state)
...     files = sorted(p.name for p in Path(d).iterdir())
...     back = load_prefetched(Path(d))
>>> files, back["queue"][0][1]["index"].tolist(), back["queue"][0][0]["a"].tolist()
(['prefetch.pt'], [3, 0], [1.0, 1.0])
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from .checkpoint import CheckpointError, save_torch_file

__all__ = ["load_prefetched", "save_prefetched"]

#: the batches drawn ahead, as plain containers of tensors (``torch.load(weights_only=True)``)
TENSOR_FILE = "prefetch.pt"
#: the batches drawn ahead that hold other objects, pickled
PICKLE_FILE = "prefetch.pkl"
_SCALARS = (bool, int, float, str, type(None))


class _NotPlain(Exception):
    """A value that has no form of plain containers of tensors."""


def _encode(value: Any) -> Any:
    """``value`` as tagged plain containers (``torch.load(weights_only=True)`` reads them)."""
    if type(value) is torch.Tensor:
        return ("tensor", value)
    if type(value) is TensorDict:
        if any(name is not None for name in value.names):
            raise _NotPlain("named dims")
        device = None if value.device is None else str(value.device)
        return ("td", [[key, _encode(item)] for key, item in value.items()],
                list(value.batch_size), device)
    if type(value) in (list, tuple):
        return (type(value).__name__, [_encode(item) for item in value])
    if type(value) is dict:
        return ("dict", [[key, _encode(item)] for key, item in value.items()])
    if isinstance(value, _SCALARS):
        return ("value", value)
    raise _NotPlain(type(value).__name__)


def _decode(value: Any) -> Any:
    tag = value[0]
    if tag == "tensor" or tag == "value":
        return value[1]
    if tag == "td":
        _, entries, batch_size, device = value
        return TensorDict({key: _decode(item) for key, item in entries},
                          batch_size=batch_size, device=device)
    if tag == "list":
        return [_decode(item) for item in value[1]]
    if tag == "tuple":
        return tuple(_decode(item) for item in value[1])
    if tag == "dict":
        return {key: _decode(item) for key, item in value[1]}
    raise ValueError(f"unknown entry tag {tag!r}")


def save_prefetched(snapshot: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (:meth:`~tdreplay.core.prefetch.Prefetcher.export`) into ``snapshot``:
    nothing when no batch was drawn ahead, ``prefetch.pt`` when every batch is made of tensors
    and plain TensorDicts, else ``prefetch.pkl``."""
    if not state["queue"]:
        return
    try:
        encoded = _encode(state)
    except _NotPlain:
        with open(snapshot / PICKLE_FILE, "wb") as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
        return
    save_torch_file(encoded, snapshot / TENSOR_FILE)


def load_prefetched(snapshot: Path) -> dict[str, Any] | None:
    """The state :func:`save_prefetched` wrote into ``snapshot`` (``None`` when no batch was
    drawn ahead); :class:`~tdreplay.core.checkpoint.CheckpointError` when its file cannot be
    read back."""
    path = snapshot / TENSOR_FILE
    try:
        if path.is_file():
            state = _decode(torch.load(path, weights_only=True))
        else:
            path = snapshot / PICKLE_FILE
            if not path.is_file():
                return None
            with open(path, "rb") as f:
                state = pickle.load(f)  # documented: load trusted checkpoints only
    except Exception as err:  # any unreadable file is a damaged checkpoint
        raise CheckpointError(f"checkpoint file {str(path)!r} is unreadable: {err}") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint file {str(path)!r} does not hold a prefetch state.")
    return state
