"""Tensorclasses nested in a tensor storage's data: which level holds which class.

A tensor storage lays its data out by leaves (:class:`~._layout.TensorLayout`) and builds plain
TensorDicts when it reads. A tensorclass nested in the data (``td["obs"]`` an ``Obs``, at any
depth: in a TensorDict, in another tensorclass, in a field of the top-level tensorclass) is
recorded by the path of its level (:data:`NestedClasses`, found by
:func:`nested_tensorclasses`), and reads give it back as TorchRL's storages do: the layout's
builder makes the class at that level (chosen when the storage is laid out, so that reading
data without nested tensorclasses costs nothing more), and :func:`with_classes` makes it in a
TensorDict read otherwise. Checkpoints record each class by name (:func:`classes_record`,
:func:`classes_from_record`) with the functions that name the top-level tensorclass
(:func:`~._formats.tensorclass_name`, :func:`~._formats.resolve_tensorclass`).

Examples
--------
>>> import torch
>>> from tensordict import TensorDict, tensorclass
>>> @tensorclass
... class Obs:
...     pos: torch.Tensor
>>> td = TensorDict(obs=Obs(pos=torch.zeros(3, 2), batch_size=[3]), r=torch.ones(3),
...                 batch_size=[3])
>>> classes = nested_tensorclasses(td)
>>> classes == {("obs",): Obs}
True
>>> plain = td.to_dict()  # what a layout of leaves rebuilds: plain TensorDicts
>>> type(with_classes(TensorDict(plain, [3]), inner_first(classes))["obs"]).__name__
'Obs'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDictBase,
    is_tensor_collection,
    is_tensorclass,
)

from tdreplay.core.checkpoint import CheckpointError

from ._formats import KIND_TC, KIND_TD, hold_tensorclass, resolve_tensorclass, tensorclass_name

__all__ = ["NestedClasses", "check_written_classes", "classes_from_record", "classes_of",
           "classes_record", "inner_first", "nested_tensorclasses", "record_names",
           "unknown_tensorclass", "with_classes"]

#: The tensorclass of each nested level of a storage's data, by path: ``{("obs",): Obs}`` for
#: a TensorDict whose ``"obs"`` entry is an ``Obs``. Plain TensorDict levels are left out.
NestedClasses = dict[tuple[str, ...], type]


def _is_level(value: Any) -> bool:
    """Whether ``value`` is a nested level of data (a TensorDict or a tensorclass), not a
    leaf (a tensor, or non-tensor data, which tensordict holds as tensorclasses)."""
    return is_tensor_collection(value) and not isinstance(value, (NonTensorData, NonTensorStack))


def nested_tensorclasses(data: Any) -> NestedClasses:
    """The tensorclass of each level nested in ``data`` (a TensorDict or a tensorclass, whose
    own class is not included), by path; ``{}`` for data without nested tensorclasses.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict, tensorclass
    >>> @tensorclass
    ... class Inner:
    ...     a: torch.Tensor
    >>> @tensorclass
    ... class Outer:
    ...     inner: Inner
    >>> td = TensorDict(deep=TensorDict(o=Outer(inner=Inner(a=torch.ones(2), batch_size=[2]),
    ...                                         batch_size=[2]), batch_size=[2]), batch_size=[2])
    >>> sorted((path, cls.__name__) for path, cls in nested_tensorclasses(td).items())
    [(('deep', 'o'), 'Outer'), (('deep', 'o', 'inner'), 'Inner')]
    """
    out: NestedClasses = {}
    stack: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while stack:
        path, node = stack.pop()
        for name, value in node.items():
            if not _is_level(value):
                continue
            level = (*path, name)
            if is_tensorclass(value):
                out[level] = type(value)
            stack.append((level, value))
    return out


def classes_of(data: Any, td: TensorDictBase, kind: str) -> NestedClasses:
    """The tensorclasses nested in ``data``, which :func:`~._formats.to_tensordict` viewed as
    ``td`` of ``kind``: those of ``td`` for TensorDicts, those of the tensorclass itself (or
    of the first of a list of them) for a tensorclass (its TensorDict view holds plain
    TensorDicts), none for other kinds.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict, tensorclass
    >>> from tdreplay.storages._formats import to_tensordict
    >>> @tensorclass
    ... class Obs:
    ...     pos: torch.Tensor
    >>> @tensorclass
    ... class Holder:
    ...     td: TensorDict
    >>> data = Holder(td=TensorDict(o=Obs(pos=torch.ones(2), batch_size=[2]), batch_size=[2]),
    ...               batch_size=[2])
    >>> td, kind, _ = to_tensordict(data, batched=True)
    >>> type(td["td", "o"]).__name__, classes_of(data, td, kind) == {("td", "o"): Obs}
    ('TensorDict', True)
    """
    if kind == KIND_TD:
        return nested_tensorclasses(td)
    if kind == KIND_TC:
        return nested_tensorclasses(data[0] if isinstance(data, list) else data)
    return {}


def inner_first(classes: Mapping[tuple[str, ...], type]) -> tuple[tuple[tuple[str, ...], type],
                                                                   ...]:
    """``classes`` as ``(path, class)`` pairs, inner levels first (then by path): the order
    :func:`with_classes` makes them in, a parent's class once its children's are made."""
    return tuple(sorted(classes.items(), key=lambda item: (-len(item[0]), item[0])))


def with_classes(td: TensorDictBase, classes: Iterable[tuple[tuple[str, ...], Any]]
                 ) -> TensorDictBase:
    """``td`` (plain TensorDicts at every level) with the level at each path of ``classes``
    (:func:`inner_first` pairs) made that tensorclass, in place; what the class raises when
    the level's entries are not its fields."""
    for path, cls in classes:
        key = path[0] if len(path) == 1 else path
        td.set(key, cls.from_tensordict(td.get(key)))
    return td


