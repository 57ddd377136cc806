"""Save and load hooks that store TED data one trajectory per row: :class:`TED2Nested`,
:class:`Nested2TED`, :class:`H5Split`, :class:`H5Combine` (TorchRL's
``torchrl.data.replay_buffers.utils``).

:class:`TED2Nested` (a save hook) is :class:`~tdreplay.storages.TED2Flat` cut at the
trajectory ends: its result has one row per trajectory (batch ``[trajectories]``), and each
entry of the flat format becomes a nested tensor (``torch.nested``, strided layout: the one
TorchRL memory-maps) whose row ``i`` holds trajectory ``i``'s part, in time order:

* an entry stored once with its ``("next", ...)`` twin (``obs``): the trajectory's ``L + 1``
  values (its ``L`` root values, then the ``("next", ...)`` value of its last step);
* any other entry (``action``, the end flags and rewards kept from ``"next"``, a ``"next"``
  entry that is not TED, ...): its ``L`` steps;
* ``traj_ends`` (the flat format's end flags): ``L`` flags, the last one set;
* ``shift``, ``is_full`` (named by ``shift_key`` / ``is_full_key``) and ``storage_rows``: the
  ring's place and size, as non-tensor entries (one value for all rows, as TorchRL's).

:class:`Nested2TED` (a load hook) joins the trajectories back into the flat format and gives
it to :class:`~tdreplay.storages.Flat2TED`: the rows come back bitwise, in storage order.
:class:`H5Split` turns the nested form into a TensorDict of one sub-TensorDict per trajectory
(``traj_0``, ``traj_1``, ..., zero-padded to the same width, as TorchRL's), plus the
non-tensor entries; :class:`H5Combine` rebuilds the nested form.

Checkpointing with these hooks: :class:`~tdreplay.storages.TensorStorageCheckpointer` (the
default of ``TensorStorage``, ``LazyTensorStorage`` and ``LazyMemmapStorage``) saves the nested
form (each nested entry as its parts back to back, with their shapes, TensorDict's layout) and
the split form alike::

    rb.register_save_hook(TED2Nested())
    rb.register_load_hook(Nested2TED())          # or, one sub-TensorDict per trajectory:
    # rb.register_save_hook(TED2Nested()); rb.register_save_hook(H5Split())
    # rb.register_load_hook(H5Combine()); rb.register_load_hook(Nested2TED())

The TED checkpointers (``FlatStorageCheckpointer``, ``NestedStorageCheckpointer``,
``H5StorageCheckpointer``) save tensor entries only: they refuse the hooks' non-tensor metadata
with a ``TypeError`` before writing anything (they compact TED data themselves).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_non_tensor, unravel_key

from .ted_hooks import Flat2TED, TED2Flat

__all__ = ["H5Combine", "H5Split", "Nested2TED", "TED2Nested"]

#: the flat format's entries (besides ``shift_key`` / ``is_full_key``) read by Flat2TED
_ROWS, _ENDS = "storage_rows", "traj_ends"
#: prefix of a trajectory's entry in H5Split's result
_TRAJ = "traj_"


def _name(key: Any) -> str:
    return repr(unravel_key(key))


def _nest(pieces: Sequence[torch.Tensor], key: Any) -> torch.Tensor:
    """A strided nested tensor of ``pieces`` (copied), the layout TensorDict memory-maps."""
    try:
        with warnings.catch_warnings():  # torch warns once that strided nesting is a prototype
            warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
            return torch.nested.nested_tensor(list(pieces), layout=torch.strided)
    except (RuntimeError, NotImplementedError) as err:
        raise TypeError(f"entry {_name(key)} of dtype {pieces[0].dtype} cannot be held in a "
                        f"nested tensor: {err}") from err


def _leaves(td: TensorDictBase, prefix: tuple[str, ...] = ()) -> Iterator[tuple[Any, Any]]:
    """``(key, value)`` of every leaf of ``td``, non-tensor entries included."""
    for name in td.keys():
        value = td.get(name)
        key = (*prefix, name)
        if isinstance(value, TensorDictBase) and not is_non_tensor(value):
            yield from _leaves(value, key)
        else:
            yield unravel_key(key), value


def _python(value: Any) -> Any:
    """The Python value(s) of a non-tensor entry or a tensor (lists for several)."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if is_non_tensor(value):
        return value.tolist() if hasattr(value, "tolist") else value.data
    return value


