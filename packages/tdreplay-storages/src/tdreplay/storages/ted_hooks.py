"""Save and load hooks that store TED data flat: :class:`TED2Flat`, :class:`Flat2TED`
(TorchRL's ``torchrl.data.replay_buffers.utils``).

TorchRL's TED format stores every observation twice: ``obs`` at step ``t`` and
``("next", "obs")``, which is the ``obs`` of step ``t + 1`` within a trajectory.
:class:`TED2Flat` (a save hook) writes each trajectory's observations once, in time order:
the root values of its steps followed by the ``("next", ...)`` value of its last step, so
``N`` steps of ``K`` trajectories keep ``N + K`` values instead of ``2 N``. The end flags and
rewards (``done_keys``, ``reward_keys``) are kept from ``"next"`` under their own names.
:class:`Flat2TED` (a load hook) rebuilds the rows as they were stored, for TED data (within a
trajectory, a step's ``("next", key)`` is the next step's ``key``; a buffer's ring keeps that
across its wrap point).

Both take the buffer's ring into account: before ``dumps`` runs the save hooks, the buffer
sets a hook's ``shift`` (the row written next) and ``is_full``, so a full ring is saved oldest
first and a trajectory that spans the wrap point stays whole.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, unravel_key

from tdreplay.core import DEFAULT_DONE_KEYS
from tdreplay.core.utils import check_key

__all__ = ["Flat2TED", "TED2Flat"]

#: entries of the flat format that say how to rebuild the rows (with the hooks' ``shift_key``
#: and ``is_full_key``)
_ROWS, _ENDS = "storage_rows", "traj_ends"


def _key_set(keys: Any) -> set[Any]:
    return {unravel_key(k) for k in keys}


def _key_argument(keys: Any, name: str) -> set[Any]:
    """The keys of the argument ``name`` (a sequence of keys), checked."""
    if isinstance(keys, str) or not isinstance(keys, (list, tuple, set, frozenset)):
        raise TypeError(f"{name} must be a sequence of keys, got {keys!r}.")
    return {check_key(key, name) for key in keys}


def _ends(done: torch.Tensor, rows: int) -> torch.Tensor:
    """One flag per row: the row ends a trajectory (any done flag set, or the last row)."""
    if rows == 0:  # (an emptied storage)
        return torch.zeros(0, dtype=torch.bool)
    ends = done.reshape(rows, -1).any(-1)
    ends[-1] = True
    return ends


def _parts(key: Any) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (key,)


def _clashing(keys: set[Any], reserved: list[Any]) -> list[Any]:
    """The ``keys`` of the data that one of the flat format's own entries (``reserved``) would
    overwrite or hold: the same key, or one nested in the other."""
    def clash(key: Any, own: Any) -> bool:
        a, b = _parts(key), _parts(own)
        return a[:len(b)] == b or b[:len(a)] == a
    return sorted((key for key in keys if any(clash(key, own) for own in reserved)), key=str)


def _repeats_the_next_root(value: torch.Tensor, root: torch.Tensor, ends: torch.Tensor) -> bool:
    """Within every trajectory, each step's ``value`` is bitwise the ``root`` value of the step
    after it (rows in time order; ``ends`` flags the last step of each trajectory), so that
    :class:`Flat2TED` rebuilds ``value`` exactly from the root values."""
    if value.shape != root.shape or value.dtype != root.dtype:
        return False
    inner = ~ends[:-1]
    mine, following = value[:-1][inner], root[1:][inner]
    if mine.numel() == 0:
        return True
    return torch.equal(mine.contiguous().view(torch.uint8),
                       following.contiguous().view(torch.uint8))


class _TEDKeys:
    """The entries both hooks of a TED <-> flat conversion read (one set of arguments)."""

    def __init__(self, done_key: Any = ("next", "done"), shift_key: Any = "shift",
                 is_full_key: Any = "is_full", done_keys: Any = DEFAULT_DONE_KEYS,
                 reward_keys: Any = ("reward",)) -> None:
        self.done_key = check_key(done_key, "done_key")
        self.shift_key = check_key(shift_key, "shift_key")
        self.is_full_key = check_key(is_full_key, "is_full_key")
        self.done_keys = _key_argument(done_keys, "done_keys")
        self.reward_keys = _key_argument(reward_keys, "reward_keys")


class TED2Flat(_TEDKeys):
    """A save hook storing TED data with each observation once.

    Parameters
    ----------
    done_key : NestedKey
        The end flag that closes trajectories (``("next", "done")``).
    shift_key, is_full_key : NestedKey
        Where the flat data records the buffer's ``shift`` and ``is_full``.
    done_keys, reward_keys : sequence of NestedKey
        ``"next"`` entries kept whole (by default :data:`~tdreplay.core.DEFAULT_DONE_KEYS` and
        ``("reward",)``); the other ``"next"`` entries that repeat a root entry are stored
        once per step plus once per trajectory.

    A ``"next"`` entry is stored once with its root twin only where that loses nothing: when,
    within every trajectory, each step's value is bitwise the root value of the step after
    it (TED data). Any other (multi-step targets, an entry of another dtype or shape) is kept
    whole, where TorchRL's ``TED2Flat`` would replace it with the following root values.

    ``shift`` / ``is_full`` are set by ``rb.dumps`` before the hook runs (``None``: the rows
    are saved in storage order). Only storages with ``ndim == 1``.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> done = torch.tensor([[False], [True], [False], [True]])
    >>> rows = TensorDict({"obs": torch.arange(4.), "next": {"obs": torch.arange(1., 5.),
    ...                    "done": done, "reward": torch.ones(4, 1)}}, [4])
    >>> flat = TED2Flat()(rows)
    >>> flat["obs"].tolist()     # trajectory 0, 1, 2 and trajectory 2, 3, 4
    [0.0, 1.0, 2.0, 2.0, 3.0, 4.0]
    >>> (Flat2TED()(flat) == rows).all()
    True
    """

    shift: int | None = None
    is_full: bool | None = None

    def _order(self, rows: int) -> tuple[torch.Tensor, int, bool]:
        is_full = bool(self.is_full)
        shift = rows if self.shift is None else int(self.shift) % max(rows, 1)
        if not is_full:
            return torch.arange(rows), shift, False
        return (torch.arange(rows) + shift) % rows, shift, True

    def __call__(self, data: TensorDictBase, path: Any = None) -> TensorDictBase:
        if not isinstance(data, TensorDictBase) or data.batch_dims != 1:
            raise ValueError("TED2Flat saves TensorDict rows of a storage with ndim=1, got "
                             f"{type(data).__name__} with batch size "
                             f"{tuple(getattr(data, 'batch_size', ()))}.")
        rows = data.batch_size[0]
        order, shift, is_full = self._order(rows)
        steps = data[order]
        done = steps.get(self.done_key, None)
        if done is None:
            raise KeyError(f"TED2Flat needs the end flags {self.done_key!r} (done_key).")
        ends = _ends(done, rows)
        # slot of every step in the expanded arrays, and of each trajectory's final value
        slot = torch.arange(rows) + torch.cat([ends.new_zeros(1), ends[:-1]]).cumsum(0)
        final = slot[ends] + 1
        nxt = steps.get("next")
        root = steps.exclude("next")
        root_keys = _key_set(root.keys(True, True))
        special = self.done_keys | self.reward_keys
        clashing = _clashing(root_keys - special, ["root", self.shift_key, self.is_full_key,
                                                   _ROWS, _ENDS])
        if clashing:  # (saved, they would come back renamed, overwritten or missing)
            raise ValueError(f"TED2Flat: the data has entries {clashing} where the flat format "
                             f"keeps its own ('root', {self.shift_key!r}, {self.is_full_key!r},"
                             f" {_ROWS!r}, {_ENDS!r}): rename them, or pass other shift_key / "
                             "is_full_key.")
        out = TensorDict(batch_size=[])
        compacted = set()  # root entries stored with their "next" twins
        for key in _key_set(nxt.keys(True, True)):
            value = nxt.get(key)
            if key in special or key not in root_keys or rows == 0 \
                    or not _repeats_the_next_root(value, root.get(key), ends):
                # kept whole: an end flag or reward, an entry without a root twin, or one
                # that is not TED (``value`` of a step is not the root value of the step
                # after it in its trajectory: multi-step targets, say)
                out.set(key if key in special else ("next", *(key if isinstance(key, tuple)
                                                            else (key,))), value.clone())
                continue
            first = root.get(key)
            merged = first.new_empty((rows + int(ends.sum()), *first.shape[1:]))
            merged[slot] = first
            merged[final] = value[ends]
            out.set(key, merged)
            compacted.add(key)
        for key in root_keys:
            if key in special:
                out.set(("root", *(key if isinstance(key, tuple) else (key,))), root.get(key))
            elif key not in compacted:
                out.set(key, root.get(key).clone())
        out.set(self.shift_key, torch.tensor(shift))
        out.set(self.is_full_key, torch.tensor(is_full))
        out.set(_ROWS, torch.tensor(rows))
        out.set(_ENDS, ends)
        return out


class Flat2TED(_TEDKeys):
    """The load hook that rebuilds the rows :class:`TED2Flat` saved (same arguments).

    Examples
    --------
    A buffer registers both (``rb.register_save_hook(TED2Flat())``,
    ``rb.register_load_hook(Flat2TED())``); the rows come back as they were:

    >>> import torch
    >>> from tensordict import TensorDict
    >>> rows = TensorDict({"obs": torch.tensor([0.0, 1.0, 5.0]),
    ...                    "next": {"obs": torch.tensor([1.0, 2.0, 6.0]),
    ...                             "done": torch.tensor([[False], [True], [True]])}}, [3])
    >>> flat = TED2Flat()(rows)
    >>> flat["obs"].tolist()  # each trajectory's observations once, with its last next obs
    [0.0, 1.0, 2.0, 5.0, 6.0]
    >>> back = Flat2TED()(flat)
    >>> back["next", "obs"].tolist(), (back == rows).all()
    ([1.0, 2.0, 6.0], True)
    """

    def __call__(self, flat: TensorDictBase, path: Any = None) -> TensorDictBase:
        """The rows ``flat`` (what :class:`TED2Flat` made) came from; ``path`` (where the
        checkpoint is, TorchRL's second argument) is not needed."""
        required = (self.shift_key, self.is_full_key, _ROWS, _ENDS)
        for key in required:
            if flat.get(key, None) is None:
                raise KeyError(f"Flat2TED: {key!r} is missing; was the data saved by TED2Flat?")
        rows = int(flat.get(_ROWS))
        shift, is_full = int(flat.get(self.shift_key)), bool(flat.get(self.is_full_key))
        ends = flat.get(_ENDS).to(torch.bool)
        slot = torch.arange(rows) + torch.cat([ends.new_zeros(1), ends[:-1]]).cumsum(0)
        after = slot + 1  # where each step's "next" value sits
        special = self.done_keys | self.reward_keys
        steps = TensorDict(batch_size=[rows])
        for key in _key_set(flat.keys(True, True)):
            if key in required:
                continue
            value = flat.get(key)
            parts = key if isinstance(key, tuple) else (key,)
            if parts[0] == "root":
                steps.set(unravel_key(parts[1:]), value)
            elif parts[0] == "next":  # a "next" entry without a root twin, saved as it was
                steps.set(key, value)
            elif key in special:
                steps.set(("next", *parts), value)
            elif rows and value.shape[0] == rows + int(ends.sum()):  # (stored with its twin)
                steps.set(key, value[slot])
                steps.set(("next", *parts), value[after])
            else:
                steps.set(key, value)
        if is_full:  # back to storage order: row i of the saved data is storage row i + shift
            steps = steps[(torch.arange(rows) - shift) % rows]
        return steps
