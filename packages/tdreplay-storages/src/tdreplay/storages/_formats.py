"""The kinds of data a tensor storage holds, and their conversion to and from a TensorDict.

A :class:`~tdreplay.storages.TensorStorage` keeps every kind (TensorDict, tensor, tensorclass,
pytree of tensors) as a TensorDict: :func:`to_tensordict` views the data as one, and the
storage's :class:`DataFormat` turns what it reads back into the kind that was written.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection, is_tensorclass
from torch.utils._pytree import (  # noqa: PLC2701 (no public pytree in torch 2.13)
    tree_flatten,
    tree_unflatten,
    treespec_dumps,
    treespec_loads,
)

from tdreplay.core.checkpoint import CheckpointError
from tdreplay.core.utils import DataKindMismatchError

from ._fast_tensordict import new_tensordict
from ._keys import TENSOR_KEY
from ._ragged_stacks import RaggedStack, split_ragged

KIND_TD = "tensordict"
KIND_TENSOR = "tensor"
KIND_PYTREE = "pytree"
KIND_TC = "tensorclass"
#: lazy stacks of differently shaped TensorDicts (:mod:`~tdreplay.storages._ragged_stacks`)
KIND_LAZY_STACK = "lazy_stack"
#: every kind of data a tensor storage holds
KINDS = (KIND_TD, KIND_TENSOR, KIND_PYTREE, KIND_TC, KIND_LAZY_STACK)

#: the tensorclasses storages of this process have held, by ``"module:qualname"``: how a
#: checkpoint of a class that cannot be imported (defined in a function) finds it again. Only
#: classes this process defined and wrote; weak, so a class that is gone is not kept alive.
_HELD_TENSORCLASSES: weakref.WeakValueDictionary[str, type] = weakref.WeakValueDictionary()


def tensorclass_name(cls: type) -> str:
    """The ``"module:qualname"`` a checkpoint records for tensorclass ``cls``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def hold_tensorclass(cls: type) -> str:
    """Remember tensorclass ``cls`` as one that storages of this process hold (what
    :func:`resolve_tensorclass` falls back on for a class it cannot import); returns its
    :func:`tensorclass_name`."""
    name = tensorclass_name(cls)
    _HELD_TENSORCLASSES[name] = cls
    return name


def resolve_tensorclass(name: Any) -> type:
    """The tensorclass a checkpoint records as ``name`` (``"module:qualname"``, see
    :func:`tensorclass_name`).

    It is imported from its module; one that cannot be (defined in a function, as in
    TorchRL's tests) is taken from the classes that storages of this process have held
    (:func:`hold_tensorclass`). Raises :class:`~tdreplay.core.CheckpointError` when it cannot
    be found here, or is not a tensorclass.

    Examples
    --------
    >>> from tensordict import tensorclass
    >>> resolve_tensorclass("tensordict:NonTensorData").__name__
    'NonTensorData'
    >>> resolve_tensorclass("nowhere:Obs")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.core.checkpoint.CheckpointError: checkpoint holds tensorclass 'nowhere:Obs', ...
    """
    path = name if isinstance(name, str) else ""
    module, _, qualname = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as err:
        held = _HELD_TENSORCLASSES.get(path)
        if held is not None:
            return held
        raise CheckpointError(
            f"checkpoint holds tensorclass {path!r}, which cannot be imported here ("
            f"{err}); define it at module level, or write one item to the storage first."
        ) from err
    if not is_tensorclass(obj):
        raise CheckpointError(f"checkpoint tensorclass {path!r} is not a tensorclass.")
    return obj