def _scalar(data: TensorDictBase, key: Any, hook: str, saver: str) -> Any:
    """The one value of metadata entry ``key`` of ``data`` (non-tensor or tensor)."""
    value = data.get(key, None)
    if value is None:
        raise KeyError(f"{hook}: the metadata entry {_name(key)} is missing; was the data saved "
                       f"by {saver}?")
    values = _python(value)
    while isinstance(values, list):  # one value per row (NonTensorStack, expanded tensor)
        if not values or any(v != values[0] for v in values):
            raise ValueError(f"{hook}: the metadata entry {_name(key)} holds {values!r}, not one "
                             "value.")
        values = values[0]
    return values


def _check_rows(data: Any, hook: str, what: str) -> TensorDictBase:
    if not isinstance(data, TensorDictBase) or data.batch_dims != 1:
        raise ValueError(f"{hook} takes {what}, got {type(data).__name__} with batch size "
                         f"{tuple(getattr(data, 'batch_size', ()))}.")
    return data


class TED2Nested(TED2Flat):
    """A save hook storing TED data as one row per trajectory, with nested tensors.

    Takes the arguments of :class:`~tdreplay.storages.TED2Flat` and converts as it does (each
    observation stored once per step plus once per trajectory, the end flags and rewards kept
    from ``"next"``, a ``"next"`` entry that is not TED kept whole), then cuts every entry at
    the trajectory ends: the result has batch ``[trajectories]``, and its entries are strided
    nested tensors whose row ``i`` is trajectory ``i``'s part (``L + 1`` values for an
    observation stored with its ``"next"`` twin, ``L`` for the other entries), plus the
    ``traj_ends`` flags and the non-tensor metadata ``shift``, ``is_full``, ``storage_rows``
    (see :mod:`~tdreplay.storages.ted_nested`). ``shift`` / ``is_full`` are set by
    ``rb.dumps`` as for ``TED2Flat``: a full ring is saved oldest first, and a trajectory that
    spans the wrap point is one row.

    tdreplay's checkpointers do not write nested tensors: to checkpoint with this hook, register
    :class:`H5Split` after it (and :class:`H5Combine`, :class:`Nested2TED` as load hooks) on a
    storage with the default :class:`~tdreplay.storages.TensorStorageCheckpointer`.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> done = torch.tensor([[False], [True], [False], [False], [True]])
    >>> rows = TensorDict({"obs": torch.arange(5.), "action": torch.arange(5),
    ...                    "next": {"obs": torch.arange(1., 6.), "done": done}}, [5])
    >>> nested = TED2Nested()(rows)
    >>> nested.batch_size                 # trajectories 0-1 and 2-4
    torch.Size([2])
    >>> [t.tolist() for t in nested["obs"].unbind(0)]
    [[0.0, 1.0, 2.0], [2.0, 3.0, 4.0, 5.0]]
    >>> [t.tolist() for t in nested["action"].unbind(0)]
    [[0, 1], [2, 3, 4]]
    >>> nested["shift"], nested["is_full"], nested["storage_rows"]
    (5, False, 5)
    >>> (Nested2TED()(nested) == rows).all()
    True
    """

    def __call__(self, data: TensorDictBase, path: Any = None) -> TensorDictBase:
        if isinstance(data, TensorDictBase) and data.batch_dims == 1 and data.batch_size[0] == 0:
            raise ValueError("TED2Nested: there are no rows to save (an empty storage).")
        flat = super().__call__(data, path=path)
        rows = int(flat.get(_ROWS))
        ends = flat.get(_ENDS)
        last = ends.nonzero().squeeze(-1)
        lengths = torch.diff(last, prepend=last.new_full((1,), -1)).tolist()
        with_final = [length + 1 for length in lengths]
        scalars = {self.shift_key, self.is_full_key, _ROWS}
        out = TensorDict(batch_size=[len(lengths)], device=data.device)
        for key, value in flat.items(True, True):
            key = unravel_key(key)
            if key in scalars or not isinstance(value, torch.Tensor):
                continue  # (TED2Flat's result holds tensors only)
            sizes = lengths if value.shape[0] == rows else with_final
            out.set(key, _nest(value.split(sizes), key))
        out.set_non_tensor(self.shift_key, int(flat.get(self.shift_key)))
        out.set_non_tensor(self.is_full_key, bool(flat.get(self.is_full_key)))
        out.set_non_tensor(_ROWS, rows)
        return out


