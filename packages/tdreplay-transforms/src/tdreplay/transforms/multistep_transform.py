"""``MultiStepTransform``: n-step transitions computed on write, each step once its window is
complete (TorchRL's write-side counterpart of ``MultiStep``)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from tensordict import TensorDict, TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_key, restore_attributes

from ._utils import keys_arg, require_tensordict
from .multistep import MultiStep


class MultiStepTransform(Transform):
    """Writes each step as an n-step transition, holding back the last ``n_steps`` steps of
    every write until the next one brings the steps their windows need.

    On ``extend`` (the transform's write side, ``inv``), the held steps and the new data are
    joined along time (the last batch dimension, e.g. ``[envs, T]`` written into a storage of
    ``ndim=2``) and rewritten by :class:`MultiStep`; all but the last ``n_steps`` are written,
    and those are held (as copies) for the next ``extend``. A stream of writes is thus stored
    step by step, each exactly once, ``n_steps`` steps late, with windows that run across the
    writes (a :class:`MultiStep` applied to each write alone would cut every window at the
    write's end). A write that completes no window writes nothing: ``inv`` returns ``None``
    (as TorchRL's) and ``extend`` an empty ``[0, storage.ndim]`` tensor of slots. Samples
    are returned as they are.

    The result is :class:`MultiStep`'s: the discounted reward sum, every ``"next"`` entry
    from the window's last step, ``"steps_to_next_obs"`` and ``"gamma"`` (shaped as
    TorchRL's), the single-step reward in ``("next", "original_reward")``. As for
    :class:`MultiStep`, the ``"next"`` done flags are taken from the window's last step
    (TorchRL leaves those of ``done_keys`` at step ``t``, so a termination within the window
    does not reach the loss), and TorchRL's ``nonterminal`` entry is not written.

    The held steps are the transform's state (it declares ``has_state``): a buffer's
    ``state_dict`` / ``dumps`` save them and ``load_state_dict`` / ``loads`` restore them, so
    a restored buffer writes what the saved one would have. One transform continues one
    stream: steps of another stream (another collector) need their own transform.

    Parameters
    ----------
    n_steps : int
        Number of rewards summed (>= 1). It may be changed between writes (as TorchRL's):
        the next write holds back the new number of steps.
    gamma : float
        Discount factor in ``(0, 1]``.
    reward_keys : sequence of nested keys, optional
        Rewards under ``"next"``. Defaults to ``["reward"]``.
    done_key : nested key, optional
        The flag under ``"next"`` that ends a trajectory. Defaults to ``"done"``.
    done_keys : sequence of nested keys, optional
        The other end-of-trajectory flags under ``"next"``, defaults to ``["done",
        "truncated", "terminated"]``: those present are OR-ed with ``done_key`` to find where
        trajectories end (with TorchRL's defaults, where ``done`` is ``terminated |
        truncated``, this is ``done_key`` alone, as TorchRL's).
    mask_key : nested key, optional
        Accepted for TorchRL's signature: TorchRL uses it only for its ``nonterminal`` entry,
        which is not written here, so it has no effect.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> def steps(start, T):
    ...     t = torch.arange(start, start + T)
    ...     return TensorDict({"step": t, ("next", "step"): t + 1,
    ...                        ("next", "reward"): torch.ones(T),
    ...                        ("next", "done"): torch.zeros(T, dtype=torch.bool)}, [T])
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
    ...                             transform=MultiStepTransform(n_steps=3, gamma=0.5))
    >>> rb.extend(steps(0, 5)).tolist()      # steps 3 and 4 are held
    [0, 1]
    >>> rb.extend(steps(5, 5)).tolist()      # they are written with the next write
    [2, 3, 4, 5, 6]
    >>> rb[:]["step"].tolist(), rb[:]["next", "step"].tolist()
    ([0, 1, 2, 3, 4, 5, 6], [3, 4, 5, 6, 7, 8, 9])
    >>> rb[:]["next", "reward"][0].item(), rb[:]["steps_to_next_obs"][0].item()
    (1.75, 3)
    >>> sorted(rb.state_dict()["_transform"]["0:MultiStepTransform"])
    ['batch_size', 'held']
    """

    has_state = True
    #: already a write-side transform: ``append_transform(t, invert=True)`` is refused
    invertible = False

    def __init__(
        self,
        n_steps: int,
        gamma: float,
        *,
        reward_keys: Sequence[NestedKey] | NestedKey | None = None,
        done_key: NestedKey | None = None,
        done_keys: Sequence[NestedKey] | NestedKey | None = None,
        mask_key: NestedKey | None = None,
    ) -> None:
        super().__init__()
        reward_keys = ["reward"] if reward_keys is None else reward_keys
        done_keys = ["done", "truncated", "terminated"] if done_keys is None else done_keys
        self.reward_keys = keys_arg(list(reward_keys) if isinstance(reward_keys, tuple)
                                    else reward_keys, "reward_keys")
        self.done_key = check_key("done" if done_key is None else done_key, "done_key")
        self.done_keys = keys_arg(list(done_keys) if isinstance(done_keys, tuple)
                                  else done_keys, "done_keys")
        self.mask_key = check_key("mask" if mask_key is None else mask_key, "mask_key")
        self.gamma = gamma
        self.n_steps = n_steps
        try:
            self._multistep()  # checks gamma and the keys now
        except ValueError as err:
            raise ValueError(str(err).replace("MultiStep:", "MultiStepTransform:", 1)) from None
        self._held: TensorDictBase | None = None
        self._lock = threading.Lock()

    @property
    def n_steps(self) -> int:
        """The n-step window; may be changed between writes."""
        return self._n_steps

    @n_steps.setter
    def n_steps(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"MultiStepTransform: n_steps must be a positive int, got "
                             f"{value!r}.")
        self._n_steps = value

    @property
    def held(self) -> TensorDictBase | None:
        """The steps held back for the next write (raw, as written), ``None`` before any."""
        return self._held

    def drop_held_items(self) -> None:
        """Drop the steps held back (``rb.empty()`` calls it): the next write starts a new
        run, as the steps written after an empty are not the continuation of those before."""
        with self._lock:
            self._held = None

    def _multistep(self) -> MultiStep:
        ends = [self.done_key, *(k for k in self.done_keys if k != self.done_key)]
        return MultiStep(self.gamma, self.n_steps, reward_keys=self.reward_keys,
                         done_keys=ends)

    # ---- write side ------------------------------------------------------------------------------
    def inv(self, data: TensorDictBase) -> TensorDictBase | None:
        """The n-step transitions of the held steps and ``data`` whose windows are complete
        (``None`` when none is); holds the last ``n_steps`` steps. Nothing changes when
        ``data`` is refused. A step without a time dimension (``rb.add(step)``, as TorchRL's
        ``ReplayBuffer.add`` writes) is a write of one step: the one transition it completes
        comes back without the time dimension."""
        require_tensordict(self, data)
        one_step = not data.batch_dims  # (rb.add(step): a write of one step, as TorchRL's)
        if one_step:
            data = data.unsqueeze(-1)
        with self._lock:
            total = data.clone(False) if self._held is None else self._join(self._held, data)
            n = self.n_steps
            ready = total.batch_size[-1] - n
            if one_step and ready > 1:  # (n_steps lowered since the held steps were written)
                raise ValueError(
                    f"MultiStepTransform: this step completes {ready} windows (n_steps was "
                    f"lowered to {n} after {total.batch_size[-1] - 1} steps were held), more "
                    "than the one item add() writes: write it with extend.")
            self._held = total[..., -n:].clone()
            if ready <= 0:
                return None  # nothing to write yet (TorchRL's ``None``)
            out = self._multistep()(total.clone(False))[..., :ready]
            return out.squeeze(-1) if one_step else out

    @staticmethod
    def _join(held: TensorDictBase, data: TensorDictBase) -> TensorDictBase:
        keys = _entry_keys(data)
        if held.batch_size[:-1] != data.batch_size[:-1] or _entry_keys(held) != keys:
            raise ValueError(
                f"MultiStepTransform: the data (batch_size {tuple(data.batch_size)}, keys "
                f"{sorted(map(str, keys))}) does not continue the held steps (batch_size "
                f"{tuple(held.batch_size)}, keys {sorted(map(str, _entry_keys(held)))}): "
                "only the time dimension (the last) may differ.")
        for key in sorted(keys, key=str):
            before, now = held.get(key), data.get(key)
            if isinstance(before, torch.Tensor) and isinstance(now, torch.Tensor) and (
                    before.shape[held.batch_dims:] != now.shape[data.batch_dims:]):
                raise ValueError(
                    f"MultiStepTransform: entry {key!r} of the data has steps of shape "
                    f"{tuple(now.shape[data.batch_dims:])}, the held steps "
                    f"{tuple(before.shape[held.batch_dims:])}: only the time dimension (the "
                    "last) may differ.")
        return cast(TensorDictBase, torch.cat([held, data], -1))  # (a TensorDict)

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"held": nested dict of tensors or None, "batch_size": list of ints}``."""
        with self._lock:
            held = self._held
            if held is None:
                return {"held": None, "batch_size": []}
            return {"held": held.to_dict(), "batch_size": list(held.batch_size)}

    def check_state_dict(self, state_dict: Any) -> None:
        """``TypeError`` / ``KeyError`` / ``ValueError`` naming the field unless
        :meth:`state_dict` could have returned ``state_dict``; changes nothing."""
        self._held_of(state_dict)

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore the held steps of :meth:`state_dict` (checked first)."""
        held = self._held_of(state_dict)
        with self._lock:
            self._held = held

    def _held_of(self, state: Any) -> TensorDictBase | None:
        if not isinstance(state, Mapping):
            raise TypeError(f"MultiStepTransform.load_state_dict: state_dict must be a mapping, "
                            f"got {type(state).__name__}.")
        if set(state) != {"held", "batch_size"}:
            raise KeyError(f"MultiStepTransform.load_state_dict: state_dict keys must be "
                           f"['batch_size', 'held'], got {sorted(map(str, state))}.")
        held, batch_size = state["held"], state["batch_size"]
        if held is None:
            return None
        if not isinstance(held, Mapping):
            raise TypeError(f"MultiStepTransform.load_state_dict: state_dict['held'] must be a "
                            f"dict of tensors or None, got {type(held).__name__}.")
        if (not isinstance(batch_size, (list, tuple)) or not batch_size
                or not all(isinstance(d, int) and d >= 0 for d in batch_size)):
            raise ValueError(f"MultiStepTransform.load_state_dict: state_dict['batch_size'] "
                             f"must be a non-empty list of sizes, got {batch_size!r}.")
        try:
            steps = TensorDict(dict(held), batch_size=list(batch_size))
        except (RuntimeError, ValueError, TypeError) as err:
            raise ValueError(f"MultiStepTransform.load_state_dict: state_dict['held'] does not "
                             f"make steps of batch_size {list(batch_size)}: {err}") from err
        present = set(steps.keys(True, True))
        missing = [key for key in (("next", *((k,) if isinstance(k, str) else k))
                                   for k in self.reward_keys) if key not in present]
        if missing:  # (no later write could continue them: every one would be refused)
            raise ValueError(f"MultiStepTransform.load_state_dict: the held steps lack the "
                             f"reward entries {missing} (reward_keys {self.reward_keys}).")
        return steps

    # ---- copies --------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Pickle (and deep-copy) without the lock, which does not pickle."""
        state = self.__dict__.copy()
        state.pop("_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MultiStepTransform(n_steps={self.n_steps}, gamma={self.gamma})"


def _entry_keys(data: TensorDictBase) -> set[Any]:
    """The leaf keys of ``data``, non-tensor entries (a string) included."""
    return set(data.keys(True, True)) | {key for key, _ in
                                         data.non_tensor_items(include_nested=True)}