def to_tensordict(data: Any, batched: bool, ndim: int = 1) -> tuple[TensorDictBase, str, Any]:
    """View ``data`` as a TensorDict; returns ``(td, kind, extra)``.

    ``extra`` is the pytree structure or the tensorclass of the data, or the
    :class:`~._ragged_stacks.RaggedStack` of a lazy stack of differently shaped TensorDicts
    stacked inside its items (``None`` otherwise).
    Tensors and pytrees get ``ndim`` batch dimensions (``ndim - 1`` for one item, when
    ``batched`` is false), the leading dimensions a storage of that ``ndim`` counts in its
    capacity.

    Examples
    --------
    >>> td, kind, extra = to_tensordict(torch.zeros(3, 2), batched=True)
    >>> kind, td.batch_size, extra
    ('tensor', torch.Size([3]), None)
    """
    if type(data) is TensorDict:  # the most common data, recognised at once (hot path)
        return data, KIND_TD, None
    if is_tensorclass(data):
        # to_dict shares the tensors (to_tensordict would copy them); nested tensorclasses
        # become plain TensorDicts, which from_tensordict turns back into their classes
        td = TensorDict(data.to_dict(retain_none=False), batch_size=data.batch_size,
                        device=data.device)
        return td, KIND_TC, type(data)
    nbatch = ndim if batched else ndim - 1
    if is_tensor_collection(data):
        ragged = split_ragged(data, nbatch)
        if ragged is not None:
            return ragged[0], KIND_LAZY_STACK, ragged[1]
        return data, KIND_TD, None
    if isinstance(data, torch.Tensor):
        if data.ndim < nbatch:
            raise ValueError(f"data has shape {tuple(data.shape)}; a storage with ndim={ndim} "
                             f"needs at least {nbatch} leading dims.")
        return new_tensordict({TENSOR_KEY: data}, data.shape[:nbatch], None), KIND_TENSOR, None
    if isinstance(data, list):
        if not data:
            raise ValueError("cannot write an empty list to a TensorStorage.")
        try:
            stacked = (torch.stack(data) if isinstance(data[0], torch.Tensor)
                       else TensorDict.maybe_dense_stack(data) if is_tensor_collection(data[0])
                       else stack_pytrees(data))
        except RuntimeError as err:  # items of different shapes (TorchRL's error and wording)
            raise RuntimeError(f"Stacking the elements of the list resulted in an error: {err} "
                               "A TensorStorage row has one shape for every item; a list "
                               "storage holds items of any shape.") from err
        return to_tensordict(stacked, batched=True, ndim=ndim)
    leaves, spec = tree_flatten(data)
    if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
        raise TypeError(f"a TensorStorage holds tensors, TensorDicts, tensorclasses or pytrees "
                        f"of tensors; got {type(data).__name__}.")
    bs = leaves[0].shape[:nbatch]
    if any(x.shape[:nbatch] != bs or x.ndim < nbatch for x in leaves):
        raise ValueError(f"every leaf of the pytree must share its {nbatch} leading dims, got "
                         f"shapes {[tuple(x.shape) for x in leaves]}.")
    td = new_tensordict({str(i): x for i, x in enumerate(leaves)}, bs, None)
    return td, KIND_PYTREE, spec


def stack_pytrees(items: list[Any]) -> Any:
    """Stack a list of pytrees of tensors sharing one structure into one pytree."""
    flats, specs = zip(*(tree_flatten(x) for x in items))
    if not flats[0] or not all(isinstance(x, torch.Tensor) for leaves in flats for x in leaves):
        raise TypeError(f"a TensorStorage holds tensors, TensorDicts, tensorclasses or pytrees of "
                        f"tensors; got a list of {type(items[0]).__name__}.")
    if any(spec != specs[0] for spec in specs):
        raise ValueError("the items of a list written to a TensorStorage must share one pytree "
                         "structure.")
    return tree_unflatten([torch.stack(group) for group in zip(*flats)], specs[0])



def _dumped(treespec: Any) -> str:
    """``treespec_dumps(treespec)``; a ``TypeError`` that says what to write instead where
    torch cannot (a namedtuple in the structure: torch serializes only those registered with
    it, under a name every loading process would have to register too)."""
    try:
        return treespec_dumps(treespec)
    except NotImplementedError as err:
        raise TypeError(f"the buffer's data has a pytree structure torch cannot save ({err}); "
                        "write its items as tuples or dicts (or a tensorclass) to checkpoint "
                        "the buffer (nothing was saved).") from err