class Nested2TED(Flat2TED):
    """The load hook that rebuilds the rows :class:`TED2Nested` saved (same arguments).

    Joins every trajectory's part back into :class:`~tdreplay.storages.TED2Flat`'s format and
    rebuilds the rows with :class:`~tdreplay.storages.Flat2TED`: bitwise the rows
    ``TED2Nested`` got, in storage order (a wrapped ring included). Checks first that the
    data is a ``TED2Nested`` result: the metadata entries are there, every tensor entry is a
    nested tensor, and its trajectories have the lengths ``traj_ends`` gives.

    Parameters
    ----------
    done_key, shift_key, is_full_key, done_keys, reward_keys
        As :class:`~tdreplay.storages.TED2Flat`'s; ``shift_key`` / ``is_full_key`` must be those
        of the ``TED2Nested`` that saved the data.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> done = torch.tensor([[True], [False], [True]])
    >>> rows = TensorDict({"obs": torch.arange(3.), "next": {"obs": torch.arange(1., 4.),
    ...                    "done": done}}, [3])
    >>> saver = TED2Nested()
    >>> saver.shift, saver.is_full = 1, True   # what rb.dumps tells it: the ring wrapped at 1
    >>> nested = saver(rows)
    >>> [t.tolist() for t in nested["obs"].unbind(0)]    # oldest first: rows 1, 2 then 0
    [[1.0, 2.0, 3.0], [0.0, 1.0]]
    >>> (Nested2TED()(nested) == rows).all()
    True
    """

    def __call__(self, data: TensorDictBase, out: TensorDictBase | None = None) -> TensorDictBase:
        """Rebuild the rows; ``out`` (TorchRL's argument): when given, the rows are copied into
        it (same batch size) and it is returned. tdreplay's checkpointers pass ``out=None``."""
        data = _check_rows(data, "Nested2TED", "the TensorDict TED2Nested returns (batch "
                           "[trajectories])")
        scalars = {self.shift_key: _scalar(data, self.shift_key, "Nested2TED", "TED2Nested"),
                   self.is_full_key: _scalar(data, self.is_full_key, "Nested2TED", "TED2Nested"),
                   _ROWS: _scalar(data, _ROWS, "Nested2TED", "TED2Nested")}
        ends = data.get(_ENDS, None)
        if ends is None:
            raise KeyError(f"Nested2TED: the entry {_ENDS!r} is missing; was the data saved by "
                           "TED2Nested?")
        if not isinstance(ends, torch.Tensor) or not ends.is_nested:
            raise ValueError(f"Nested2TED: {_ENDS!r} is a {type(ends).__name__}, not a nested "
                             "tensor; was the data saved by TED2Nested?")
        lengths = []
        for i, piece in enumerate(ends.unbind(0)):
            if piece.dtype is not torch.bool or piece.ndim != 1 or not piece.numel() \
                    or not bool(piece[-1]) or bool(piece[:-1].any()):
                raise ValueError(f"Nested2TED: {_ENDS!r} of trajectory {i} is {piece.tolist()}; "
                                 "each trajectory's flags end with its only True.")
            lengths.append(piece.numel())
        rows = int(scalars[_ROWS])
        if sum(lengths) != rows:
            raise ValueError(f"Nested2TED: the trajectories hold {sum(lengths)} steps but "
                             f"'storage_rows' says {rows}.")
        flat = TensorDict(batch_size=[])
        for key, value in _leaves(data):
            if key in scalars:
                continue
            if not isinstance(value, torch.Tensor) or not value.is_nested:
                raise ValueError(f"Nested2TED: entry {_name(key)} is a {type(value).__name__}, "
                                 "not a nested tensor of one part per trajectory; was the data "
                                 "saved by TED2Nested?")
            pieces = value.unbind(0)
            sizes = [p.shape[0] if p.ndim else -1 for p in pieces]
            if sizes != lengths and sizes != [n + 1 for n in lengths]:
                raise ValueError(f"Nested2TED: entry {_name(key)} has trajectories of "
                                 f"{sizes} values; {_ENDS!r} gives {lengths} steps.")
            flat.set(key, torch.cat(pieces))
        for key, scalar in scalars.items():
            flat.set(key, torch.tensor(scalar))
        result = super().__call__(flat)
        if out is None:
            return result
        if out.batch_size != result.batch_size:
            raise ValueError(f"Nested2TED: out has batch size {tuple(out.batch_size)}, the rows "
                             f"{tuple(result.batch_size)}.")
        out.update(result)
        return out


