"""``SamplerEnsemble``: draws some buffers of an ensemble, then a part of the batch from each."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from tdreplay.core import CheckpointError, Sampler, Storage
from tdreplay.core.checkpoint import save_torch_file
from tdreplay.core.priority_shapes import priority_for_index
from tdreplay.core.utils import check_batch_size, check_flag, check_instance

from ._generators import (
    GENERATORS,
    GENERATORS_FILE,
    check_generator_states,
    generator_states,
    restore_generators,
)
from ._members import (
    MembersShareable,
    check_members_state_dict,
    dump_members,
    index_parts,
    load_members_state_dict,
    members_state_dict,
    naming_member,
    part_member,
    prepare_members,
    select_members,
)
from .collate import stack_parts
from .storage import StorageEnsemble

#: ``p="sampleable"``: weights recomputed at each draw from what each buffer can give
SAMPLEABLE = "sampleable"


def _check_p(p: Any, n: int) -> torch.Tensor | str | None:
    """``p`` as float64 weights summing to 1, ``"sampleable"`` or ``None``; errors name ``p``."""
    if p is None:
        return None
    if isinstance(p, str):
        if p != SAMPLEABLE:
            raise ValueError(f"p must be a sequence or a tensor of weights, or {SAMPLEABLE!r} "
                             f"(the only dynamic weighting), got {p!r}.")
        return SAMPLEABLE
    if isinstance(p, torch.Tensor):
        if p.dtype is torch.bool or p.is_complex():
            raise TypeError(f"p must hold real numbers, got a tensor of dtype {p.dtype}.")
        weights = p.detach().to(device="cpu", dtype=torch.float64)
    else:
        if isinstance(p, bytes) or not isinstance(p, (Sequence, np.ndarray)):
            raise TypeError(f"p must be a sequence or a tensor of weights, got {type(p).__name__}.")
        try:
            weights = torch.as_tensor(np.asarray(p, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise TypeError(f"p must hold numbers, got {p!r}.") from err
    if weights.ndim != 1 or weights.numel() != n:
        raise ValueError(f"p must hold one weight per buffer ({n}), got "
                         f"{weights.numel() if weights.ndim == 1 else tuple(weights.shape)} "
                         f"{'weights' if weights.ndim == 1 else '(shape)'}.")
    if not bool(torch.isfinite(weights).all()):
        raise ValueError(f"p must hold finite weights, got {weights.tolist()}.")
    if bool((weights < 0).any()):
        raise ValueError(f"p must hold non-negative weights, got {weights.tolist()}.")
    total = weights.sum()
    if total <= 0:
        raise ValueError(f"p must give at least one buffer a positive weight, got "
                         f"{weights.tolist()}.")
    return weights / total


def _split_state(state_dict: Any) -> tuple[Any, Any]:
    """A :meth:`SamplerEnsemble.state_dict` as ``(the samplers' states, their generators'
    states)``; ``None`` for the generators of a state without them."""
    if not isinstance(state_dict, dict):
        return state_dict, None
    members = {key: value for key, value in state_dict.items() if key != GENERATORS}
    return members, state_dict.get(GENERATORS)


class SampleFromAllConflictError(ValueError, RuntimeError):
    """``sample_from_all=True`` given with ``p`` or a ``num_buffer_sampled`` other than the
    number of buffers: a ``ValueError``, and the ``RuntimeError`` TorchRL raises for ``p``
    (``except RuntimeError:`` written for TorchRL keeps working).

    Examples
    --------
    >>> from tdreplay.core import RandomSampler
    >>> try:
    ...     SamplerEnsemble(RandomSampler(), RandomSampler(), p=[0.5, 0.5], sample_from_all=True)
    ... except RuntimeError as err:
    ...     print(type(err).__name__)
    SampleFromAllConflictError
    """


def _check_num_buffer_sampled(value: Any, n: int, sample_from_all: bool) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"num_buffer_sampled must be an int or None, got {type(value).__name__}.")
    value = int(value)
    if value < 1:
        raise ValueError(f"num_buffer_sampled must be a positive int (the number of parts of a "
                         f"batch), got {value}.")
    if sample_from_all and value != n:
        raise SampleFromAllConflictError(
            f"sample_from_all=True samples every buffer ({n}); num_buffer_sampled={value} "
            "contradicts it (leave it None).")
    return value


def _priority_of_shape(priority: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``priority`` with the index's ``shape``, as a single buffer takes it
    (:func:`tdreplay.core.priority_shapes.priority_for_index`), without trailing dims: an
    ensemble's parts take one priority per item.

    Examples
    --------
    >>> _priority_of_shape(torch.tensor([2.0]), torch.Size([3])).tolist()
    [2.0, 2.0, 2.0]
    >>> _priority_of_shape(torch.ones(3, 1), torch.Size([3])).shape
    torch.Size([3])
    """
    shaped = priority_for_index(priority, shape)
    if shaped.shape != shape:
        raise ValueError(f"priority must have the index's shape {tuple(shape)} (or broadcast to "
                         f"it), got {tuple(priority.shape)}.")
    return shaped


