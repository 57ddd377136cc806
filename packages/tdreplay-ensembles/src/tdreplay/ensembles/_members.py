"""What the three component ensembles share: member selection, state dicts and checkpoints.

An ensemble (of storages, samplers or writers) holds one member per buffer. Indexing it with
an int returns that member; with a slice, a sequence or a 1-D integer tensor it returns a new
ensemble of the selected members. Its state dict is ``{"0": state_of_member_0, ...}`` and its
checkpoint directory holds ``ensemble.json`` plus one sub-directory per member (``0/``,
``1/``, ...) written by that member's own ``dumps``. It may go to another process only if
every member may (:class:`MembersShareable`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection

from tdreplay.core import NotShareableError
from tdreplay.core.checkpoint import CheckpointError, read_json, write_json
from tdreplay.core.process_sharing import SpawnChecked

from ._repeated_members import check_repeated_entries, check_repeated_record, repeat_record
from .routing import check_member_ids

ENSEMBLE_FILE = "ensemble.json"


def naming_member(err: Exception, member: str) -> Exception:
    """``err`` again, of its own type, its message led by ``member`` (e.g. ``"SamplerEnsemble
    member 2"``), so an ensemble's error says which member refused; ``err`` itself when its
    type cannot be built from a message alone. Callers raise it ``from err``.

    >>> naming_member(ValueError("priorities hold NaN."), "SamplerEnsemble member 2")
    ValueError('SamplerEnsemble member 2: priorities hold NaN.')
    """
    try:
        return type(err)(f"{member}: {err}")
    except Exception:  # (an exception class taking other arguments)
        return err


def _some(positions: list[int], index: Any, n: int, kind: str) -> list[int]:
    """``positions``, unless ``index`` selected none (``IndexError``: an ensemble of no member
    would hold nothing to read or sample)."""
    if not positions:
        raise IndexError(f"index {index!r} selects none of the {n} {kind}: a smaller ensemble "
                         "needs at least one.")
    return positions


def select_members(index: Any, n: int, kind: str) -> int | list[int]:
    """Resolve ``index`` against ``n`` members: an int position, or a list of positions.

    Ints (negative ones count from the end) select one member; slices, sequences of ints,
    ranges, numpy arrays and 1-D integer tensors select several (in the order given).

    Examples
    --------
    >>> select_members(-1, 3, "buffers"), select_members(slice(1, None), 3, "buffers")
    (2, [1, 2])
    """
    if isinstance(index, bool) or isinstance(index, np.bool_):
        raise TypeError(f"cannot index {kind} with a bool.")
    if isinstance(index, torch.Tensor) and index.ndim == 0:
        if index.is_floating_point() or index.dtype is torch.bool:
            raise TypeError(f"{kind} are indexed by integers, got a tensor of dtype {index.dtype}.")
        index = int(index)
    if isinstance(index, (int, np.integer)):
        return select_one(int(index), n, kind)
    if isinstance(index, slice):
        return _some(list(range(n))[index], index, n, kind)
    if isinstance(index, torch.Tensor):
        if index.ndim != 1 or index.is_floating_point() or index.dtype is torch.bool:
            raise TypeError(f"{kind} are indexed by a 1-D integer tensor, got a tensor of shape "
                            f"{tuple(index.shape)} and dtype {index.dtype}.")
        index = index.tolist()
    elif isinstance(index, np.ndarray):
        if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer):
            raise TypeError(f"{kind} are indexed by a 1-D integer array, got shape {index.shape} "
                            f"and dtype {index.dtype}.")
        index = index.tolist()
    if isinstance(index, (Sequence, range)) and not isinstance(index, (str, bytes)):
        positions = []
        for item in index:
            if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
                raise TypeError(f"{kind} are indexed by integers, got {item!r} in {index!r}.")
            positions.append(select_one(int(item), n, kind))
        return _some(positions, index, n, kind)
    raise TypeError(f"{kind} are indexed by an int, a slice, a sequence of ints or a 1-D integer "
                    f"tensor, got {type(index).__name__}.")


def select_one(position: int, n: int, kind: str) -> int:
    """Resolve the int ``position`` against ``n`` members (negative ones count from the end).

    Examples
    --------
    >>> select_one(-1, 3, "buffers")
    2
    """
    if not -n <= position < n:
        raise IndexError(f"index {position} is out of range for {n} {kind}.")
    return position % n


def part_member(ids: Any, position: int, members: int) -> int | None:
    """The member that part ``position`` of an ensemble index belongs to, from its
    ``buffer_ids`` (``None`` for an empty part, which names none): ``TypeError`` unless they
    are an integer tensor, ``IndexError`` for an id outside ``[0, members - 1]`` (never counted
    from the end: a negative id wrapping to the last member would route the part to the wrong
    buffer), ``ValueError`` for a part naming several members (``sample()["index"]`` draws each
    part from one). Each message names ``buffer_ids``.

    Examples
    --------
    >>> import torch
    >>> part_member(torch.tensor([1, 1]), 0, 2)
    1
    >>> part_member(torch.tensor([-1]), 0, 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    IndexError: buffer_ids of part 0 holds member ids [-1], outside [0, 1] (...).
    """
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"buffer_ids of part {position} must be a tensor of integer member ids, "
                        f"got {type(ids).__name__}.")
    flat = check_member_ids(ids.reshape(-1), members, f"buffer_ids of part {position}",
                            IndexError)
    if not flat.numel():
        return None
    first = int(flat[0])
    if bool((flat != first).any()):
        raise ValueError(f"buffer_ids of part {position} names several members "
                         f"{flat.unique().tolist()}; each part of an ensemble index comes from "
                         "one member (as sample()['index'] does).")
    return first


def index_parts(index: Any, expects: str) -> list[tuple[torch.Tensor, Any]]:
    """``(buffer_ids, slots)`` of each part of an ensemble index (one row per part).

    A dense TensorDict (what a ``SamplerEnsemble`` draws) is split entry by entry, without
    building one TensorDict per part; a lazy stack or a list is split into its part TensorDicts,
    each of which must hold ``"index"`` and ``"buffer_ids"`` (else ``TypeError(expects)``).
    """
    if isinstance(index, TensorDict) and index.batch_dims and "index" in index.keys() \
            and "buffer_ids" in index.keys():
        return list(zip(index.get("buffer_ids").unbind(0), index.get("index").unbind(0)))
    parts = list(index.unbind(0)) if is_tensor_collection(index) else list(index)
    for part in parts:
        if not is_tensor_collection(part) or "index" not in part.keys() \
                or "buffer_ids" not in part.keys():
            raise TypeError(expects)
    return [(part.get("buffer_ids"), part.get("index")) for part in parts]


def members_state_dict(members: Sequence[Any]) -> dict[str, Any]:
    """``{"0": members[0].state_dict(), ...}``."""
    return {str(i): member.state_dict() for i, member in enumerate(members)}


def check_members_state_dict(members: Sequence[Any], state_dict: Any, kind: str) -> None:
    """Raise ``ValueError`` unless ``state_dict`` has exactly one entry per member and each
    member's ``check_state_dict`` accepts its entry."""
    if not isinstance(state_dict, dict):
        raise ValueError(f"a {kind} state_dict must be a dict, got {type(state_dict).__name__}.")
    expected = {str(i) for i in range(len(members))}
    if set(state_dict) != expected:
        raise ValueError(f"{kind} state_dict must have one entry per member, keys "
                         f"{sorted(expected)}; got {sorted(map(str, state_dict))}.")
    for i, member in enumerate(members):
        try:
            member.check_state_dict(state_dict[str(i)])
        except (ValueError, TypeError, KeyError) as err:
            raise naming_member(err, f"{kind} member {i}") from err
    check_repeated_entries(members, state_dict, kind)  # (a member listed twice: one state)


def load_members_state_dict(members: Sequence[Any], state_dict: dict[str, Any], kind: str) -> None:
    """Check ``state_dict`` (:func:`check_members_state_dict`), then load each member's entry;
    if one fails, restore the members already loaded.

    Each member's state is taken just before it is loaded, so a failure leaves every member
    as it was.
    """
    check_members_state_dict(members, state_dict, kind)
    previous: list[tuple[Any, dict[str, Any]]] = []
    try:
        for i, member in enumerate(members):
            previous.append((member, member.state_dict()))
            try:
                member.load_state_dict(state_dict[str(i)])
            except (ValueError, TypeError, KeyError) as err:
                raise naming_member(err, f"{kind} member {i}") from err
    except BaseException:
        for member, state in reversed(previous):
            member.load_state_dict(state)
        raise


def dump_members(members: Sequence[Any], path: Path, kind: str) -> None:
    """Write ``ensemble.json`` and each member's own checkpoint into ``path/<i>``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / ENSEMBLE_FILE, {"kind": kind,
                                      "members": [type(m).__name__ for m in members],
                                      "same_as": repeat_record(members)})
    for i, member in enumerate(members):
        member.dumps(path / str(i))


def prepare_members(members: Sequence[Any], path: Path, kind: str) -> Callable[[], None]:
    """Read and check every member's checkpoint; return a function that installs them all.

    Nothing changes before the returned function runs: a checkpoint of another kind, with
    another number of members or other member classes, or one member's bad checkpoint raises
    :class:`~tdreplay.core.CheckpointError` first.
    """
    path = Path(path)
    meta = read_json(path / ENSEMBLE_FILE)
    if meta.get("kind") != kind:
        raise CheckpointError(f"checkpoint in {str(path)!r} holds a {meta.get('kind')}, "
                              f"expected a {kind}.")
    saved = list(meta.get("members", []))
    current = [type(m).__name__ for m in members]
    if len(saved) != len(current):
        raise CheckpointError(f"checkpoint {kind} has {len(saved)} members but this {kind} has "
                              f"{len(current)}.")
    for i, (was, now) in enumerate(zip(saved, current)):
        if was != now:
            raise CheckpointError(f"checkpoint {kind} member {i} is a {was}, but this {kind}'s "
                                  f"member {i} is a {now}.")
    check_repeated_record(members, meta.get("same_as"), repr(str(path)), kind)
    commits = [member.prepare_load(path / str(i)) for i, member in enumerate(members)]

    def commit() -> None:
        for install in commits:
            install()

    return commit


class MembersShareable(SpawnChecked):
    """``shareable`` and ``check_shareable`` of an ensemble, from its members.

    Mixed into the three component ensembles before their base (``Sampler``, ``Writer``,
    ``Storage``), which list their members in ``_sharing_members()``. The ensemble is
    shareable only if every member is: it holds no state of its own that another process would
    need to see, so a copy of it is the same ensemble exactly when its members' copies are the
    same members. ``check_shareable`` (run when the ensemble is pickled for a process being
    started, or a buffer holding it is shared) names the first member that is not (position
    and class) and gives that member's own message.

    Examples
    --------
    >>> from tdreplay.core import RandomSampler
    >>> class Pair(MembersShareable):
    ...     def __init__(self, *members): self.members = members
    ...     def _sharing_members(self): return self.members
    >>> class Trees(RandomSampler):
    ...     shareable = False
    >>> Pair(RandomSampler(), RandomSampler()).shareable, Pair(RandomSampler(), Trees()).shareable
    (True, False)
    >>> Pair(RandomSampler(), Trees()).check_shareable()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.core.process_sharing.NotShareableError: ...: its member 1 (Trees) cannot. Samplers ...
    """

    def _sharing_members(self) -> Sequence[SpawnChecked]:
        """The members whose sharing decides the ensemble's."""
        raise NotImplementedError

    @property
    def shareable(self) -> bool:
        """Whether another process may use the ensemble: whether it may use every member."""
        return all(member.shareable for member in self._sharing_members())

    @shareable.setter
    def shareable(self, value: bool) -> None:
        raise AttributeError(f"{type(self).__name__}.shareable follows its members and cannot be "
                             f"set: set it on a member.")

    def check_shareable(self) -> None:
        """:class:`~tdreplay.core.NotShareableError` naming the first member that cannot be
        shared (position and class) and giving its own message; nothing if every member can."""
        for position, member in enumerate(self._sharing_members()):
            try:
                member.check_shareable()
            except NotShareableError as err:
                raise NotShareableError(
                    f"{type(self)} cannot be shared between processes: its member {position} "
                    f"({type(member).__name__}) cannot. {err}") from err