class H5Split(TED2Flat):
    """Splits a :class:`TED2Nested` result into one sub-TensorDict per trajectory.

    The result (batch ``[]``) holds ``traj_<i>`` (``i`` zero-padded to the width of the last
    index, as TorchRL's: ``traj_0`` ... ``traj_9``, ``traj_00`` ... ``traj_10``) for each
    trajectory, its entries regular tensors, plus the non-tensor metadata entries as they
    were. Everything in it is a tensor or a JSON value, which
    :class:`~tdreplay.storages.TensorStorageCheckpointer` writes: register it after
    ``TED2Nested`` to checkpoint (see :mod:`~tdreplay.storages.ted_nested`).
    :class:`H5Combine` rebuilds the nested form.

    A subclass of :class:`~tdreplay.storages.TED2Flat` as TorchRL's (it takes the same
    arguments; ``shift_key`` / ``is_full_key`` name the metadata it checks for); ``shift``
    and ``is_full`` are not used.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> done = torch.tensor([[False], [True], [True]])
    >>> rows = TensorDict({"obs": torch.arange(3.), "next": {"obs": torch.arange(1., 4.),
    ...                    "done": done}}, [3])
    >>> split = H5Split()(TED2Nested()(rows))
    >>> sorted(split.keys())
    ['is_full', 'shift', 'storage_rows', 'traj_0', 'traj_1']
    >>> split["traj_0", "obs"].tolist(), split["traj_1", "obs"].tolist()
    ([0.0, 1.0, 2.0], [2.0, 3.0])
    >>> (Nested2TED()(H5Combine()(split)) == rows).all()
    True
    """

    def __call__(self, data: TensorDictBase, path: Any = None) -> TensorDictBase:
        data = _check_rows(data, "H5Split", "the TensorDict TED2Nested returns (batch "
                           "[trajectories])")
        meta = {}
        for key in (self.shift_key, self.is_full_key, _ROWS):
            meta[key] = _scalar(data, key, "H5Split", "TED2Nested")
        if data.get(_ENDS, None) is None:
            raise KeyError(f"H5Split: the entry {_ENDS!r} is missing; was the data saved by "
                           "TED2Nested?")
        tensors = data.exclude(*meta)
        for key, value in _leaves(tensors):
            if not isinstance(value, torch.Tensor) or not value.is_nested:
                raise ValueError(f"H5Split: entry {_name(key)} is a {type(value).__name__}, not "
                                 "a nested tensor of one part per trajectory; was the data saved "
                                 "by TED2Nested?")
        count = data.batch_size[0]
        width = len(str(max(count - 1, 0)))
        result = TensorDict({f"{_TRAJ}{i:0{width}d}": traj
                             for i, traj in enumerate(tensors.unbind(0))}, batch_size=[])
        for key, scalar in meta.items():
            result.set_non_tensor(key, scalar)
        return result


