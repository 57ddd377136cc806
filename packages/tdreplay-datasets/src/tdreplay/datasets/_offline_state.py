"""The offline dataset's sampler state in the checkpoints of an
:class:`~.offline_to_online.OfflineToOnlineReplayBuffer`: the dataset's rows are immutable and
not saved, but its sampler changes as training draws from it (a without-replacement epoch,
priorities updated on dataset rows), so a restored buffer goes on drawing as the saved one
would only with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tdreplay.core import CheckpointError, ReplayBuffer
from tdreplay.core.checkpoint import load_torch_file, save_torch_file

__all__ = ["OFFLINE_SAMPLER_FILE", "check_offline_dataset", "check_offline_sampler_state",
           "load_offline_sampler_state", "offline_dataset_identity", "offline_sampler_state",
           "read_offline_sampler_state", "write_offline_sampler_state"]

#: the file of a checkpoint's snapshot holding the offline sampler's state
OFFLINE_SAMPLER_FILE = "offline_sampler.pt"


def offline_dataset_identity(offline: Any) -> dict[str, Any]:
    """What a checkpoint records of the offline dataset it was saved over: its ``dataset_id``
    (``None`` for a buffer without one) and its number of rows.

    >>> from tdreplay.core import ListStorage
    >>> offline = ReplayBuffer(storage=ListStorage(4))
    >>> _ = offline.extend([0, 1, 2])
    >>> offline_dataset_identity(offline)
    {'dataset_id': None, 'rows': 3}
    """
    dataset_id = getattr(offline, "dataset_id", None)
    return {"dataset_id": dataset_id if isinstance(dataset_id, str) else None,
            "rows": len(offline)}


def _described(identity: dict[str, Any]) -> str:
    """``'<dataset_id>' (<rows> rows)``, or ``one without a dataset_id (<rows> rows)``."""
    name = "one without a dataset_id" if identity["dataset_id"] is None \
        else repr(identity["dataset_id"])
    return f"{name} ({identity['rows']} rows)"


def check_offline_dataset(offline: Any, saved: Any) -> None:
    """``ValueError`` unless ``saved`` (a checkpoint's :func:`offline_dataset_identity`) is
    that of ``offline``: the same number of rows and, when both have one, the same
    ``dataset_id``. The offline sampler's state (a without-replacement epoch, priorities)
    describes the rows of the dataset it was saved over; a sampler would take that of a
    smaller dataset, or drop it without a word. ``None`` (a state saved before the record
    existed) passes. Changes nothing.

    >>> from tdreplay.core import ListStorage
    >>> offline = ReplayBuffer(storage=ListStorage(4))
    >>> _ = offline.extend([0, 1, 2])
    >>> check_offline_dataset(offline, {"dataset_id": None, "rows": 3})
    >>> check_offline_dataset(offline, {"dataset_id": "box/t-v0", "rows": 16})
    Traceback (most recent call last):
    ...
    ValueError: the state was saved over the offline dataset 'box/t-v0' (16 rows), but this \
buffer's offline dataset is one without a dataset_id (3 rows): the offline sampler's state (an \
epoch, priorities) belongs to the rows of the dataset it was saved over.
    """
    if saved is None:
        return
    rows, dataset_id = (saved.get("rows"), saved.get("dataset_id")) \
        if isinstance(saved, dict) else (None, None)
    if not isinstance(saved, dict) or isinstance(rows, bool) or not isinstance(rows, int) \
            or rows < 0 or not (dataset_id is None or isinstance(dataset_id, str)):
        raise ValueError(f"the record of the offline dataset the state was saved over is "
                         f"damaged: {saved!r} is not a dict of 'dataset_id' (a str or None) "
                         "and 'rows' (a count).")
    current = offline_dataset_identity(offline)
    if rows != current["rows"] or None not in (dataset_id, current["dataset_id"]) \
            and dataset_id != current["dataset_id"]:
        raise ValueError(
            "the state was saved over the offline dataset "
            f"{_described({'dataset_id': dataset_id, 'rows': rows})}, but this buffer's offline "
            f"dataset is {_described(current)}: the offline sampler's "
            "state (an epoch, priorities) belongs to the rows of the dataset it was saved over.")


def offline_sampler_state(offline: Any) -> dict[str, Any] | None:
    """The state of the offline dataset's sampler, read under its lock; ``None`` for an
    offline dataset that is not a replay buffer (nothing to save).

    >>> from tdreplay.core import ListStorage, SamplerWithoutReplacement
    >>> offline = ReplayBuffer(storage=ListStorage(4), sampler=SamplerWithoutReplacement())
    >>> _ = offline.extend([0, 1, 2, 3])
    >>> _ = offline.sample(2)
    >>> sorted(offline_sampler_state(offline))
    ['has_perm', 'perm', 'pos', 'ran_out']
    """
    if not isinstance(offline, ReplayBuffer):
        return None
    with offline.locked():
        return offline.sampler.state_dict()


def check_offline_sampler_state(offline: Any, state: dict[str, Any]) -> None:
    """``ValueError`` unless the offline dataset's sampler can load ``state`` over the rows
    the dataset holds (every check its ``load_state_dict`` makes); changes nothing."""
    if not isinstance(offline, ReplayBuffer):
        raise ValueError(f"the offline sampler's state cannot be restored into an offline "
                         f"dataset that is not a replay buffer ({type(offline).__name__}).")
    sampler = offline.sampler
    try:
        sampler.check_state_dict(state)
        sampler.check_saved_slots(state, len(offline.storage))
    except (TypeError, KeyError, ValueError) as err:
        raise ValueError(f"the offline sampler's state does not fit the offline dataset's "
                         f"{type(sampler).__name__}: {err}") from err


def load_offline_sampler_state(offline: Any, state: dict[str, Any]) -> None:
    """Restore ``state`` (checked by :func:`check_offline_sampler_state`) into the offline
    dataset's sampler, under its lock."""
    with offline.locked():
        offline.sampler.load_state_dict(state)


def write_offline_sampler_state(snapshot: Path, offline: Any) -> bool:
    """Write the offline sampler's state into ``snapshot``; whether there was one."""
    state = offline_sampler_state(offline)
    if state is None:
        return False
    save_torch_file(state, snapshot / OFFLINE_SAMPLER_FILE, what="the offline sampler's state")
    return True


def read_offline_sampler_state(snapshot: Path, offline: Any) -> dict[str, Any]:
    """Read and check the offline sampler's state a snapshot holds (``CheckpointError`` naming
    the file when it is missing, unreadable or does not fit the dataset)."""
    path = snapshot / OFFLINE_SAMPLER_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} is missing (its "
                              "offline_to_online.json says the offline sampler was saved).")
    state = load_torch_file(path)
    try:
        if not isinstance(state, dict):
            raise ValueError(f"a dict was saved, got {type(state).__name__}")
        check_offline_sampler_state(offline, state)
    except ValueError as err:
        raise CheckpointError(f"checkpoint file {str(path)!r}: {err}") from err
    return state
