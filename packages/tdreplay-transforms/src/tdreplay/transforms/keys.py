"""Transforms that rename, keep or drop entries: ``RenameTransform``, ``SelectTransform``,
``ExcludeTransform``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag

from ._utils import keys_arg, require_tensordict

# What TorchRL's SelectTransform keeps besides the selected keys when it has no parent env.
_REWARD_KEY = "reward"
_DONE_KEY = "done"


class RenameTransform(Transform):
    """Renames entries: ``in_keys[i]`` becomes ``out_keys[i]`` on sample.

    Parameters
    ----------
    in_keys, out_keys : sequence of nested keys
        Entries to rename and their new names (same length).
    in_keys_inv, out_keys_inv : sequence of nested keys, optional
        Entries renamed on extend, in the opposite direction, as in TorchRL:
        ``out_keys_inv[i]`` (the name in the data given to ``extend``) is stored as
        ``in_keys_inv[i]``. Passing the same pair to ``in_keys``/``out_keys`` and
        ``in_keys_inv``/``out_keys_inv`` therefore round-trips: written as ``in_keys``, read
        back as ``out_keys``.
    create_copy : bool
        Keep the original entries as well (the new names point to the same tensors).

    All entries are read before any is written, so names can be swapped. A missing entry raises
    ``KeyError`` naming it, and leaves the data as it was (on extend: nothing is written). An
    entry already present under a target name is replaced (overwritten without warning, as in
    TorchRL). A target name given twice (in ``out_keys``, or in ``in_keys_inv``) is refused with
    ``ValueError``: one of the two entries would be lost.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({("some", "key"): torch.zeros(2), "b": torch.ones(2)}, [2])
    >>> out = RenameTransform([("some", "key"), "b"], ["renamed", ("x", "y")])(td)
    >>> sorted(map(str, out.keys(True, True)))
    ["('x', 'y')", 'renamed']

    On extend, ``out_keys_inv`` is renamed back to ``in_keys_inv``:

    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> t = RenameTransform(["obs"], ["observation"], in_keys_inv=["action"],
    ...                     out_keys_inv=["action_env"])
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), transform=t)
    >>> _ = rb.extend(TensorDict({"obs": torch.zeros(2), "action_env": torch.ones(2)}, [2]))
    >>> sorted(rb.storage[:].keys())
    ['action', 'obs']
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey,
        out_keys: Sequence[NestedKey] | NestedKey,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        create_copy: bool = False,
    ) -> None:
        if out_keys is None:
            raise ValueError("RenameTransform needs out_keys: the new names of in_keys.")
        if in_keys_inv is not None and out_keys_inv is None:
            raise ValueError("RenameTransform: in_keys_inv given without out_keys_inv (the names "
                             "these entries have in the data given to extend).")
        super().__init__(keys_arg(in_keys, "in_keys"), keys_arg(out_keys, "out_keys"),
                         keys_arg(in_keys_inv, "in_keys_inv"),
                         keys_arg(out_keys_inv, "out_keys_inv"))
        # two entries renamed to one name: all but the last would be dropped silently
        for name, targets in (("out_keys", self.out_keys), ("in_keys_inv", self.in_keys_inv)):
            repeated = [key for i, key in enumerate(targets) if key in targets[:i]]
            if repeated:
                raise ValueError(f"RenameTransform: {name} names {repeated[0]!r} more than once; "
                                 "each entry needs its own new name (one would be lost).")
        self.create_copy = check_flag(create_copy, "RenameTransform: create_copy")

    def _rename(self, data: TensorDictBase, sources: list[NestedKey],
                targets: list[NestedKey]) -> TensorDictBase:
        values = [self.read_entry(data, key) for key in sources]
        if not self.create_copy:
            for key in sources:
                data.del_(key)
        for key, value in zip(targets, values):
            data.set(key, value)
        return data

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        return self._rename(data, self.in_keys, self.out_keys)

    def inv(self, data: TensorDictBase) -> TensorDictBase:
        if not self.in_keys_inv:
            return data
        require_tensordict(self, data)
        # TorchRL's direction: the extend-side name (out_keys_inv) is stored as in_keys_inv.
        return self._rename(data.copy(), self.out_keys_inv, self.in_keys_inv)


