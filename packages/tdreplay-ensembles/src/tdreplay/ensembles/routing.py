"""Routed writes of a :class:`~tdreplay.ensembles.ReplayBufferEnsemble` (TorchRL 0.14.1's
``routing_key=`` / ``routing_dim=``): ``extend`` and ``add`` send each record to its member's
own ``extend`` (conditional updates of the handles they return: :mod:`.routed_updates`).

A write returns *handles*: a flat TensorDict with ``"buffer_ids"`` (the member of each
record), ``"index"`` (its slot in that member) and, when every member writer tracks
generations, ``"index_generation"``. A sample carries the same entries (``sample["index"]``
and ``sample["index_generation"]``), so either can be fed back to ``update_if_present``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict, TensorDictBase, unravel_key

from tdreplay.core import ReplayBuffer
from tdreplay.core.utils import ensure_tensordict

if TYPE_CHECKING:
    from tdreplay.core import Compose, Writer

__all__ = ["RoutedWritesMixin", "check_member_ids", "check_routing", "ensemble_handles",
           "is_integer_tensor", "member_groups", "refuse_write"]


def refuse_write(method: str, routable: bool = False) -> RuntimeError:
    """The error of a write to an ensemble that cannot take it (TorchRL raises
    ``RuntimeError`` too)."""
    hint = (" (or build the ensemble with routing_key= or routing_dim= to route each record "
            "to its buffer)") if routable else ""
    return RuntimeError(f"ReplayBufferEnsemble.{method}: an ensemble cannot be written to; "
                        f"write to one of its buffers instead, e.g. rb[0].{method}(...){hint}.")


def check_routing(routing_key: Any, routing_dim: Any) -> tuple[Any, int | None]:
    """``(routing_key unravelled, routing_dim)``, checked: at most one of them, a non-empty
    nested key, an int (not a bool).

    Examples
    --------
    >>> check_routing(("agent",), None), check_routing(None, -1)
    (('agent', None), (None, -1))
    >>> check_routing("agent", 0)
    Traceback (most recent call last):
    ...
    ValueError: routing_key and routing_dim are mutually exclusive: pass one of them.
    """
    if routing_key is not None and routing_dim is not None:
        raise ValueError("routing_key and routing_dim are mutually exclusive: pass one of them.")
    if routing_dim is not None and (isinstance(routing_dim, bool)
                                    or not isinstance(routing_dim, int)):
        raise TypeError(f"routing_dim must be an int (a batch dimension of the data), got "
                        f"{routing_dim!r}.")
    if routing_key is None:
        return None, routing_dim
    leaves = _leaves(routing_key) if isinstance(routing_key, (str, tuple)) else []
    if not leaves or not all(isinstance(leaf, str) and leaf for leaf in leaves):
        raise TypeError(f"routing_key must be a non-empty string or a tuple of them, got "
                        f"{routing_key!r}.")
    return unravel_key(routing_key), None


def _leaves(key: Any) -> list[Any]:
    """The strings of a nested key (``("a", ("b",))`` -> ``["a", "b"]``)."""
    if isinstance(key, tuple):
        return [leaf for part in key for leaf in _leaves(part)]
    return [key]


def is_integer_tensor(tensor: torch.Tensor) -> bool:
    return not (tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex())


def check_member_ids(ids: torch.Tensor, members: int, name: str,
                     out_of_range: type[Exception] = ValueError) -> torch.Tensor:
    """``ids`` as int64 member ids; ``TypeError`` for a non-integer dtype, ``out_of_range``
    for an id that names no member (never counted from the end), both naming ``name``."""
    if not is_integer_tensor(ids):
        raise TypeError(f"{name} must hold integer member ids, got dtype {ids.dtype}.")
    ids = ids.to(torch.long)
    bad = ids[(ids < 0) | (ids >= members)]
    if bad.numel():
        raise out_of_range(f"{name} holds member ids {bad.unique()[:5].tolist()}, outside "
                           f"[0, {members - 1}] (the ensemble has {members} buffers; ids "
                           "are not counted from the end).")
    return ids


def member_groups(ids: torch.Tensor, members: int) -> list[tuple[int, torch.Tensor]]:
    """``(member, positions)`` for each member named in the flat ``ids``, in member order; the
    positions of one member in their order in ``ids``."""
    ids = ids.cpu()
    order = ids.argsort(stable=True)
    counts = torch.bincount(ids, minlength=members).tolist()
    groups, start = [], 0
    for member, count in enumerate(counts):
        if count:
            groups.append((member, order[start:start + count]))
            start += count
    return groups


def ensemble_handles(index: Any, members: int, name: str = "index"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(buffer_ids, slots)`` of a TensorDict of ensemble handles (what a routed ``extend``
    returns, or ``sample["index"]``), checked: integer entries, ``"index"`` starting with the
    shape of ``"buffer_ids"``, every id naming one of ``members`` buffers.

    Examples
    --------
    >>> handles = TensorDict(buffer_ids=torch.tensor([1, 0]), index=torch.tensor([3, 3]))
    >>> [t.tolist() for t in ensemble_handles(handles, 2)]
    [[1, 0], [3, 3]]
    >>> ensemble_handles(handles, 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: index['buffer_ids'] holds member ids [1], outside [0, 0] ...
    """
    if not isinstance(index, TensorDictBase):
        raise TypeError(f"{name} must be a TensorDict of ensemble handles, with 'buffer_ids' and "
                        f"'index' entries (what a routed extend returns, or sample['index']), "
                        f"got {type(index).__name__}.")
    entries = {}
    for key in ("buffer_ids", "index"):
        value = index.get(key, None)
        if value is None:
            raise KeyError(f"{name} has no {key!r} entry: it must hold the handles a routed "
                           f"extend returns, or sample['index'].")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}[{key!r}] must be a tensor, got {type(value).__name__}.")
        entries[key] = value
    ids, slots = entries["buffer_ids"], entries["index"]
    if not is_integer_tensor(slots):
        raise TypeError(f"{name}['index'] must hold integer slots, got dtype {slots.dtype}.")
    if slots.shape[:ids.ndim] != ids.shape:
        raise ValueError(f"{name}['index'] has shape {tuple(slots.shape)}; it must start with "
                         f"the shape of {name}['buffer_ids'], {tuple(ids.shape)}.")
    return check_member_ids(ids, members, f"{name}['buffer_ids']"), slots.to(torch.long)


