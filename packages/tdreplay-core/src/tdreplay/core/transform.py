"""The :class:`Transform` contract, :class:`Compose`, and the wrappers a buffer uses.

A buffer calls ``transform(data)`` on every sample (read side) and ``transform.inv(data)`` on
every write (write side). ``tdreplay.transforms`` builds its transforms on this base.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import torch
from tensordict import TensorDictBase, is_tensor_collection

from .utils import NestedKey, is_int, normalize_keys


class Transform:
    """Base class of transforms: maps ``in_keys`` to ``out_keys`` on sample, back on extend.

    Subclasses override :meth:`_apply_transform` (one tensor in, one tensor out, read side) and
    optionally :meth:`_inv_apply_transform` (write side), or :meth:`forward` / :meth:`inv` for
    transforms that need the whole TensorDict.

    Parameters
    ----------
    in_keys, out_keys : sequence of nested keys
        Entries read and written on sample. ``out_keys`` defaults to ``in_keys``.
    in_keys_inv, out_keys_inv : sequence of nested keys
        The inverse's entries, applied on extend (only when the transform is inverted), in
        TorchRL's direction: ``out_keys_inv[i]`` (the name in the data given to ``extend``) is
        read and ``in_keys_inv[i]`` (the stored name) written. ``out_keys_inv`` defaults to
        ``in_keys_inv``.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> class Double(Transform):
    ...     def _apply_transform(self, x):
    ...         return x * 2
    >>> Double(in_keys=["a"], out_keys=["b"])(TensorDict(a=torch.ones(2), batch_size=[2]))["b"]
    tensor([2., 2.])
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        self.in_keys = normalize_keys(in_keys, "in_keys")
        self.out_keys = (normalize_keys(out_keys, "out_keys") if out_keys is not None
                         else list(self.in_keys))
        if len(self.in_keys) != len(self.out_keys):
            raise ValueError(
                f"in_keys and out_keys must have the same length, got {len(self.in_keys)} "
                f"in_keys {self.in_keys} and {len(self.out_keys)} out_keys {self.out_keys}."
            )
        self.in_keys_inv = normalize_keys(in_keys_inv, "in_keys_inv")
        self.out_keys_inv = (
            normalize_keys(out_keys_inv, "out_keys_inv") if out_keys_inv is not None
            else list(self.in_keys_inv)
        )
        if len(self.in_keys_inv) != len(self.out_keys_inv):
            raise ValueError(
                f"in_keys_inv and out_keys_inv must have the same length, got {self.in_keys_inv} "
                f"and {self.out_keys_inv}."
            )

    #: True for a transform that keeps state of the buffer's writes which every process writing
    #: a shared buffer must see; it overrides :meth:`share_memory_` (a buffer refuses to share it
    #: otherwise)
    requires_shared_write_state: bool = False

    #: True for a transform whose state (running statistics, fitted ``loc`` / ``scale``, ...)
    #: belongs to the buffer's checkpoint: a buffer's ``state_dict`` / ``dumps`` save its
    #: :meth:`state_dict` and ``load_state_dict`` / ``loads`` check it (with
    #: :meth:`check_state_dict`) before anything changes, then restore it.
    has_state: bool = False

    #: False for a transform that already does its work on the write side (its :meth:`inv`
    #: runs on ``extend``, e.g. an n-step transform holding steps between writes): swapping its
    #: sides would run that work, and change its state, on every sample, so
    #: :class:`InvertedTransform` (``append_transform(t, invert=True)``) refuses it.
    invertible: bool = True

    def state_dict(self) -> dict[str, Any]:
        """The transform's state (``{}`` for a transform without state)."""
        return {}

    def check_state_dict(self, state_dict: Any) -> None:
        """Raise ``ValueError`` / ``TypeError`` / ``KeyError`` naming the field when
        :meth:`load_state_dict` would refuse ``state_dict``; changes nothing. The base accepts
        only ``{}`` (a transform without state); a transform with state overrides it.

        Examples
        --------
        >>> Transform().check_state_dict({"loc": 1})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Transform holds no state; got state_dict keys ['loc'].
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"{type(self).__name__} state_dict must be a dict, got "
                            f"{type(state_dict).__name__}.")
        if state_dict:
            raise ValueError(f"{type(self).__name__} holds no state; got state_dict keys "
                             f"{sorted(map(str, state_dict))}.")

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore what :meth:`state_dict` returned (checked first)."""
        self.check_state_dict(state_dict)

    def share_memory_(self) -> Transform:
        """Move the transform's write state to memory shared between processes; returns it.

        What ``rb.share()`` calls. Nothing to move by default; ``RuntimeError`` for a transform
        that declares :attr:`requires_shared_write_state` without overriding this.

        Examples
        --------
        >>> class Counts(Transform):
        ...     requires_shared_write_state = True
        >>> Counts().share_memory_()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        RuntimeError: Counts keeps replay-buffer write state but does not implement ...
        """
        if self.requires_shared_write_state:
            raise RuntimeError(
                f"{type(self).__name__} keeps replay-buffer write state but does not implement "
                "share_memory_(). Use a centralized writer, a Ray-backed buffer, or a transform "
                "that supports shared replay-buffer write state.")
        return self

    def drop_held_items(self) -> None:
        """Forget the items written through the transform that it holds and has not handed to
        the storage yet; ``rb.empty()`` calls it. The base holds none. ``MultiStepTransform``
        drops the steps it holds back, which the first write after the empty would otherwise
        join (as steps of the same run) to the new steps.

        Examples
        --------
        >>> Transform().drop_held_items()  # nothing held
        """

    # ---- per-tensor hooks ------------------------------------------------------------------------
    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value

    # ---- TensorDict level ------------------------------------------------------------------------
    def forward(self, data: TensorDictBase) -> TensorDictBase:
        """Read-side transform (applied to samples)."""
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            data.set(out_key, self._apply_transform(self.read_entry(data, in_key)))
        return data

    def inv(self, data: TensorDictBase) -> TensorDictBase | None:
        """Write-side transform (applied on extend when the transform is inverted).

        Works on a shallow copy, so entries it sets do not appear in the caller's TensorDict.
        An override may return ``None`` to drop the data (a filter, as TorchRL's): the buffer
        then writes nothing.
        """
        if not self.in_keys_inv:
            return data
        data = data.copy()
        for in_key, out_key in zip(self.in_keys_inv, self.out_keys_inv):  # out read, in written
            data.set(in_key, self._inv_apply_transform(self.read_entry(data, out_key)))
        return data

    def read_entry(self, data: TensorDictBase, key: NestedKey) -> Any:
        """The entry ``key`` of ``data``, for a transform to work on: a ``KeyError`` naming the
        transform, the key and the keys ``data`` has when it is missing (``data.get`` would
        return ``None`` or raise without them).

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> t = Transform(in_keys=["obs"])
        >>> t.read_entry(TensorDict({"obs": torch.ones(2)}, [2]), "obs").tolist()
        [1.0, 1.0]
        >>> t.read_entry(TensorDict({"obs": torch.ones(2)}, [2]), "reward")
        Traceback (most recent call last):
        ...
        KeyError: "Transform: key 'reward' is missing from the data (present: ['obs'])."
        """
        value = data.get(key, None)
        if value is None:
            raise KeyError(
                f"{type(self).__name__}: key {key!r} is missing from the data (present: "
                f"{sorted(map(str, data.keys(True, True)))})."
            )
        return value

    def __call__(self, data: Any) -> Any:
        return self.forward(data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(keys={self.in_keys})"


class CallableTransform(Transform):
    """Wraps a plain callable ``fn(data) -> data`` as a read-side transform.

    Examples
    --------
    >>> CallableTransform(lambda x: x + 1)(torch.zeros(2))
    tensor([1., 1.])
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"transform must be a Transform or a callable, got "
                            f"{type(fn).__name__}.")
        self.fn = fn

    def forward(self, data: Any) -> Any:
        out = self.fn(data)
        return data if out is None else out

    def inv(self, data: Any) -> Any:
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self.fn, '__name__', repr(self.fn))})"


class InvertedTransform(Transform):
    """Swaps a transform's sides: its ``inv`` runs on sample and its forward on extend.

    This is what ``append_transform(t, invert=True)`` installs. On the write side a TensorDict
    is shallow-copied before the wrapped forward runs, so entries it sets, renames or removes do
    not show in the caller's TensorDict (in-place edits of its tensors still do).

    Examples
    --------
    >>> t = InvertedTransform(CallableTransform(lambda x: x * 10))
    >>> t.inv(torch.ones(1)), t(torch.ones(1))
    (tensor([10.]), tensor([1.]))
    """

    def __init__(self, transform: Transform | Callable[[Any], Any]) -> None:
        super().__init__()
        transform = as_transform(transform)
        if not transform.invertible:
            raise ValueError(
                f"invert=True: {type(transform).__name__} already works on the write side (its "
                f"inv runs on every extend) and cannot be inverted; append it without invert "
                f"(got {transform!r}).")
        self.transform = transform

    def share_memory_(self) -> Transform:
        self.transform.share_memory_()
        return self

    def drop_held_items(self) -> None:
        self.transform.drop_held_items()

    @property
    def has_state(self) -> bool:  # type: ignore[override]
        return self.transform.has_state

    def state_dict(self) -> dict[str, Any]:
        return self.transform.state_dict()

    def check_state_dict(self, state_dict: Any) -> None:
        self.transform.check_state_dict(state_dict)

    def load_state_dict(self, state_dict: Any) -> None:
        self.transform.load_state_dict(state_dict)

    def forward(self, data: Any) -> Any:
        return self.transform.inv(data)

    def inv(self, data: Any) -> Any:
        if is_tensor_collection(data):
            data = data.copy()
        return self.transform.forward(data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.transform!r})"


def as_transform(transform: Transform | Callable[[Any], Any]) -> Transform:
    """Return ``transform`` if it is a :class:`Transform`, else wrap the callable."""
    if isinstance(transform, Transform):
        return transform
    return CallableTransform(transform)


class Compose(Transform):
    """Chains transforms: forward in order, ``inv`` in reverse order.

    Plain callables are accepted and wrapped with :class:`CallableTransform`. As TorchRL's,
    the transforms may also come as one list (``Compose([t1, t2])``) or as
    ``transforms=[t1, t2]``.

    Examples
    --------
    >>> c = Compose(lambda x: x + 1, lambda x: x * 2)
    >>> c(torch.ones(1)), len(c)
    (tensor([4.]), 2)
    >>> len(Compose([lambda x: x, lambda x: x])), len(Compose(transforms=[lambda x: x]))
    (2, 1)
    """

    def __init__(self, *transforms: Transform | Callable[[Any], Any],
                 **kwargs: list[Transform | Callable[[Any], Any]]) -> None:
        super().__init__()
        if "transforms" in kwargs:
            if transforms:
                raise TypeError("Compose takes the transforms as arguments or as transforms=, "
                                "not both.")
            given: Any = kwargs.pop("transforms")
        elif len(transforms) == 1 and isinstance(transforms[0], (list, tuple)):
            given = transforms[0]
        else:
            given = transforms
        if kwargs:
            raise TypeError(f"Compose got unexpected keyword arguments {sorted(kwargs)}.")
        if not isinstance(given, (list, tuple)):
            raise TypeError(f"transforms must be a list of transforms, got "
                            f"{type(given).__name__}.")
        self.transforms: list[Transform] = [as_transform(t) for t in given]

    def forward(self, data: Any) -> Any:
        for t in self.transforms:
            data = t(data)
        return data

    def inv(self, data: Any) -> Any:
        for t in reversed(self.transforms):
            data = t.inv(data)
            if data is None:  # an item dropped (e.g. a stale one): nothing left to transform
                return None
        return data

    # ---- state: that of the transforms with state, by position and type ------------------------
    @property
    def has_state(self) -> bool:  # type: ignore[override]
        """Whether any of the transforms has state."""
        return any(t.has_state for t in self.transforms)

    @property
    def invertible(self) -> bool:  # type: ignore[override]
        """True unless one of the chained transforms is not invertible."""
        return all(t.invertible for t in self.transforms)

    def _stateful(self) -> dict[str, Transform]:
        return {f"{i}:{type(t).__name__}": t for i, t in enumerate(self.transforms)
                if t.has_state}

    def state_dict(self) -> dict[str, Any]:
        """``{"<position>:<class>": state}`` of each transform with state.

        Examples
        --------
        >>> class Count(Transform):
        ...     has_state = True
        ...     n = 0
        ...     def state_dict(self): return {"n": self.n}
        ...     def check_state_dict(self, state): int(state["n"])
        ...     def load_state_dict(self, state): self.n = state["n"]
        >>> c = Compose(lambda x: x, Count())
        >>> c.state_dict()
        {'1:Count': {'n': 0}}
        """
        return {name: t.state_dict() for name, t in self._stateful().items()}

    def check_state_dict(self, state_dict: Any) -> None:
        """Refuse a state whose transforms with state are not these (by position and class)
        or that one of them refuses (``ValueError`` naming it); changes nothing."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"Compose state_dict must be a dict, got "
                            f"{type(state_dict).__name__}.")
        parts = self._stateful()
        if set(state_dict) != set(parts):
            raise ValueError(f"the saved transforms with state are {sorted(state_dict)}, but "
                             f"these are {sorted(parts)} (position:class).")
        for name, t in parts.items():
            try:
                t.check_state_dict(state_dict[name])
            except (ValueError, TypeError, KeyError) as err:
                raise ValueError(f"transform {name}: {err}") from err

    def load_state_dict(self, state_dict: Any) -> None:
        self.check_state_dict(state_dict)
        for name, t in self._stateful().items():
            t.load_state_dict(state_dict[name])

    def drop_held_items(self) -> None:
        """:meth:`Transform.drop_held_items` of every transform."""
        for transform in self.transforms:
            transform.drop_held_items()

    def append(self, transform: Transform | Callable[[Any], Any]) -> None:
        """Add a transform at the end.

        The list is replaced, not changed in place (here and in :meth:`insert`): a thread
        that is running the transforms meanwhile (a ``sample`` or an ``extend`` of the buffer,
        outside its lock) goes on with the list it started with, instead of running one of
        them twice or skipping one as the list shifts under it."""
        self.transforms = [*self.transforms, as_transform(transform)]

    def insert(self, index: int, transform: Transform | Callable[[Any], Any]) -> None:
        """Insert a transform at ``index``, within ``[-len(self), len(self)]`` as TorchRL's.

        Examples
        --------
        >>> c = Compose(lambda x: x + 1)
        >>> c.insert(0, lambda x: x * 10)
        >>> c(torch.tensor(1)).item()
        11
        >>> c.insert(5, lambda x: x)
        Traceback (most recent call last):
        ...
        ValueError: index must be between -2 and 2 (the number of transforms), got 5.
        """
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"index must be an int, got {type(index).__name__}.")
        n = len(self.transforms)
        if not -n <= index <= n:
            raise ValueError(f"index must be between {-n} and {n} (the number of transforms), "
                             f"got {index}.")
        transforms = list(self.transforms)  # (replaced whole: see append)
        transforms.insert(index, as_transform(transform))
        self.transforms = transforms

    def __len__(self) -> int:
        return len(self.transforms)

    @overload
    def __getitem__(self, index: int) -> Transform: ...

    @overload
    def __getitem__(self, index: slice) -> Compose: ...

    def __getitem__(self, index: int | slice) -> Transform | Compose:
        """The transform at ``index`` (itself), or for a slice a new :class:`Compose` of deep
        copies of those transforms, as TorchRL's (which clones them): usable on its own or in a
        buffer, and state kept by the copies (statistics, buffered steps) is independent of
        this Compose's.

        Examples
        --------
        >>> c = Compose(lambda x: x + 1, lambda x: x * 2, lambda x: x - 3)
        >>> tail = c[1:]
        >>> type(tail).__name__, len(tail), tail(torch.tensor(5)).item()
        ('Compose', 2, 7)
        >>> c[0] is c.transforms[0]
        True
        """
        if isinstance(index, slice):
            return Compose(*copy.deepcopy(self.transforms[index]))
        if not is_int(index):  # bool is refused too (an int subclass, but not a position)
            raise TypeError(f"Compose takes an int or a slice as index, got {index!r} "
                            f"({type(index).__name__}).")
        position = operator.index(index)
        if not -len(self.transforms) <= position < len(self.transforms):
            raise IndexError(f"Compose index {position} is out of range: this Compose has "
                             f"{len(self.transforms)} transforms.")
        return self.transforms[position]

    def __iter__(self) -> Iterator[Transform]:
        return iter(self.transforms)

    def __repr__(self) -> str:
        inner = ", ".join(repr(t) for t in self.transforms)
        return f"Compose({inner})"