class SamplerEnsemble(MembersShareable, Sampler):
    """The samplers of several buffers, and how a batch is spread over the buffers.

    Each call to :meth:`sample` draws ``num_buffer_sampled`` buffers, splits the batch evenly
    among them and asks each drawn buffer's sampler for its part.

    Parameters
    ----------
    *samplers : Sampler
        One sampler per buffer.
    p : sequence of float, Tensor or ``"sampleable"``, optional
        Relative weight of each buffer when drawing buffers (normalised to sum to 1). Without
        it, buffers are drawn uniformly. ``"sampleable"`` (as TorchRL's) weighs each buffer by
        how many items it can be sampled from now (``Sampler.sampleable_count``), leaving out
        those that cannot give a part (empty ones, a ``drop_last`` sampler short of a part).
        Not compatible with ``sample_from_all``.
    sample_from_all : bool
        Every batch takes one part from every buffer, in order. Defaults to ``False``.
    num_buffer_sampled : int, optional
        How many parts a batch is made of, each drawn from one buffer (a positive int; it may
        exceed the number of buffers, as buffers are drawn with replacement). Defaults to the
        number of buffers.

    Notes
    -----
    As in TorchRL, buffers are drawn **with replacement**: with ``p`` (or uniformly) one buffer
    can supply several parts of one batch, so ``p`` really is the share of parts that come from
    each buffer. ``num_buffer_sampled`` is the number of parts; above the number of buffers,
    some buffer necessarily supplies several parts. Before anything is drawn, every buffer
    that can be drawn (weight > 0) must hold data, so sampling fails the same way whatever
    the draw. As TorchRL's, each buffer drawn is sampled once for all its parts, buffers in
    the order of their ids, and a sampler that gives fewer items than asked (a
    ``SamplerWithoutReplacement`` at the end of an epoch) is asked again for the rest, so
    every part is full.

    It is shareable between processes only if every sampler is (``shareable``: not a
    prioritized sampler, whose trees live in one process); otherwise ``check_shareable()``,
    pickling it for a process being started and sharing a buffer holding it raise
    :class:`~tdreplay.core.NotShareableError` naming the sampler (its position and class) and
    giving its own message.

    :meth:`sample` returns the index as a TensorDict of batch size ``[parts, *part_shape]``
    with ``"index"`` (slots in each buffer's storage) and ``"buffer_ids"`` (which buffer each
    slot belongs to), and the samplers' info entries stacked the same way.

    Examples
    --------
    >>> import torch
    >>> from tdreplay.core import ListStorage, RandomSampler
    >>> storages = StorageEnsemble(ListStorage(10), ListStorage(10))
    >>> storages[0].set(torch.arange(4), [0, 1, 2, 3])
    >>> storages[1].set(torch.arange(2), [10, 11])
    >>> sampler = SamplerEnsemble(RandomSampler(), RandomSampler(), sample_from_all=True)
    >>> index, info = sampler.sample(storages, 6)
    >>> index.batch_size, index["buffer_ids"][:, 0].tolist()
    (torch.Size([2, 3]), [0, 1])
    >>> bool((index["index"][1] < 2).all())
    True
    >>> sampler.shareable  # uniform samplers need only their storage's length
    True
    """

    def __init__(self, *samplers: Sampler, p: Sequence[float] | torch.Tensor | str | None = None,
                 sample_from_all: bool = False, num_buffer_sampled: int | None = None) -> None:
        if not samplers:
            raise ValueError("SamplerEnsemble needs at least one sampler.")
        for i, sampler in enumerate(samplers):
            if not isinstance(sampler, Sampler):
                raise TypeError(f"samplers[{i}] must be a Sampler instance, got "
                                f"{type(sampler).__name__}.")
            if isinstance(sampler, SamplerEnsemble):
                raise TypeError(f"samplers[{i}] is a SamplerEnsemble: ensembles do not nest.")
        sample_from_all = check_flag(sample_from_all, "sample_from_all")
        if sample_from_all and p is not None:
            raise SampleFromAllConflictError(
                "p and sample_from_all=True cannot be used together: sample_from_all takes one "
                "part from every buffer, p weights a random draw of buffers.")
        n = len(samplers)
        self._p = _check_p(p, n)
        self._num_buffer_sampled = _check_num_buffer_sampled(num_buffer_sampled, n, sample_from_all)
        self._sample_from_all = sample_from_all
        self._samplers: tuple[Sampler, ...] = tuple(samplers)
        # each member storage's restore_count its sampler is known to be in step with (see
        # _draw_member): a member emptied or restored past the ensemble is learnt anew
        self._seen_restores = [0] * len(self._samplers)
        #: Whether any member sampler is prioritized (fixed: the members are).
        self.is_prioritized = any(sampler.is_prioritized for sampler in self._samplers)
        #: The sample entries any member hands back with a priority update (e.g.
        #: ``"write_generation"``: each part goes to its member, if that member takes it).
        self.update_keys = tuple(dict.fromkeys(
            key for sampler in self._samplers for key in sampler.update_keys))
        # the members whose draws change state, each once (a sampler may be listed twice)
        self._stateful = tuple({id(s): s for s in self._samplers if s.stateful_draws}.values())
        #: Whether a member's draws change state (:meth:`draw_mark` marks those members).
        self.stateful_draws = bool(self._stateful)

    # ---- configuration --------------------------------------------------------------------------
    def _sharing_members(self) -> tuple[Sampler, ...]:
        return self._samplers

    @property
    def samplers(self) -> tuple[Sampler, ...]:
        """The samplers, one per buffer."""
        return self._samplers

    @property
    def p(self) -> torch.Tensor | str | None:
        """Normalised weights of the buffers (``None``: uniform; ``"sampleable"``: from what
        each can give at each draw)."""
        return self._p

    @p.setter
    def p(self, value: Sequence[float] | torch.Tensor | str | None) -> None:
        if value is not None and self._sample_from_all:
            raise SampleFromAllConflictError("p cannot be set while sample_from_all=True.")
        self._p = _check_p(value, len(self._samplers))

    @property
    def sample_from_all(self) -> bool:
        """Whether every batch takes one part from every buffer."""
        return self._sample_from_all

    @property
    def num_buffer_sampled(self) -> int:
        """Number of parts of a batch, each drawn from one buffer (with replacement)."""
        if self._num_buffer_sampled is None:
            return len(self._samplers)
        return self._num_buffer_sampled

    @num_buffer_sampled.setter
    def num_buffer_sampled(self, value: int | None) -> None:
        self._num_buffer_sampled = _check_num_buffer_sampled(value, len(self._samplers),
                                                             self._sample_from_all)

    @property
    def requested_num_buffer_sampled(self) -> int | None:
        """``num_buffer_sampled`` as given: ``None`` means every buffer, however many there
        are (what a selection of the buffers, ``ensemble[[0, 2]]``, keeps).

        Examples
        --------
        >>> from tdreplay.core import RandomSampler
        >>> ensemble = SamplerEnsemble(RandomSampler(), RandomSampler(), RandomSampler())
        >>> ensemble.num_buffer_sampled, ensemble.requested_num_buffer_sampled
        (3, None)
        """
        return self._num_buffer_sampled

    # ---- sampling -------------------------------------------------------------------------------
    def _draw_buffers(self, storage: StorageEnsemble, part_size: int) -> torch.Tensor:
        n, parts = len(self._samplers), self.num_buffer_sampled
        if self._sample_from_all:
            return torch.arange(n)
        p = self._p
        if isinstance(p, str):  # "sampleable": what each buffer can give now
            p = torch.tensor([float(sampler.sampleable_count(member))
                              if sampler.can_sample(member, part_size) else 0.0
                              for sampler, member in zip(self._samplers, storage.storages)],
                             dtype=torch.float64)
            if not bool(p.any()):
                raise RuntimeError("cannot sample: none of the ensemble's buffers can give a "
                                   f"part of {part_size} items (p='sampleable').")
        if p is None:
            return torch.randint(n, (parts,), generator=self._rng)
        return torch.multinomial(p, parts, replacement=True, generator=self._rng)

    # the base returns a tensor of slots; an ensemble's index is a TensorDict ("index",
    # "buffer_ids") or a list of them, which StorageEnsemble.get and the ensemble buffer read
    def sample(  # type: ignore[override]
        self, storage: Storage, batch_size: int
    ) -> tuple[TensorDictBase | list[TensorDictBase], dict[str, Any]]:
        """Draw buffers, then ``batch_size // num_buffer_sampled`` items from each.

        Returns ``(index, info)``: see the class notes. When the parts' indices differ in
        shape, ``index`` is a list of per-part TensorDicts instead.
        """
        if not isinstance(storage, StorageEnsemble):
            raise TypeError(f"SamplerEnsemble samples a StorageEnsemble, got "
                            f"{type(storage).__name__}.")
        if len(storage) != len(self._samplers):
            raise ValueError(f"the StorageEnsemble has {len(storage)} storages but the "
                             f"SamplerEnsemble has {len(self._samplers)} samplers.")
        check_batch_size(batch_size)
        parts = self.num_buffer_sampled
        if batch_size % parts:
            raise ValueError(f"batch_size={batch_size} cannot be split evenly among "
                             f"num_buffer_sampled={parts} buffers: use a multiple of {parts}.")
        p = self._p
        if not isinstance(p, str):  # ("sampleable" leaves out the buffers without items)
            drawable = range(len(self._samplers)) if p is None \
                else p.nonzero().reshape(-1).tolist()
            empty = [i for i in drawable if len(storage.storages[i]) == 0]
            if empty:
                raise RuntimeError(f"cannot sample: buffer(s) {empty} of the ensemble are empty "
                                   "(extend them with rb[i].extend(...), or give them weight 0 "
                                   "in p).")
        part_size = batch_size // parts
        buffer_ids = self._draw_buffers(storage, part_size).tolist()
        indices: list[Any] = [None] * parts
        infos: list[Any] = [None] * parts
        mark = self.draw_mark()  # a member refusing its part: the parts drawn are given back
        try:
            for member in sorted(set(buffer_ids)):  # each buffer drawn once, in id order
                positions = [k for k, drawn in enumerate(buffer_ids) if drawn == member]
                try:
                    index, info = self._draw_member(member, storage.storages[member],
                                                    part_size * len(positions))
                except ValueError as err:  # (e.g. a slice member's batch rules)
                    raise naming_member(err, f"buffer {member}, asked for {len(positions)} "
                                        f"part(s) of {part_size} items of the batch of "
                                        f"{batch_size} split among {parts} buffers") from err
                for j, k in enumerate(positions):
                    indices[k] = index[j * part_size:(j + 1) * part_size]
                    infos[k] = _info_part(info, j * part_size, part_size, index.shape[0])
        except BaseException:
            self.undo_draws(mark)
            raise
        return _ensemble_index(indices, buffer_ids), _stack_infos(infos)

    def _draw_member(self, member: int, storage: Storage, count: int
                     ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``count`` items of buffer ``member``: its sampler asked again for the rest while
        it gives fewer (the end of a ``SamplerWithoutReplacement`` epoch), as TorchRL's."""
        sampler = self._samplers[member]
        indices, infos, remaining = [], [], count
        while remaining:
            index, info = self._member_sample(member, storage, remaining)
            index = torch.as_tensor(index, dtype=torch.long)
            got = index.shape[0] if index.ndim else 1
            if not got or got > remaining:
                more = (f" ({type(sampler).__name__} hands out several rows an item, as the "
                        "frame-stacking sampler of CatFrames.make_rb_transform_and_sampler "
                        "does: an ensemble takes one row an item from its members)"
                        if got > remaining else "")
                raise RuntimeError(f"the sampler of buffer {member} gave {got} items for a "
                                   f"request of {remaining}{more}.")
            indices.append(index.reshape(got, *index.shape[1:]))
            infos.append(info)
            remaining -= got
        if len(indices) == 1:
            return indices[0], infos[0]
        return torch.cat(indices), _cat_infos(infos, [i.shape[0] for i in indices])

    def _member_sample(self, member: int, storage: Storage, count: int
                       ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Buffer ``member``'s sampler's draw. One that draws a slot its storage no longer
        holds, after the storage was emptied or restored past the ensemble (``rb.storage.
        empty()`` / ``load_state_dict``: its ``restore_count`` moved), learns the written
        slots anew and draws again, as a buffer's own sample does."""
        sampler = self._samplers[member]
        try:
            return sampler.sample(storage, count)
        except IndexError:
            if storage.restore_count == self._seen_restores[member]:
                raise  # out of step for another reason: written past the sampler
        self._seen_restores[member] = storage.restore_count
        sampler.learn_written_slots(storage)
        return sampler.sample(storage, count)

    def draw_mark(self) -> list[tuple[Sampler, Any]]:
        """The marks of the members whose draws change state (each member once): what
        :meth:`undo_draws` puts back, for a batch that fails (see
        :meth:`~tdreplay.core.Sampler.draw_mark`). :meth:`sample` marks them too, so a member
        refusing its part leaves every member as it was.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, SamplerWithoutReplacement
        >>> storages = StorageEnsemble(ListStorage(4), ListStorage(4))
        >>> for storage in storages.storages:
        ...     storage.set(torch.arange(4), [0, 1, 2, 3])
        >>> sampler = SamplerEnsemble(SamplerWithoutReplacement(shuffle=False),
        ...                           SamplerWithoutReplacement(shuffle=False),
        ...                           sample_from_all=True)
        >>> mark = sampler.draw_mark()
        >>> sampler.sample(storages, 4)[0]["index"].tolist()
        [[0, 1], [0, 1]]
        >>> sampler.undo_draws(mark)  # e.g. the batch's transform raised
        >>> sampler.sample(storages, 4)[0]["index"].tolist()
        [[0, 1], [0, 1]]
        """
        return [(sampler, sampler.draw_mark()) for sampler in self._stateful]

    def undo_draws(self, mark: list[tuple[Sampler, Any]]) -> None:
        """Undo every member's draws since ``mark`` (see :meth:`draw_mark`)."""
        for sampler, member_mark in reversed(mark):
            sampler.undo_draws(member_mark)

    def update_priority(self, index: Any, priority: Any, *, storage: Storage | None = None,
                        **extra: Any) -> None:
        """Route priorities to the samplers of the buffers they belong to.

        ``index`` is an ensemble index (as :meth:`sample` returns, or ``sample["index"]``);
        ``priority`` has its shape (or broadcasts to it). Every part's ``"buffer_ids"`` must
        hold integer ids of one member (``TypeError`` for a non-integer dtype, ``IndexError``
        for an id outside ``[0, n - 1]``, which is never counted from the end, ``ValueError``
        for a part naming several members): every part is checked before any sampler changes.
        ``extra``: entries of the sample named in :attr:`update_keys` (``write_generation``:
        the sample's, so that a member skips the rows overwritten since), of the index's shape
        (a list of parts for a list index); each part goes to its member's sampler if it
        takes that entry.
        """
        unknown = sorted(set(extra) - set(self.update_keys))
        if unknown:
            raise TypeError(f"update_priority got {unknown}, which no member sampler takes "
                            f"(they take {list(self.update_keys)}).")
        extra = {key: value for key, value in extra.items() if value is not None}
        if is_tensor_collection(index):
            priority = _priority_of_shape(torch.as_tensor(priority), index.batch_size)
            for key, value in extra.items():
                value = torch.as_tensor(value)
                if value.shape != index.batch_size:
                    raise ValueError(f"{key} must have the index's shape "
                                     f"{tuple(index.batch_size)}, got {tuple(value.shape)}.")
                extra[key] = value
        else:
            if not isinstance(index, (list, tuple)):
                raise TypeError(f"index must be an ensemble index (a TensorDict with 'index' "
                                f"and 'buffer_ids', e.g. sample['index']) or a list of them, "
                                f"got {type(index).__name__}.")
            index = list(index)
            for name, value in (("priority", priority), *extra.items()):
                if not isinstance(value, (list, tuple)) or len(value) != len(index):
                    raise ValueError(f"with a list index of {len(index)} parts, {name} must be "
                                     "a list with one entry per part.")
        parts = index_parts(index, "update_priority expects an ensemble index: a TensorDict with "
                                   "'index' and 'buffer_ids' entries (e.g. sample['index']).")
        storages = None if storage is None else \
            check_instance(storage, StorageEnsemble, "storage").storages
        updates = []  # every part checked before any sampler changes
        for position, (ids, slots) in enumerate(parts):
            buffer_id = part_member(ids, position, len(self._samplers))
            if buffer_id is None:
                continue  # an empty part: nothing to update
            sampler = self._samplers[buffer_id]
            member = None if storages is None else storages[buffer_id]
            part_priority = torch.as_tensor(priority[position]).expand(slots.shape)
            checked = sampler.check_priority(part_priority)
            part_extra = {key: torch.as_tensor(value[position]).reshape(slots.shape)
                          for key, value in extra.items() if key in sampler.update_keys}
            # (rows the member's sampler tells stale by what the sample handed back, e.g. its
            # write_generation, it skips itself, as a buffer's own update does; a sampler
            # without priorities updates nothing)
            if member is not None and sampler.is_prioritized and not part_extra:
                _check_written(slots, member, buffer_id)
            updates.append((sampler, slots, part_priority if checked is None else checked,
                            member, part_extra))
        for sampler, slots, part_priority, member, part_extra in updates:
            sampler.update_priority(slots, part_priority, storage=member, **part_extra)

    def extend(self, index: torch.Tensor) -> None:
        raise RuntimeError("a SamplerEnsemble is not written through: extend one buffer of the "
                           "ensemble (rb[i].extend(...)), which updates its own sampler.")

    def mark_update(self, index: torch.Tensor, *, storage: Storage | None = None) -> None:
        self.extend(index)

    def mark_rewritten(self, index: torch.Tensor) -> None:
        """Refused as :meth:`extend` is: ``rb[i] = ...`` goes through one buffer of the
        ensemble (``rb[k][i] = ...``), which tells its own sampler."""
        self.extend(index)

    def set_rng(self, generator: torch.Generator | None) -> None:
        """Use ``generator`` for the draw of buffers and in every member sampler."""
        self._rng = generator
        for sampler in self._samplers:
            sampler.set_rng(generator)

    def empty(self) -> None:
        for sampler in self._samplers:
            sampler.empty()

    def learn_written_slots(self, storage: Storage) -> None:
        """Each member sampler learns the written slots of its storage of ``storage`` (a
        :class:`StorageEnsemble`); see :meth:`Sampler.learn_written_slots
        <tdreplay.core.Sampler.learn_written_slots>`."""
        if not isinstance(storage, StorageEnsemble):
            raise TypeError(f"storage must be a StorageEnsemble, got {type(storage).__name__}.")
        for member, (sampler, part) in enumerate(zip(self._samplers, storage.storages)):
            sampler.learn_written_slots(part)
            self._seen_restores[member] = part.restore_count

    # ---- indexing -------------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Sampler | SamplerEnsemble:
        """``ensemble[i]``: the i-th sampler; a slice, sequence or 1-D tensor: a
        :class:`SamplerEnsemble` of the selected samplers (with their share of ``p``)."""
        positions = select_members(index, len(self._samplers), "samplers")
        if isinstance(positions, int):
            return self._samplers[positions]
        return SamplerEnsemble(
            *(self._samplers[i] for i in positions),
            p=self._p[positions] if isinstance(self._p, torch.Tensor) else self._p,
            sample_from_all=self._sample_from_all,
            num_buffer_sampled=self._num_buffer_sampled,
        )

    def __len__(self) -> int:
        """Number of samplers."""
        return len(self._samplers)

    # ---- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"0": samplers[0].state_dict(), ..., "generators": [...]}``: each sampler's state
        and its generator's (``None`` without one), as :meth:`dumps` saves them."""
        return {**members_state_dict(self._samplers), GENERATORS: generator_states(self._samplers)}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        members, generators = _split_state(state_dict)
        check_members_state_dict(self._samplers, members, "SamplerEnsemble")
        check_generator_states(self._samplers, generators)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a state without ``"generators"`` leaves the generators
        as they are); on failure every sampler is left as it was."""
        members, generators = _split_state(state_dict)
        check_generator_states(self._samplers, generators)
        load_members_state_dict(self._samplers, members, "SamplerEnsemble")
        restore_generators(self._samplers, generators)

    def dumps(self, path: Any) -> None:
        """Write each sampler's checkpoint into ``path/<i>``, and their generators' states.

        A member's generator (set on its buffer or sampler) is saved too, so a restored
        ensemble draws the same parts as the saved one would.
        """
        path = Path(path)
        dump_members(self._samplers, path, "SamplerEnsemble")
        save_torch_file(generator_states(self._samplers), path / GENERATORS_FILE)

    def prepare_load(self, path: Any) -> Any:
        """Read and check every sampler's checkpoint; return a function installing them."""
        path = Path(path)
        install_members = prepare_members(self._samplers, path, "SamplerEnsemble")
        file = path / GENERATORS_FILE
        states = torch.load(file, weights_only=True) if file.is_file() else None
        try:
            check_generator_states(self._samplers, states)
        except ValueError as err:
            raise CheckpointError(f"{file}: {err}") from err

        def commit() -> None:
            install_members()
            restore_generators(self._samplers, states)

        return commit

    def __repr__(self) -> str:
        p = self._p if not isinstance(self._p, torch.Tensor) \
            else [round(w, 6) for w in self._p.tolist()]
        body = textwrap.indent(
            f"samplers=({', '.join(map(repr, self._samplers))}),\np={p},\n"
            f"sample_from_all={self._sample_from_all},\n"
            f"num_buffer_sampled={self.num_buffer_sampled}", " " * 4)
        return f"{type(self).__name__}(\n{body})"


def _ensemble_index(indices: list[torch.Tensor], buffer_ids: list[int]
                    ) -> TensorDictBase | list[TensorDictBase]:
    """The parts' slots and buffer ids: one ``[parts, *part_shape]`` TensorDict when the parts
    agree in shape (built from stacked tensors, not from one TensorDict per part), else a list
    of per-part TensorDicts."""
    shape = indices[0].shape
    if all(index.shape == shape for index in indices):
        slots = torch.stack(indices)
        ids = torch.tensor(buffer_ids, dtype=torch.long, device=slots.device)
        ids = ids.reshape((-1,) + (1,) * len(shape)).expand(slots.shape).clone()
        return TensorDict({"index": slots, "buffer_ids": ids}, batch_size=slots.shape)
    return [TensorDict({"index": index, "buffer_ids": torch.full_like(index, buffer_id)},
                       batch_size=index.shape)
            for index, buffer_id in zip(indices, buffer_ids)]


def _info_part(info: dict[str, Any], start: int, size: int, total: int) -> dict[str, Any]:
    """The entries of a member's ``info`` (for its ``total`` items) for its items ``start`` to
    ``start + size``: per-item tensors sliced, other entries as they are."""
    return {key: value[start:start + size]
            if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == total
            else value for key, value in info.items()}


def _cat_infos(infos: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    """One info for draws of ``counts`` items each: per-item tensors concatenated, other
    entries the first draw's."""
    merged = dict(infos[0])
    for key in infos[0]:
        values = [info.get(key) for info in infos]
        tensors = [v for v, c in zip(values, counts)
                   if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == c]
        if len(tensors) == len(values):
            merged[key] = torch.cat(tensors)
    return merged


#: the importance weight of an item drawn uniformly: what ``priority_weight`` is in the parts
#: of the members without priorities, in an ensemble of prioritized and uniform members
UNIFORM_WEIGHT = 1.0


def _stack_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the parts' info dicts: tensors of one shape stacked along dim 0, else a list.

    An entry only some members give stays one tensor of the sample's shape: an integer one
    (``write_generation`` from the prioritized members of a mixed ensemble) is ``-1`` in the
    other parts (a member that does not take it is never handed it back), and
    ``priority_weight`` is :data:`UNIFORM_WEIGHT` in the parts of members that draw without
    priorities (their items' importance weight), so the sample carries it as a buffer's does.
    """
    keys: list[str] = []
    for info in infos:
        keys.extend(k for k in info if k not in keys)
    merged: dict[str, Any] = {}
    for key in keys:
        values = [info.get(key) for info in infos]
        fill = _fill_of_missing_parts(key, values)
        if fill is not None:
            given = next(v for v in values if v is not None)
            values = [torch.full_like(given, fill) if v is None else v for v in values]
        if all(isinstance(v, torch.Tensor) for v in values):
            merged[key] = stack_parts(values)
        else:
            merged[key] = values
    return merged


def _fill_of_missing_parts(key: str, values: list[Any]) -> float | None:
    """What the parts without entry ``key`` get (see :func:`_stack_infos`), when some parts
    have it, all as tensors of one shape and dtype; ``None`` to leave the entry as it is."""
    given = [v for v in values if v is not None]
    if not 0 < len(given) < len(values):
        return None
    first = given[0]
    if not all(isinstance(v, torch.Tensor) and v.shape == first.shape
               and v.dtype == first.dtype for v in given):
        return None
    if first.is_floating_point():
        return UNIFORM_WEIGHT if key == "priority_weight" else None
    return -1 if first.dtype != torch.bool and not first.is_complex() else None


def _check_written(slots: torch.Tensor, storage: Storage, buffer_id: int) -> None:
    """``IndexError`` unless every slot is ``-1`` (skipped) or written in ``storage``, the
    storage of buffer ``buffer_id``."""
    flat = torch.as_tensor(slots).reshape(-1)
    bad = flat[~(storage.valid_slots_mask(flat) | (flat == -1))]
    if bad.numel():
        raise IndexError(f"update_priority: index {bad[:5].tolist()} of buffer {buffer_id} is not "
                         f"among its {len(storage)} written slots; nothing was updated.")