def _later_occurrences(slots: torch.Tensor) -> torch.Tensor:
    """For each position, how many later positions hold the same slot (a slot written twice
    by one ``extend``: its first record was overwritten by the second, one generation later).
    """
    order = slots.argsort(stable=True)
    _, counts = torch.unique_consecutive(slots[order], return_counts=True)
    starts = counts.cumsum(0) - counts
    rank = torch.arange(slots.numel()) - starts.repeat_interleave(counts)
    later = torch.empty_like(slots)
    later[order] = counts.repeat_interleave(counts) - 1 - rank
    return later


@dataclass(frozen=True)
class _Routed:
    """A checked routed write: the flat records, their member ids, and each member's share."""

    data: TensorDictBase
    buffer_ids: torch.Tensor
    groups: list[tuple[int, torch.Tensor]]


class RoutedWritesMixin:
    """``extend`` and ``add`` of :class:`~tdreplay.ensembles.ReplayBufferEnsemble` (mixed in
    before :class:`~tdreplay.core.ReplayBuffer`), and its ``routing_key`` / ``routing_dim``."""

    _rbs: tuple[ReplayBuffer, ...]
    _lock: AbstractContextManager[Any]
    _routing_key: Any = None
    _routing_dim: int | None = None

    if TYPE_CHECKING:  # what the ReplayBuffer this is mixed into provides
        @property
        def transform(self) -> Compose: ...
        @property
        def writer(self) -> Writer: ...

    @property
    def routing_key(self) -> Any:
        """The entry holding each record's member id (``None``: not routed by key)."""
        return self._routing_key

    @routing_key.setter
    def routing_key(self, value: Any) -> None:
        self._routing_key, _ = check_routing(value, self._routing_dim)

    @property
    def routing_dim(self) -> int | None:
        """The batch dimension whose entries are the members (``None``: not routed by dim)."""
        return self._routing_dim

    @routing_dim.setter
    def routing_dim(self, value: int | None) -> None:
        _, self._routing_dim = check_routing(self._routing_key, value)

    # ---- writes ---------------------------------------------------------------------------------
    def extend(self, data: TensorDictBase, *,
               update_priority: bool | None = None) -> TensorDictBase:
        """Write each record of ``data`` into its member's buffer; return the handles.

        The ensemble's write-side transforms run on ``data`` first, then it is flattened and
        each record goes to the member named by its ``routing_key`` entry (one integer id per
        record; trailing singleton dims are dropped) or by its position along
        ``routing_dim``. Each member gets its records, in their order, through its own
        ``extend`` (its transforms, writer, sampler and ``priority_key`` apply), members in
        ascending order, all under the ensemble's lock.

        Returns a TensorDict of batch ``[records]`` aligned with the flattened ``data``:
        ``"buffer_ids"`` and ``"index"`` (the slot in that member; ``-1`` for a record its
        writer did not keep), int64, plus ``"index_generation"`` (int64) when every member
        writer tracks generations; a record overwritten by a later one of the same call gets
        the older generation (its handle is already stale), as TorchRL's.

        Everything is checked before any member is written: a ``data`` that is not a
        TensorDict (:class:`~tdreplay.core.utils.NotATensorDictError`, a ``TypeError``), a
        missing ``routing_key`` entry (``KeyError``), non-integer ids (``TypeError``), ids
        naming no member, ids not one per record, a ``routing_dim`` out of range or not of the
        ensemble's size, a member storage that is not one-dimensional (``ValueError``),
        ``update_priority`` (``NotImplementedError``, as TorchRL). A member may still refuse
        its records in its own ``extend`` (e.g. entries its storage does not hold); that member
        and the later ones are then left as they were, the earlier ones keep their records,
        and the error names the members written (a note, Python >= 3.11).

        Without ``routing_key`` / ``routing_dim`` an ensemble is never written to
        (``RuntimeError``).

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import RoundRobinWriter, TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> from tdreplay.ensembles import ReplayBufferEnsemble
        >>> rb = ReplayBufferEnsemble(
        ...     *(TensorDictReplayBuffer(storage=LazyTensorStorage(4),
        ...                              writer=RoundRobinWriter(track_generations=True))
        ...       for _ in range(2)), routing_key="agent")
        >>> handles = rb.extend(TensorDict(obs=torch.arange(3.0),
        ...                                agent=torch.tensor([1, 0, 1]), batch_size=[3]))
        >>> handles["buffer_ids"].tolist(), handles["index"].tolist()
        ([1, 0, 1], [0, 0, 1])
        >>> handles["index_generation"].tolist(), rb[1][:]["obs"].tolist()
        ([0, 0, 0], [0.0, 2.0])
        """
        if self._routing_key is None and self._routing_dim is None:
            raise refuse_write("extend", routable=True)
        if update_priority is not None:
            raise NotImplementedError(
                "ReplayBufferEnsemble.extend: update_priority is not supported by routed writes "
                "(as TorchRL); each member reads the priorities in its own priority_key, as "
                "with update_priority=None.")
        data = ensure_tensordict(data, "data")
        if len(self.transform):
            data = self.transform.inv(data)
            if data is None:  # dropped by a write-side transform: nothing to route
                return self._handles(torch.zeros(0, dtype=torch.long))
        routed = self._route(data)
        return self._write(routed)

    def add(self, data: TensorDictBase) -> TensorDictBase:
        """Write one record (a TensorDict of batch size ``[]``) into the member its
        ``routing_key`` entry names; return its handles (:meth:`extend`'s, of batch ``[]``).

        ``RuntimeError`` with ``routing_dim`` (a record has no batch dimension: use
        :meth:`extend`, as TorchRL says), ``ValueError`` for a batched TensorDict,
        :class:`~tdreplay.core.utils.NotATensorDictError` for anything else.

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> from tdreplay.ensembles import ReplayBufferEnsemble
        >>> rb = ReplayBufferEnsemble(TensorDictReplayBuffer(storage=LazyTensorStorage(4)),
        ...                           TensorDictReplayBuffer(storage=LazyTensorStorage(4)),
        ...                           routing_key="agent")
        >>> handle = rb.add(TensorDict(obs=torch.tensor(5.0), agent=torch.tensor(1)))
        >>> handle.batch_size, int(handle["buffer_ids"]), int(handle["index"])
        (torch.Size([]), 1, 0)
        """
        if self._routing_key is None and self._routing_dim is None:
            raise refuse_write("add", routable=True)
        if self._routing_dim is not None:
            raise RuntimeError("ReplayBufferEnsemble.add: with routing_dim, records are routed "
                               "along a batch dimension, which one record lacks: use extend().")
        data = ensure_tensordict(data, "data")
        if data.batch_dims:
            raise ValueError(f"ReplayBufferEnsemble.add expects one record, a TensorDict of "
                             f"batch size [], got batch size {list(data.batch_size)}: use "
                             "extend() for a batch.")
        return self.extend(data.unsqueeze(0))[0]

    def _route(self, data: TensorDictBase) -> _Routed:
        """Check ``data`` (write-side transforms done) and split it among the members."""
        members = len(self._rbs)
        for i, rb in enumerate(self._rbs):
            if rb.storage.ndim != 1:
                raise ValueError(f"routed writes need one-dimensional member storages: member "
                                 f"{i} has a {type(rb.storage).__name__} with "
                                 f"ndim={rb.storage.ndim}.")
        if self._routing_key is not None:
            key = self._routing_key
            flat = data.reshape(-1)
            ids = flat.get(key, None)
            if ids is None:
                raise KeyError(f"routing_key {key!r} is not an entry of data (keys: "
                               f"{sorted(str(k) for k in flat.keys(True, True))}).")
            if not isinstance(ids, torch.Tensor):
                raise TypeError(f"routing_key {key!r} must hold a tensor of member ids, got "
                                f"{type(ids).__name__}.")
            while ids.ndim > 1 and ids.shape[-1] == 1:
                ids = ids.squeeze(-1)
            if ids.shape != flat.batch_size:
                raise ValueError(f"routing_key {key!r} must hold one member id per record, got "
                                 f"shape {tuple(ids.shape)} for {flat.batch_size.numel()} "
                                 f"records.")
            ids = check_member_ids(ids, members, f"routing_key {key!r}")
        else:
            dim, ndim = self._routing_dim, data.batch_dims
            assert dim is not None
            if not ndim:
                raise ValueError("routing_dim needs batched data: got a TensorDict of batch "
                                 "size [].")
            if not -ndim <= dim < ndim:
                raise ValueError(f"routing_dim={dim} is out of range for data with {ndim} batch "
                                 f"dimensions {list(data.batch_size)}.")
            if data.batch_size[dim] != members:
                raise ValueError(f"routing_dim={dim} has size {data.batch_size[dim]}; it must "
                                 f"be the number of buffers, {members}.")
            shape = [1] * ndim
            shape[dim] = members
            ids = torch.arange(members).reshape(shape).expand(data.batch_size).reshape(-1)
            flat = data.reshape(-1)
        return _Routed(flat, ids.cpu(), member_groups(ids, members))

    def _write(self, routed: _Routed) -> TensorDictBase:
        """Extend each member with its records (under the ensemble's lock); the handles."""
        records = routed.buffer_ids.numel()
        track = self.writer.tracks_generations
        slots = torch.full((records,), -1, dtype=torch.long)
        generations = torch.full((records,), -1, dtype=torch.long) if track else None
        with self._lock:
            written: list[int] = []
            for member, positions in routed.groups:
                rb = self._rbs[member]
                try:
                    got = rb.extend(routed.data[positions])
                except BaseException as err:
                    if hasattr(err, "add_note"):  # (Python >= 3.11)
                        err.add_note(f"ReplayBufferEnsemble.extend: member {member} refused its "
                                     f"{positions.numel()} records; members {written} were "
                                     "written, it and the later ones were not.")
                    raise
                written.append(member)
                got = torch.as_tensor(got, dtype=torch.long).reshape(-1).cpu()
                slots[positions] = got
                if generations is not None:
                    kept = got >= 0
                    stamps = rb.writer.generations_of(got).reshape(-1).cpu()
                    stamps = stamps - _later_occurrences(got)
                    generations[positions] = torch.where(kept, stamps, -1)
        return self._handles(routed.buffer_ids, slots, generations)

    def _handles(self, buffer_ids: torch.Tensor, slots: torch.Tensor | None = None,
                 generations: torch.Tensor | None = None) -> TensorDictBase:
        records = buffer_ids.numel()
        if slots is None:
            slots = torch.zeros(0, dtype=torch.long)
            if self.writer.tracks_generations:
                generations = torch.zeros(0, dtype=torch.long)
        handles = TensorDict({"buffer_ids": buffer_ids, "index": slots}, batch_size=[records])
        if generations is not None:
            handles.set("index_generation", generations)
        return handles