def check_written_classes(held: NestedClasses, written: NestedClasses,
                          is_level: Callable[[tuple[str, ...]], bool]) -> None:
    """Raise ``TypeError`` naming the entry when data with the nested tensorclasses
    ``written`` would be read back from a storage holding ``held`` as other classes: a
    tensorclass where the storage holds a plain TensorDict level (``is_level``), or another
    tensorclass. A TensorDict (or a dict) where the storage holds a tensorclass is accepted
    and reads back as that class, as TorchRL's storages do; a level the storage lacks is left
    to the check of the keys (or becomes a new entry).

    Examples
    --------
    >>> import torch
    >>> from tensordict import tensorclass
    >>> @tensorclass
    ... class Obs:
    ...     pos: torch.Tensor
    >>> @tensorclass
    ... class Other:
    ...     pos: torch.Tensor
    >>> check_written_classes({("obs",): Obs}, {}, lambda path: True)  # a TensorDict: fine
    >>> check_written_classes({("obs",): Obs}, {("obs",): Other}, lambda path: True)
    Traceback (most recent call last):
    ...
    TypeError: entry 'obs' is tensorclass Other, but this storage holds Obs there: ...
    """
    for path, cls in written.items():
        ours = held.get(path)
        if ours is cls or (ours is None and not is_level(path)):
            continue
        key = path[0] if len(path) == 1 else path
        there = "a TensorDict" if ours is None else ours.__name__
        raise TypeError(
            f"entry {key!r} is tensorclass {cls.__name__}, but this storage holds {there} "
            f"there: its rows would read back as {there} (nothing was written); write "
            f"{'a TensorDict' if ours is None else f'{there} or a TensorDict'} there (a "
            "ListStorage keeps each item as it is written).")


def classes_record(classes: Mapping[tuple[str, ...], type]) -> list[list[Any]]:
    """``classes`` as a checkpoint records them: ``[[path as a list, "module:qualname"],
    ...]``, inner levels first (JSON values; :func:`classes_from_record` reads them back).

    Examples
    --------
    >>> import torch
    >>> from tensordict import tensorclass
    >>> @tensorclass
    ... class Obs:
    ...     pos: torch.Tensor
    >>> record = classes_record({("a", "b"): Obs})
    >>> record  # doctest: +ELLIPSIS
    [[['a', 'b'], '...:Obs']]
    >>> classes_from_record(record) == {("a", "b"): Obs}  # (held by this process)
    True
    """
    return [[list(path), hold_tensorclass(cls) if is_tensorclass(cls) else tensorclass_name(cls)]
            for path, cls in inner_first(classes)]


def record_names(record: Any) -> dict[tuple[str, ...], str]:
    """The ``{path: "module:qualname"}`` of a checkpoint's record (``None``: a checkpoint
    without one, saved before nested tensorclasses were recorded or of data without any:
    ``{}``); :class:`~tdreplay.core.CheckpointError` for anything that is not a record."""
    if record is None:
        return {}
    names: dict[tuple[str, ...], str] = {}
    try:
        for path, name in record:
            if not (isinstance(name, str) and isinstance(path, (list, tuple)) and path
                    and all(isinstance(part, str) for part in path)):
                raise ValueError
            names[tuple(path)] = name
    except (TypeError, ValueError):
        raise CheckpointError(f"checkpoint nested tensorclasses {record!r} are not a list of "
                              "[key path, 'module:qualname'] pairs.") from None
    return names


def classes_from_record(record: Any, unknown_ok: bool = False) -> NestedClasses:
    """The nested tensorclasses a checkpoint records (:func:`classes_record`; ``None``: none),
    each found by :func:`~._formats.resolve_tensorclass`:
    :class:`~tdreplay.core.CheckpointError` when one cannot be found here, or with
    ``unknown_ok`` a stand-in of the same name whose reads raise (:func:`unknown_tensorclass`:
    the files of a memory-mapped storage another process laid out are mapped all the same).

    Examples
    --------
    >>> classes_from_record([[["obs"], "tensordict:NonTensorData"]])[("obs",)].__name__
    'NonTensorData'
    >>> classes_from_record(None)
    {}
    >>> classes_from_record([[["obs"], "nowhere:Obs"]], unknown_ok=True)[("obs",)]
    <class 'nowhere.Obs'>
    """
    out: NestedClasses = {}
    for path, name in record_names(record).items():
        try:
            out[path] = resolve_tensorclass(name)
        except CheckpointError as err:
            if not unknown_ok:
                raise
            out[path] = unknown_tensorclass(name, path, str(err))
    return out


def unknown_tensorclass(name: str, path: tuple[str, ...], why: str) -> type:
    """A stand-in for the tensorclass named ``name`` (``"module:qualname"``) at ``path``,
    which this process cannot find (``why``): it keeps the name (a checkpoint of the storage
    records it) and its ``from_tensordict`` (what a read calls) raises ``RuntimeError``.

    Examples
    --------
    >>> Unknown = unknown_tensorclass("nowhere:Obs", ("obs",), "not importable")
    >>> Unknown.from_tensordict(None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: this storage holds tensorclass 'nowhere:Obs' at 'obs', unknown in this process ...
    """
    module, _, qualname = name.partition(":")
    key = path[0] if len(path) == 1 else path

    def from_tensordict(cls: type, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"this storage holds tensorclass {name!r} at {key!r}, unknown in "
                           f"this process ({why}): define it at module level to read these "
                           "rows here.")

    return type(qualname.rpartition(".")[2] or "Unknown", (), {
        "__module__": module, "__qualname__": qualname,
        "from_tensordict": classmethod(from_tensordict)})
