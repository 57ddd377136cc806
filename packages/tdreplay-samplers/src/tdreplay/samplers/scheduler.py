"""Parameter schedulers: anneal a sampler's parameter (e.g. ``alpha`` / ``beta`` of a
:class:`~tdreplay.samplers.PrioritizedSampler`) step by step, as TorchRL's
``torchrl.data.replay_buffers.scheduler``.

A scheduler is built on a buffer or on a sampler and changes one attribute of the sampler each
time :meth:`ParameterScheduler.step` is called (typically once per training iteration):

- :class:`LinearScheduler`: from the value the parameter had when the scheduler was built to
  ``final_value`` in ``num_steps`` equal steps, then stays there;
- :class:`StepScheduler`: every ``n_steps`` steps, multiply the parameter by ``gamma`` (or add
  ``gamma``, ``mode="additive"``), clipped to ``[min_value, max_value]``;
- :class:`LambdaScheduler`: the initial value times ``lambda_fn(step_count)``;
- :class:`SchedulerList`: steps several schedulers together.

Checkpoints. A scheduler built on a buffer registers itself with it
(:meth:`~tdreplay.core.ReplayBuffer.register_stateful`, under ``"scheduler.<param_name>"``),
so that ``rb.state_dict()`` / ``rb.dumps(path)`` save how far it has gone and
``rb.load_state_dict`` / ``rb.loads`` restore it: a run resumed from a checkpoint goes on
annealing where it stopped. A checkpoint saved before the scheduler was added (it holds no
state for it) still loads and leaves the scheduler as it is (its step count: its next step
sets the parameter as if there had been no load), as TorchRL's, whose schedulers are not part
of the buffer's checkpoint. A scheduler built on a bare sampler saves
nothing by itself; register it with ``rb.register_stateful(name, scheduler)``. Its own
:meth:`~ParameterScheduler.state_dict` holds plain numbers and tensors.

A parameter that holds an int and refuses a float (``TypeError``; e.g. ``max_staleness`` of
a :class:`~tdreplay.samplers.StalenessAwareSampler`) is set to the nearest int of each
scheduled value instead (halves round up); other parameters get the value as it is.

Thread safety: a scheduler built on a buffer changes the parameter under the buffer's lock, so a
sample drawn meanwhile in another thread sees the old or the new value, never a mix.
"""

from __future__ import annotations

import abc
import inspect
import math
import re
import warnings
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import torch

from tdreplay.core import ReplayBuffer, Sampler
from tdreplay.core.utils import check_required_count, is_int

__all__ = ["LambdaScheduler", "LinearScheduler", "ParameterScheduler", "SchedulerList",
           "StepScheduler"]