class DataFormat:
    """The kind of data a tensor storage holds and how to give it back from a TensorDict.

    Parameters
    ----------
    kind : str
        ``"tensordict"``, ``"tensor"``, ``"tensorclass"``, ``"pytree"`` or ``"lazy_stack"``.
    extra : optional
        The pytree structure (``"pytree"``), the tensorclass (``"tensorclass"``) or the
        :class:`~._ragged_stacks.RaggedStack` (``"lazy_stack"``).

    Examples
    --------
    >>> fmt = DataFormat("tensor")
    >>> fmt.from_td(TensorDict({TENSOR_KEY: torch.ones(2)}, [2])).tolist()
    [1.0, 1.0]
    """

    def __init__(self, kind: str = KIND_TD, extra: Any = None) -> None:
        self.kind = kind
        self.treespec = extra if kind == KIND_PYTREE else None
        self.tensorclass = extra if kind == KIND_TC else None
        if self.tensorclass is not None:
            hold_tensorclass(self.tensorclass)
        self.lazy_stack = extra if kind == KIND_LAZY_STACK else None
        #: the pytree structure, tensorclass or lazy stack (``None`` for other kinds)
        self.extra = (self.treespec if kind == KIND_PYTREE else self.lazy_stack
                      if kind == KIND_LAZY_STACK else self.tensorclass)

    def check_same(self, kind: str, extra: Any) -> None:
        """Raise unless data of ``kind`` / ``extra`` can be written next to this format's."""
        if kind == self.kind and (extra is None or extra == self.extra):
            return
        if KIND_LAZY_STACK in (kind, self.kind):
            what = {KIND_LAZY_STACK: "lazy stacks of differently shaped TensorDicts"}
            raise ValueError(
                f"this storage holds {what.get(self.kind, self.kind)} "
                f"{'' if self.extra is None else self.extra}; got {what.get(kind, kind)} "
                f"{'' if extra is None else extra}: every item of a tensor storage has the "
                "same shapes (use LazyStackStorage for items of any shape).")
        if kind != self.kind:
            raise DataKindMismatchError(f"this storage holds {self.kind} data; got {kind} "
                                        "data.")
        if kind == KIND_TC:
            name = getattr(self.tensorclass, "__name__", None)
            raise DataKindMismatchError(f"this storage holds {name} tensorclass data; got "
                                        f"{extra.__name__}.")
        raise ValueError(f"data has pytree structure {extra}, but this storage holds "
                         f"{self.treespec}.")

    def from_td(self, td: TensorDictBase) -> Any:
        """The data of this format that ``td`` holds (``td`` itself for TensorDicts)."""
        if self.kind == KIND_TD:
            return td
        if self.kind == KIND_TENSOR:
            return td.get(TENSOR_KEY)
        extra = self.extra
        if extra is None:  # laid out by another process, which records no tensorclass
            raise RuntimeError(f"this storage holds {self.kind} data of a structure unknown "
                               "in this process: write one item here first.")
        if self.kind == KIND_TC:
            return extra.from_tensordict(td)
        if self.kind == KIND_LAZY_STACK:
            return extra.restack(td)
        return tree_unflatten([td.get(str(i)) for i in range(extra.num_leaves)], extra)

    def meta(self) -> dict[str, str | None]:
        """The pytree structure / tensorclass / lazy stack of the data, as strings a checkpoint
        can hold."""
        cls = self.tensorclass
        out = {
            "treespec": _dumped(self.treespec) if self.treespec is not None else None,
            "tensorclass": None if cls is None else tensorclass_name(cls),
        }
        if self.lazy_stack is not None:  # (absent otherwise: metadata of other kinds unchanged)
            out["lazy_stack"] = self.lazy_stack.describe()
        return out

    def check_meta(self, meta: dict[str, Any]) -> None:
        """Raise :class:`~tdreplay.core.CheckpointError` unless a checkpoint's metadata names
        this format's kind (and its pytree structure / tensorclass, when it has one)."""
        if meta.get("kind", self.kind) != self.kind:
            raise CheckpointError(f"checkpoint holds {meta['kind']} data, this storage "
                                  f"{self.kind}.")
        for name, ours in self.meta().items():
            if ours is not None and meta.get(name) != ours:
                raise CheckpointError(f"checkpoint {name} {meta.get(name)!r} differs from this "
                                      f"storage's {ours!r}.")

    @staticmethod
    def resolve_extra(meta: dict[str, Any]) -> Any:
        """The treespec or tensorclass a checkpoint's metadata names (``None`` for other kinds).

        A tensorclass is found by :func:`resolve_tensorclass` (imported from its module, or
        one of the classes that storages of this process have held: the storage that was
        saved, typically). Raises :class:`~tdreplay.core.CheckpointError` when it cannot be
        rebuilt here.

        Examples
        --------
        >>> from tensordict import tensorclass
        >>> def make():
        ...     @tensorclass
        ...     class Local:
        ...         x: torch.Tensor
        ...     return Local
        >>> Local = make()
        >>> fmt = DataFormat(KIND_TC, Local)  # a storage holding Local data
        >>> DataFormat.resolve_extra({"kind": KIND_TC, **fmt.meta()}) is Local
        True
        """
        kind = meta.get("kind", KIND_TD)
        if kind not in KINDS:  # (a damaged state: the storage could not read its rows back)
            raise CheckpointError(f"checkpoint holds data of kind {kind!r}, none of "
                                  f"{list(KINDS)}.")
        if kind == KIND_LAZY_STACK:
            try:
                return RaggedStack.parse(meta.get("lazy_stack"))
            except ValueError as err:
                raise CheckpointError(f"checkpoint holds lazy stacks: {err}") from err
        if kind == KIND_PYTREE:
            if not meta.get("treespec"):
                raise CheckpointError("checkpoint holds pytree data but no pytree structure.")
            return treespec_loads(meta["treespec"])
        if kind == KIND_TC:
            return resolve_tensorclass(meta.get("tensorclass") or "")
        return None