class _KeyFilter(Transform):
    """Shared by select/exclude: filters on sample, or on extend with ``inverse=True``."""

    def __init__(self, keys: Sequence[Any], inverse: bool) -> None:
        inverse = check_flag(inverse, f"{type(self).__name__}: inverse")
        flat: list[Any] = []
        for key in keys:  # accept both f("a", "b") and f(["a", "b"])
            flat.extend(key if isinstance(key, list) else [key])
        super().__init__()
        self.keys = keys_arg(flat, "keys")
        if not self.keys:
            raise ValueError(f"{type(self).__name__} needs at least one key.")
        self.inverse = inverse

    def _filter(self, data: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        if self.inverse:
            return data
        return self._filter(require_tensordict(self, data))

    def inv(self, data: TensorDictBase) -> TensorDictBase:
        if not self.inverse:
            return data
        return self._filter(require_tensordict(self, data))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(keys={self.keys}, inverse={self.inverse})"


class ExcludeTransform(_KeyFilter):
    """Removes entries (and whole sub-TensorDicts) on sample.

    Parameters
    ----------
    *excluded_keys : nested keys
        Entries to drop. Entries that are absent are ignored (nothing to drop), as in TorchRL.
    inverse : bool
        Drop them on extend instead (before they are written).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"a": torch.zeros(2), ("next", "a"): torch.zeros(2), "b": torch.ones(2)},
    ...                 [2])
    >>> sorted(map(str, ExcludeTransform("b", ("next", "a"))(td).keys(True, True)))
    ['a']
    """

    def __init__(self, *excluded_keys: NestedKey | list[NestedKey], inverse: bool = False) -> None:
        super().__init__(excluded_keys, inverse)

    def _filter(self, data: TensorDictBase) -> TensorDictBase:
        return data.exclude(*self.keys)


class SelectTransform(_KeyFilter):
    """Keeps only the given entries on sample (and the root ``"reward"`` / ``"done"``, by
    default), as TorchRL's ``SelectTransform`` does in a replay buffer.

    Parameters
    ----------
    *selected_keys : nested keys
        Entries to keep. A missing one is ignored, as in TorchRL (``strict=True`` raises
        instead).
    keep_rewards : bool
        Also keep the root ``"reward"`` entry when present. Defaults to ``True``.
    keep_dones : bool
        Also keep the root ``"done"`` entry when present. Defaults to ``True``.
    strict : bool
        Raise ``KeyError`` naming a selected entry that is missing (a tdreplay addition, to
        catch a misspelt key). Defaults to ``False``, TorchRL's behaviour: nothing is lost,
        as the entry is not in the data to begin with.
    inverse : bool
        Select on extend instead (only these entries are written; a tdreplay addition).

    Every other entry is dropped, including ``("next", "reward")``, ``("next", "done")`` and
    the ``"terminated"`` / ``"truncated"`` flags (TorchRL outside an environment keeps only
    ``"reward"`` and ``"done"``): name them to keep them.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(2), "other": torch.zeros(2), "done": torch.ones(2),
    ...                  ("next", "reward"): torch.ones(2)}, [2])
    >>> sorted(map(str, SelectTransform("obs")(td.clone()).keys(True, True)))
    ['done', 'obs']
    >>> sorted(map(str, SelectTransform("obs", ("next", "reward"), "absent")(td.clone())
    ...            .keys(True, True)))
    ["('next', 'reward')", 'done', 'obs']
    >>> SelectTransform("obs", "absent", strict=True)(td)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    KeyError: ...SelectTransform: key ...absent... is missing from the data...
    """

    def __init__(self, *selected_keys: NestedKey | list[NestedKey], keep_rewards: bool = True,
                 keep_dones: bool = True, strict: bool = False, inverse: bool = False) -> None:
        super().__init__(selected_keys, inverse)
        self.keep_rewards = check_flag(keep_rewards, "SelectTransform: keep_rewards")
        self.keep_dones = check_flag(keep_dones, "SelectTransform: keep_dones")
        self.strict = check_flag(strict, "SelectTransform: strict")

    def _filter(self, data: TensorDictBase) -> TensorDictBase:
        if self.strict:
            for key in self.keys:
                self.read_entry(data, key)
        extra: list[NestedKey] = []
        if self.keep_rewards:
            extra.append(_REWARD_KEY)
        if self.keep_dones:
            extra.append(_DONE_KEY)
        return data.select(*self.keys, *extra, strict=False)
