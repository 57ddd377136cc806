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

__all__ = ["OFFLINE_SAMPLER_FILE", "check_offline_sampler_state", "load_offline_sampler_state",
           "offline_sampler_state", "read_offline_sampler_state", "write_offline_sampler_state"]

#: the file of a checkpoint's snapshot holding the offline sampler's state
OFFLINE_SAMPLER_FILE = "offline_sampler.pt"


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