Value = float | torch.Tensor

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _as_value(value: Any, name: str) -> Value:
    """``value`` as a float, or as a detached clone when it is a one-element real tensor;
    ``TypeError`` naming ``name`` otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a real number or a one-element real tensor, got a "
                            f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}.")
        return value.detach().clone()
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not _is_np_real(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r}).")
    return float(value)


def _is_np_real(value: Any) -> bool:
    import numpy as np

    return isinstance(value, (np.integer, np.floating))


def _number(value: Value, name: str) -> float:
    """``value`` (from :func:`_as_value`) as a float; ``ValueError`` naming ``name`` for a meta
    tensor, which holds no value."""
    if isinstance(value, float):
        return value
    if value.is_meta:
        raise ValueError(f"{name} must hold a value, got a meta tensor (it has none).")
    return float(value.item())


def _bound(value: Any, name: str, default: float) -> float:
    if value is None:
        return default
    out = _number(_as_value(value, name), name)
    if math.isnan(out):
        raise ValueError(f"{name} must not be NaN.")
    return out


def _bounds(min_value: Any, max_value: Any, min_name: str = "min_value",
            max_name: str = "max_value") -> tuple[float, float]:
    """The checked ``(min_value, max_value)`` (``None``: unbounded); ``ValueError`` naming the
    bound when one is NaN or a meta tensor, or when ``min_value > max_value``."""
    low = _bound(min_value, min_name, -math.inf)
    high = _bound(max_value, max_name, math.inf)
    if low > high:
        raise ValueError(f"{min_name} ({low}) is above {max_name} ({high}).")
    return low, high


def _finite(value: Value, name: str) -> Value:
    """``value``, or ``ValueError`` naming ``name`` when it is NaN, infinite or a meta tensor."""
    number = _number(value, name)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {number}.")
    return value


#: parameters that a sampler refuses below 0 (the exponents of the prioritized samplers)
_NON_NEGATIVE = ("alpha", "beta")


def _in_range(value: Any, param_name: str, name: str) -> Value:
    """``value`` as a value ``param_name`` may take (:func:`_as_value`, finite, and ``>= 0``
    for the parameters the samplers refuse below 0); ``TypeError`` / ``ValueError`` naming
    ``name`` otherwise."""
    checked = _finite(_as_value(value, name), name)
    if param_name in _NON_NEGATIVE and _number(checked, name) < 0:
        raise ValueError(f"{name} must be >= 0 for {param_name!r} (the sampler refuses a "
                         f"negative {param_name}), got {_number(checked, name)}.")
    return checked


def _check_gamma(gamma: Any, mode: str, name: str = "gamma") -> float:
    """``gamma`` as a float: finite, and ``>= 0`` with ``mode="multiplicative"``;
    ``TypeError`` / ``ValueError`` naming ``name`` otherwise."""
    value = _number(_finite(_as_value(gamma, name), name), name)
    if mode == "multiplicative" and value < 0:
        raise ValueError(f"{name} must be >= 0 with mode='multiplicative' (a negative factor "
                         f"flips the parameter's sign every step), got {value}; use "
                         f"mode='additive' to decrease the parameter step by step.")
    return value


def _check_settable(sampler: Any, param_name: str) -> None:
    """``ValueError`` naming ``param_name`` unless the sampler's attribute can be set: a
    read-only property (e.g. ``eps``, ``max_capacity``) or a method cannot be scheduled."""
    try:
        attribute = inspect.getattr_static(sampler, param_name)
    except AttributeError:
        return  # (provided by __getattr__: left to the sampler)
    if isinstance(attribute, property):
        if attribute.fset is None:
            raise ValueError(f"param_name={param_name!r}: {type(sampler).__name__}."
                             f"{param_name} is read-only and cannot be scheduled (schedule a "
                             f"settable parameter, e.g. 'alpha' or 'beta').")
    elif callable(attribute) or isinstance(attribute, (staticmethod, classmethod)):
        raise ValueError(f"param_name={param_name!r}: {type(sampler).__name__}.{param_name} "
                         f"is a method, not a parameter that can be scheduled.")


#: TorchRL's names of the base scheduler's ``state_dict`` entries, and tdreplay's
_TORCHRL_BASE_KEYS = {"_step_cnt": "step_count", "initial_val": "initial_value",
                      "_min_val": "min_value", "_max_val": "max_value"}


class ParameterScheduler(abc.ABC):
    """Base of the schedulers: sets ``sampler.<param_name>`` on every :meth:`step`.

    Parameters
    ----------
    obj : ReplayBuffer or Sampler
        The buffer whose sampler to adjust (the scheduler then registers itself with the buffer,
        see the module docstring), or the sampler itself.
    param_name : str
        The sampler's attribute to adjust, e.g. ``"beta"``.
    min_value, max_value : float, optional
        Bounds the new values are clipped to (``None``: unbounded).

    Raises
    ------
    TypeError
        ``obj`` is neither a buffer nor a sampler, or a bound is not a number.
    ValueError
        The sampler has no attribute ``param_name``, or it is read-only or a method (only a
        settable parameter can be scheduled), or ``min_value > max_value``.

    A scheduler built on a buffer that already has one registered for ``param_name`` replaces
    it in the buffer's checkpoints, with a ``UserWarning`` (the earlier scheduler's progress is
    no longer saved).

    Subclasses implement :meth:`compute` (the value after ``step_count`` steps, before
    clipping) and may extend :meth:`state_dict` with their settings.

    Examples
    --------
    >>> from tdreplay.samplers import PrioritizedSampler
    >>> class Halving(ParameterScheduler):
    ...     def compute(self, step_count):
    ...         return self.initial_value * 0.5 ** step_count
    >>> sampler = PrioritizedSampler(10, alpha=0.8, beta=0.4)
    >>> scheduler = Halving(sampler, "beta", min_value=0.15)
    >>> for _ in range(2):
    ...     scheduler.step()
    ...     print(round(sampler.beta, 2))
    0.2
    0.15
    """

    def __init__(self, obj: ReplayBuffer | Sampler, param_name: str,
                 min_value: float | None = None, max_value: float | None = None) -> None:
        self._buffer: ReplayBuffer | None
        if isinstance(obj, ReplayBuffer):
            sampler, self._buffer = obj.sampler, obj
        elif isinstance(obj, Sampler):
            sampler, self._buffer = obj, None
        else:
            raise TypeError(f"{type(self).__name__} adjusts a parameter of a sampler: pass a "
                            f"ReplayBuffer or a Sampler as obj, got {type(obj).__name__}.")
        if not isinstance(param_name, str) or not _NAME.match(param_name) \
                or param_name.startswith("_"):
            raise ValueError(f"param_name must name a public attribute of the sampler, got "
                             f"{param_name!r}.")
        if not hasattr(sampler, param_name):
            raise ValueError(f"Provided class {type(sampler).__name__} does not have an "
                             f"attribute {param_name} (param_name).")
        _check_settable(sampler, param_name)
        self.sampler = sampler
        self.param_name = param_name
        self.min_value, self.max_value = _bounds(min_value, max_value)
        start = getattr(sampler, param_name)
        self.initial_value = _as_value(start, param_name)
        #: the parameter held an int: a value it refuses as a float is set rounded (step())
        self.whole_numbers = is_int(start) and not isinstance(start, torch.Tensor)
        self.step_count = 0
        if self._buffer is not None:
            name = f"scheduler.{param_name}"
            if name in self._buffer.stateful_parts.names:
                warnings.warn(
                    f"a scheduler for param_name={param_name!r} is already registered with "
                    f"this buffer (under {name!r}); this {type(self).__name__} replaces it in "
                    f"the buffer's checkpoints, so the earlier one's progress is no longer "
                    f"saved (to replace it knowingly, unregister it first: "
                    f"rb.register_stateful({name!r}, None)).",
                    UserWarning, stacklevel=3)
            self._buffer.register_stateful(name, self)

    @property
    def initial_val(self) -> Value:
        """TorchRL's name of :attr:`initial_value` (the parameter's value when the scheduler
        was built), readable and settable.

        Examples
        --------
        >>> from tdreplay.samplers import PrioritizedSampler
        >>> scheduler = StepScheduler(PrioritizedSampler(10, alpha=0.7, beta=0.4), "beta")
        >>> scheduler.initial_val, scheduler.initial_value
        (0.4, 0.4)
        """
        return self.initial_value

    @initial_val.setter
    def initial_val(self, value: Value) -> None:
        self.initial_value = _as_value(value, "initial_val")

    # ---- stepping ------------------------------------------------------------------------------
    @property
    def current_value(self) -> Value:
        """The parameter's value now (read from the sampler)."""
        return _as_value(getattr(self.sampler, self.param_name), self.param_name)

    @abc.abstractmethod
    def compute(self, step_count: int) -> Value:
        """The parameter's value after ``step_count`` steps, before clipping."""

    def _clip(self, value: Value) -> Value:
        if isinstance(value, torch.Tensor):
            return value.clamp(self.min_value, self.max_value)
        return min(max(float(value), self.min_value), self.max_value)

    def set_value(self, value: Value) -> None:
        """Set the sampler's parameter to ``value`` (no step, no clipping); the nearest int
        when the parameter held one and refuses a float (see the module docstring).

        Examples
        --------
        >>> from tdreplay.samplers import StalenessAwareSampler
        >>> sampler = StalenessAwareSampler(max_staleness=2)
        >>> LinearScheduler(sampler, "max_staleness", 10, num_steps=4).set_value(6.5)
        >>> sampler.max_staleness
        7
        """
        try:
            setattr(self.sampler, self.param_name, value)
        except TypeError:
            if not self.whole_numbers or isinstance(value, torch.Tensor) \
                    or not math.isfinite(value):
                raise
            setattr(self.sampler, self.param_name, math.floor(value + 0.5))

    def _locked(self) -> AbstractContextManager[Any]:
        return self._buffer.locked() if self._buffer is not None else nullcontext()

    def step(self) -> None:
        """Advance one step and set the sampler's parameter to its new (clipped) value.

        If the sampler refuses the value (e.g. a negative ``alpha``), the error propagates and
        the scheduler stays where it was.
        """
        with self._locked():
            self.set_value(self._clip(self.compute(self.step_count + 1)))
            self.step_count += 1

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``step_count``, ``initial_value``, the bounds and the subclass's settings."""
        initial = self.initial_value
        return {"step_count": self.step_count,
                "initial_value": initial.clone() if isinstance(initial, torch.Tensor) else initial,
                "min_value": self.min_value, "max_value": self.max_value}

    #: a checkpoint without this scheduler's state (saved before it was added) loads, leaving
    #: it as it is (see :class:`~tdreplay.core.stateful_parts.StatefulParts`)
    missing_ok: ClassVar[bool] = True

    #: TorchRL's ``state_dict`` keys (its scheduler's ``__dict__``) and the keys of
    #: :meth:`state_dict` they hold; subclasses add theirs.
    _TORCHRL_KEYS: ClassVar[dict[str, str]] = _TORCHRL_BASE_KEYS
    #: TorchRL ``state_dict`` keys derived from the others (or functions): not loaded.
    _TORCHRL_DERIVED: ClassVar[frozenset[str]] = frozenset()

    def _own_keys(self, state_dict: Any) -> Any:
        """``state_dict`` itself, or, when it is a TorchRL scheduler's state (it holds
        ``"_step_cnt"``, where :meth:`state_dict` has ``"step_count"``), the same state under
        the keys of :meth:`state_dict`. TorchRL's ``param_name`` must name this scheduler's
        parameter (``ValueError`` otherwise); its derived entries (``_delta``, ``operator``,
        ``lambda_fn``) are dropped: this scheduler keeps its own. Other keys are left as they
        are, for :meth:`check_state_dict` to refuse."""
        if not isinstance(state_dict, dict) or "_step_cnt" not in state_dict \
                or "step_count" in state_dict:
            return state_dict
        name = state_dict.get("param_name", self.param_name)
        if name != self.param_name:
            raise ValueError(f"{type(self).__name__} state_dict is TorchRL's scheduler state of "
                             f"param_name={name!r}; this scheduler adjusts "
                             f"{self.param_name!r}.")
        skipped = self._TORCHRL_DERIVED | {"param_name"}
        return {self._TORCHRL_KEYS.get(key, key): value for key, value in state_dict.items()
                if key not in skipped}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming the field unless ``state_dict`` fits this scheduler:
        its keys, and every value the constructor (or the sampler) would refuse, e.g. a
        negative or non-int ``step_count``, a NaN, infinite or meta-tensor ``initial_value``
        (or a negative one for ``alpha`` / ``beta``), a NaN or meta-tensor bound, or
        ``min_value > max_value``; subclasses check their settings the same way.

        A state saved by TorchRL's scheduler (its keys: ``_step_cnt``, ``initial_val``,
        ``_min_val``, ... and ``param_name``) is accepted too and read under this scheduler's
        keys; see :meth:`load_state_dict`."""
        state_dict = self._own_keys(state_dict)
        if not isinstance(state_dict, dict):
            raise ValueError(f"{type(self).__name__} state_dict must be a dict, got "
                             f"{type(state_dict).__name__}.")
        expected, got = set(self.state_dict()), set(state_dict)
        if expected != got:
            raise ValueError(f"{type(self).__name__} state_dict keys differ: expected "
                             f"{sorted(expected)}, got {sorted(got)}.")
        count = state_dict["step_count"]
        if not is_int(count) or int(count) < 0:
            raise ValueError(f"{type(self).__name__} state_dict['step_count'] must be an int "
                             f">= 0, got {count!r}.")
        # the values the constructor (and the sampler, for the initial value) would refuse
        try:
            _in_range(state_dict["initial_value"], self.param_name,
                      "state_dict['initial_value']")
            _bounds(state_dict["min_value"], state_dict["max_value"],
                    "state_dict['min_value']", "state_dict['max_value']")
        except (TypeError, ValueError) as err:
            raise ValueError(f"{type(self).__name__}: {err}") from err

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked first: a bad one changes nothing).

        The ``state_dict`` of TorchRL's scheduler of the same kind and parameter loads too
        (``_step_cnt`` -> ``step_count``, ``initial_val`` -> ``initial_value``, ``_min_val`` /
        ``_max_val`` -> ``min_value`` / ``max_value``, ``final_val`` -> ``final_value``;
        ``param_name`` must match; derived entries such as ``_delta``, ``operator`` and
        ``lambda_fn`` are not read). :meth:`state_dict` keeps its own keys.

        Examples
        --------
        >>> from tdreplay.samplers import PrioritizedSampler
        >>> sampler = PrioritizedSampler(10, alpha=0.7, beta=0.4)
        >>> scheduler = LinearScheduler(sampler, "beta", final_value=1.0, num_steps=4)
        >>> torchrl_state = {"param_name": "beta", "_min_val": float("-inf"),
        ...                  "_max_val": float("inf"), "initial_val": 0.4, "_step_cnt": 2,
        ...                  "final_val": 1.0, "num_steps": 4, "_delta": 0.15}
        >>> scheduler.load_state_dict(torchrl_state)
        >>> scheduler.step_count, sorted(scheduler.state_dict())
        (2, ['final_value', 'initial_value', 'max_value', 'min_value', 'num_steps', 'step_count'])
        """
        state_dict = self._own_keys(state_dict)
        self.check_state_dict(state_dict)
        self.step_count = int(state_dict["step_count"])
        self.initial_value = _as_value(state_dict["initial_value"], "initial_value")
        self.min_value = float(state_dict["min_value"])
        self.max_value = float(state_dict["max_value"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(param_name={self.param_name!r}, "
                f"step_count={self.step_count}, value={self.current_value})")


class LambdaScheduler(ParameterScheduler):
    """Sets the parameter to its initial value times ``lambda_fn(step_count)`` (as
    :class:`torch.optim.lr_scheduler.LambdaLR`).

    Examples
    --------
    >>> from tdreplay.samplers import PrioritizedSampler
    >>> sampler = PrioritizedSampler(10, alpha=0.8, beta=0.5)
    >>> scheduler = LambdaScheduler(sampler, "beta", lambda n: 1 + n / 10, max_value=1.0)
    >>> for _ in range(3):
    ...     scheduler.step()
    >>> sampler.beta
    0.65
    """

    _TORCHRL_DERIVED = frozenset({"lambda_fn"})

    def __init__(self, obj: ReplayBuffer | Sampler, param_name: str,
                 lambda_fn: Callable[[int], float], min_value: float | None = None,
                 max_value: float | None = None) -> None:
        if not callable(lambda_fn):
            raise TypeError(f"lambda_fn must be callable, got {type(lambda_fn).__name__}.")
        self.lambda_fn = lambda_fn
        super().__init__(obj, param_name, min_value, max_value)

    def compute(self, step_count: int) -> Value:
        """The initial value times ``lambda_fn(step_count)``; ``TypeError`` naming
        ``lambda_fn`` when it returns something other than a real number."""
        factor = _as_value(self.lambda_fn(step_count), f"lambda_fn({step_count})")
        return self.initial_value * factor


class LinearScheduler(ParameterScheduler):
    """Moves the parameter linearly from its value when the scheduler is built to
    ``final_value`` in ``num_steps`` steps; it stays at ``final_value`` after.

    Parameters
    ----------
    obj : ReplayBuffer or Sampler
        The buffer whose sampler to adjust, or the sampler.
    param_name : str
        E.g. ``"beta"`` (anneal the importance-sampling correction towards 1).
    final_value : float
        The value reached after ``num_steps`` steps.
    num_steps : int
        Number of steps of the ramp (>= 1).

    Examples
    --------
    >>> import torch
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.samplers import PrioritizedSampler
    >>> from tdreplay.storages import LazyTensorStorage
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10),
    ...                   sampler=PrioritizedSampler(10, alpha=0.7, beta=0.6))
    >>> scheduler = LinearScheduler(rb, param_name="beta", final_value=1.0, num_steps=4)
    >>> values = []
    >>> for _ in range(5):
    ...     scheduler.step()
    ...     values.append(round(rb.sampler.beta, 6))
    >>> values
    [0.7, 0.8, 0.9, 1.0, 1.0]
    >>> rb.state_dict()["_stateful"]["scheduler.beta"]["step_count"]   # saved with the buffer
    5
    """

    _TORCHRL_KEYS = {**_TORCHRL_BASE_KEYS, "final_val": "final_value"}
    _TORCHRL_DERIVED = frozenset({"_delta"})

    def __init__(self, obj: ReplayBuffer | Sampler, param_name: str, final_value: float,
                 num_steps: int) -> None:
        self.final_value = _in_range(final_value, param_name, "final_value")
        self.num_steps = check_required_count(num_steps, "num_steps", 1)
        super().__init__(obj, param_name)
        if isinstance(self.initial_value, torch.Tensor):
            self.final_value = torch.as_tensor(self.final_value).to(self.initial_value)

    def compute(self, step_count: int) -> Value:
        if step_count >= self.num_steps:
            return self.final_value
        delta = (self.final_value - self.initial_value) / self.num_steps
        return self.initial_value + delta * step_count

    @property
    def final_val(self) -> Value:
        """TorchRL's name of :attr:`final_value`, readable and settable.

        Examples
        --------
        >>> from tdreplay.samplers import PrioritizedSampler
        >>> sampler = PrioritizedSampler(10, alpha=0.7, beta=0.4)
        >>> scheduler = LinearScheduler(sampler, "beta", final_value=1.0, num_steps=4)
        >>> scheduler.initial_val, scheduler.final_val   # TorchRL's names
        (0.4, 1.0)
        >>> scheduler.final_val = 0.8
        >>> scheduler.final_value
        0.8
        """
        return self.final_value

    @final_val.setter
    def final_val(self, value: Value) -> None:
        self.final_value = _in_range(value, self.param_name, "final_val")

    def state_dict(self) -> dict[str, Any]:
        final = self.final_value
        return {**super().state_dict(), "num_steps": self.num_steps,
                "final_value": final.clone() if isinstance(final, torch.Tensor) else final}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = self._own_keys(state_dict)
        super().check_state_dict(state_dict)
        try:
            check_required_count(state_dict["num_steps"], "state_dict['num_steps']", 1)
            _in_range(state_dict["final_value"], self.param_name, "state_dict['final_value']")
        except (TypeError, ValueError) as err:
            raise ValueError(f"{type(self).__name__}: {err}") from err

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = self._own_keys(state_dict)
        self.check_state_dict(state_dict)
        super().load_state_dict(state_dict)
        self.num_steps = int(state_dict["num_steps"])
        self.final_value = _as_value(state_dict["final_value"], "final_value")


_MODES = ("multiplicative", "additive")


class StepScheduler(ParameterScheduler):
    """Every ``n_steps`` steps, multiplies the parameter by ``gamma`` (``mode="multiplicative"``)
    or adds ``gamma`` to it (``mode="additive"``), clipped to ``[min_value, max_value]``.

    Parameters
    ----------
    obj : ReplayBuffer or Sampler
        The buffer whose sampler to adjust, or the sampler.
    param_name : str
        E.g. ``"beta"``.
    gamma : float
        Factor or increment. Defaults to 0.9.
    n_steps : int
        Change the parameter every ``n_steps`` steps (>= 1). Defaults to 1.
    mode : {"multiplicative", "additive"}
        Defaults to ``"multiplicative"``.
    min_value, max_value : float, optional
        Bounds.

    Examples
    --------
    >>> from tdreplay.samplers import PrioritizedSampler
    >>> sampler = PrioritizedSampler(10, alpha=0.7, beta=0.6)
    >>> scheduler = StepScheduler(sampler, "beta", gamma=0.1, n_steps=2, mode="additive",
    ...                           max_value=0.75)
    >>> values = []
    >>> for _ in range(5):
    ...     scheduler.step()
    ...     values.append(round(sampler.beta, 6))
    >>> values
    [0.6, 0.7, 0.7, 0.75, 0.75]
    """

    _TORCHRL_DERIVED = frozenset({"operator"})

    def __init__(self, obj: ReplayBuffer | Sampler, param_name: str, gamma: float = 0.9,
                 n_steps: int = 1, mode: str = "multiplicative",
                 min_value: float | None = None, max_value: float | None = None) -> None:
        if mode not in _MODES:
            raise ValueError(f"Invalid mode: {mode!r}. Choose 'multiplicative' or 'additive'.")
        self.gamma = _check_gamma(gamma, mode)
        self.n_steps = check_required_count(n_steps, "n_steps", 1)
        self.mode = mode
        super().__init__(obj, param_name, min_value, max_value)

    def compute(self, step_count: int) -> Value:
        current = self.current_value
        if step_count % self.n_steps:
            return current
        return current + self.gamma if self.mode == "additive" else current * self.gamma

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "gamma": self.gamma, "n_steps": self.n_steps,
                "mode": self.mode}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = self._own_keys(state_dict)
        super().check_state_dict(state_dict)
        mode = state_dict["mode"]
        if not isinstance(mode, str) or mode not in _MODES:
            raise ValueError(f"{type(self).__name__} state_dict['mode'] must be one of "
                             f"{_MODES}, got {mode!r}.")
        try:
            check_required_count(state_dict["n_steps"], "state_dict['n_steps']", 1)
            _check_gamma(state_dict["gamma"], mode, "state_dict['gamma']")
        except (TypeError, ValueError) as err:
            raise ValueError(f"{type(self).__name__}: {err}") from err

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = self._own_keys(state_dict)
        self.check_state_dict(state_dict)
        super().load_state_dict(state_dict)
        self.gamma = float(state_dict["gamma"])
        self.n_steps = int(state_dict["n_steps"])
        self.mode = str(state_dict["mode"])


class SchedulerList:
    """Several schedulers stepped together (in order).

    Examples
    --------
    >>> from tdreplay.samplers import PrioritizedSampler
    >>> sampler = PrioritizedSampler(10, alpha=1.0, beta=0.5)
    >>> schedulers = SchedulerList([LinearScheduler(sampler, "alpha", 0.5, num_steps=5),
    ...                             StepScheduler(sampler, "beta", 0.1, mode="additive")])
    >>> schedulers.step()
    >>> round(sampler.alpha, 6), round(sampler.beta, 6)
    (0.9, 0.6)
    """

    def __init__(self, schedulers: ParameterScheduler | Iterable[ParameterScheduler]) -> None:
        if isinstance(schedulers, ParameterScheduler):
            schedulers = [schedulers]
        self.schedulers: list[ParameterScheduler] = []
        for scheduler in schedulers:
            self.append(scheduler)

    def append(self, scheduler: ParameterScheduler) -> None:
        """Add ``scheduler`` (``TypeError`` unless it is a :class:`ParameterScheduler`)."""
        if not isinstance(scheduler, ParameterScheduler):
            raise TypeError(f"SchedulerList holds ParameterScheduler objects, got "
                            f"{type(scheduler).__name__}.")
        self.schedulers.append(scheduler)

    def step(self) -> None:
        """Step every scheduler, in order, all or none: when one refuses its step (e.g. its
        sampler refuses a negative ``alpha``), those stepped before it are set back (their
        step counts and parameters) and the error propagates."""
        stepped: list[tuple[ParameterScheduler, dict[str, Any], Value]] = []
        try:
            for scheduler in self.schedulers:
                before = (scheduler, scheduler.state_dict(), scheduler.current_value)
                scheduler.step()
                stepped.append(before)
        except BaseException:
            for scheduler, state, value in reversed(stepped):
                scheduler.set_value(value)  # (accepted before)
                scheduler.load_state_dict(state)
            raise

    def state_dict(self) -> dict[str, Any]:
        """The state of every scheduler, by position."""
        return {str(i): s.state_dict() for i, s in enumerate(self.schedulers)}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless ``state_dict`` fits these schedulers."""
        if not isinstance(state_dict, dict) or set(state_dict) != set(self.state_dict()):
            raise ValueError(f"SchedulerList state_dict must hold one state per scheduler "
                             f"({len(self.schedulers)}).")
        for i, scheduler in enumerate(self.schedulers):
            scheduler.check_state_dict(state_dict[str(i)])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (all checked before any scheduler changes)."""
        self.check_state_dict(state_dict)
        for i, scheduler in enumerate(self.schedulers):
            scheduler.load_state_dict(state_dict[str(i)])

    def __len__(self) -> int:
        return len(self.schedulers)

    def __repr__(self) -> str:
        return f"SchedulerList({self.schedulers!r})"