class H5Combine:
    """Rebuilds the nested form :class:`TED2Nested` returns from :class:`H5Split`'s result.

    The ``traj_<i>`` sub-TensorDicts, in the order of ``i``, become the rows; each of their
    entries a nested tensor; the other entries (the metadata) are kept as non-tensor entries
    (a tensor one, as after a round trip through a file, as its Python value). Every
    trajectory must hold the same entries, of the same dtypes.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> done = torch.tensor([[False], [True], [True]])
    >>> rows = TensorDict({"obs": torch.arange(3.), "next": {"obs": torch.arange(1., 4.),
    ...                    "done": done}}, [3])
    >>> nested = H5Combine()(H5Split()(TED2Nested()(rows)))
    >>> nested.batch_size, [t.tolist() for t in nested["obs"].unbind(0)]
    (torch.Size([2]), [[0.0, 1.0, 2.0], [2.0, 3.0]])
    """

    def __call__(self, data: TensorDictBase, out: TensorDictBase | None = None) -> TensorDictBase:
        """Rebuild the nested form; ``out`` (TorchRL's argument) is not used, as in TorchRL."""
        if not isinstance(data, TensorDictBase):
            raise ValueError(f"H5Combine takes the TensorDict H5Split returns, got "
                             f"{type(data).__name__}.")
        trajs: dict[int, TensorDictBase] = {}
        names = []
        for name in data.keys():
            value = data.get(name)
            if name.startswith(_TRAJ) and name[len(_TRAJ):].isdigit() \
                    and isinstance(value, TensorDictBase) and not is_non_tensor(value):
                trajs[int(name[len(_TRAJ):])] = value
                names.append(name)
        if not trajs:
            raise KeyError(f"H5Combine: no trajectory entries ({_TRAJ}0, {_TRAJ}1, ...); was the "
                           "data split by H5Split?")
        if sorted(trajs) != list(range(len(trajs))):
            raise ValueError(f"H5Combine: the trajectories are numbered {sorted(trajs)}, not "
                             f"0 to {len(trajs) - 1}.")
        ordered = [trajs[i] for i in range(len(trajs))]
        columns: dict[Any, list[torch.Tensor]] = {}
        for i, traj in enumerate(ordered):
            leaves = dict(_leaves(traj))
            if i and set(leaves) != set(columns):
                raise ValueError(f"H5Combine: trajectory {i} holds the entries "
                                 f"{sorted(map(str, leaves))}, trajectory 0 "
                                 f"{sorted(map(str, columns))}.")
            for key, value in leaves.items():
                if not isinstance(value, torch.Tensor) or value.ndim == 0:
                    raise ValueError(f"H5Combine: entry {_name(key)} of trajectory {i} is not a "
                                     "tensor of steps.")
                if i and (value.dtype != columns[key][0].dtype
                          or value.shape[1:] != columns[key][0].shape[1:]):
                    raise ValueError(f"H5Combine: entry {_name(key)} of trajectory {i} is "
                                     f"{value.dtype} {tuple(value.shape)}, of trajectory 0 "
                                     f"{columns[key][0].dtype} {tuple(columns[key][0].shape)}.")
                columns.setdefault(key, []).append(value.as_subclass(torch.Tensor))
        result = TensorDict(batch_size=[len(ordered)])
        for key, pieces in columns.items():
            result.set(key, _nest(pieces, key))
        for key, value in _leaves(data.exclude(*names)):
            result.set_non_tensor(key, _python(value))
        return result
