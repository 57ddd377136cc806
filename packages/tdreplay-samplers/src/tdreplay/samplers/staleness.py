"""``StalenessAwareSampler``: sample by freshness of the policy that collected each item
(TorchRL's ``torchrl.data.replay_buffers.samplers.staleness.StalenessAwareSampler``), for
asynchronous training (e.g. async PPO) where data comes from older policy versions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import is_tensor_collection

from tdreplay.core import Sampler, Storage
from tdreplay.core.utils import check_batch_size, check_not_empty, check_whole_numbers, is_int

__all__ = ["STALENESS_KEY", "StalenessAwareSampler", "StalenessWeightError",
           "default_staleness_weight"]

#: Info entry holding the staleness of every sampled item.
STALENESS_KEY = "staleness"


class StalenessWeightError(ValueError, RuntimeError):
    """``staleness_weight_fn`` gave weights that cannot be sampled from: negative or not finite
    (e.g. ``1 / (1 + staleness)`` at staleness ``-1``, an item newer than
    ``consumer_version``), not one per item, or ``0`` for every item that may be drawn.

    A ``ValueError`` (what tdreplay raised before), and the ``RuntimeError`` TorchRL's sampler
    raises there (from ``torch.multinomial``), so ``except RuntimeError:`` written for TorchRL
    catches it.

    Examples
    --------
    >>> [issubclass(StalenessWeightError, e) for e in (ValueError, RuntimeError)]
    [True, True]
    """


def default_staleness_weight(staleness: torch.Tensor) -> torch.Tensor:
    """The default freshness weight, ``1 / (staleness + 1)``; items newer than the consumer
    (negative staleness, e.g. a collector ahead of the learner's count) weigh as fresh ones
    (TorchRL's weight is infinite or negative there, and sampling fails).

    Examples
    --------
    >>> default_staleness_weight(torch.tensor([0, 1, 3, -2])).tolist()
    [1.0, 0.5, 0.25, 1.0]
    """
    return 1.0 / (staleness.float().clamp_min(0.0) + 1.0)


def _version(value: Any, name: str, minimum: int) -> int:
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r}).")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}.")
    return int(value)


def _check_version_key(value: Any) -> Any:
    """``value`` if it is a nested key (a str, or a non-empty tuple of str), else
    ``TypeError`` naming ``version_key``."""
    if isinstance(value, str) or (isinstance(value, tuple) and value
                                  and all(isinstance(k, str) for k in value)):
        return value[0] if isinstance(value, tuple) and len(value) == 1 else value
    raise TypeError(f"version_key must be a str or a non-empty tuple of str (a nested key), got "
                    f"{type(value).__name__} ({value!r}).")


class StalenessAwareSampler(Sampler):
    """Samples items in proportion to a weight that decays with their staleness
    ``consumer_version - policy_version``, leaving out items staler than ``max_staleness``.

    The training loop sets :attr:`consumer_version` (e.g. the number of optimizer steps or
    weight updates); every item carries the version of the policy that collected it under
    ``version_key``. Only items within ``max_staleness`` whose weight is positive are drawn:
    without replacement when there are at least as many of them as the batch holds, with
    replacement among them otherwise (an item of weight 0 is never drawn);
    ``info["staleness"]`` holds the staleness of each drawn item.

    Parameters
    ----------
    max_staleness : int
        Items with ``staleness > max_staleness`` are never drawn; ``-1`` (default): no cutoff.
    staleness_weight_fn : callable, optional
        Maps a staleness tensor to one finite weight >= 0 per item (``0``: never drawn).
        Defaults to :func:`default_staleness_weight` (``1 / (staleness + 1)``).
    version_key : NestedKey
        Entry of the stored items holding the policy version. Defaults to
        ``"policy_version"``.

    Raises
    ------
    TypeError
        ``version_key`` is not a nested key; (write) the versions are bool or complex.
    KeyError
        (``sample``) the stored items have no ``version_key`` entry.
    RuntimeError
        (``sample``) every item is staler than ``max_staleness``.
    ValueError
        (write, through :meth:`check_write`) a policy version is fractional, NaN or infinite:
        nothing is written.
    StalenessWeightError
        (``sample``; a ``ValueError`` and TorchRL's ``RuntimeError``) the weights are negative
        or not finite, or every item within ``max_staleness`` has weight 0 (there is nothing
        to draw).

    The state (:meth:`state_dict`) is ``consumer_version`` and ``max_staleness``.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import TensorDictReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> sampler = StalenessAwareSampler(max_staleness=2)
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler,
    ...                             batch_size=4)
    >>> for version in range(5):
    ...     _ = rb.extend(TensorDict({"obs": torch.randn(10, 3),
    ...                               "policy_version": torch.full((10,), version)}, [10]))
    >>> sampler.consumer_version = 4
    >>> batch = rb.sample()
    >>> bool((batch["policy_version"] >= 2).all()), bool((batch["staleness"] <= 2).all())
    (True, True)

    A weight function that is not finite for items newer than ``consumer_version`` (staleness
    ``-1`` here) makes ``sample`` raise, as in TorchRL:

    >>> sampler = StalenessAwareSampler(staleness_weight_fn=lambda st: 1.0 / (1.0 + st))
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler,
    ...                             batch_size=2)
    >>> _ = rb.extend(TensorDict({"policy_version": torch.tensor([0, 1])}, [2]))
    >>> try:
    ...     rb.sample()
    ... except RuntimeError as err:  # TorchRL's class; a ValueError too
    ...     print(type(err).__name__, isinstance(err, ValueError))
    StalenessWeightError True
    """

    info_keys = (STALENESS_KEY,)

    def __init__(self, max_staleness: int = -1,
                 staleness_weight_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 version_key: Any = "policy_version") -> None:
        if staleness_weight_fn is not None and not callable(staleness_weight_fn):
            raise TypeError(f"staleness_weight_fn must be callable, got "
                            f"{type(staleness_weight_fn).__name__}.")
        self._max_staleness = _version(max_staleness, "max_staleness", -1)
        self._consumer_version = 0
        self._version_key = _check_version_key(version_key)
        self.staleness_weight_fn = staleness_weight_fn or default_staleness_weight

    @property
    def version_key(self) -> Any:
        """Entry of the stored items holding the policy version (settable; a nested key)."""
        return self._version_key

    @version_key.setter
    def version_key(self, value: Any) -> None:
        self._version_key = _check_version_key(value)

    @property
    def consumer_version(self) -> int:
        """The learner's current version (training iteration, weight update, ...)."""
        return self._consumer_version

    @consumer_version.setter
    def consumer_version(self, value: int) -> None:
        self._consumer_version = _version(value, "consumer_version", 0)

    def increment_consumer_version(self) -> None:
        """Add 1 to :attr:`consumer_version`."""
        self._consumer_version += 1

    @property
    def max_staleness(self) -> int:
        """Largest staleness an item may have to be drawn (``-1``: no limit)."""
        return self._max_staleness

    @max_staleness.setter
    def max_staleness(self, value: int) -> None:
        self._max_staleness = _version(value, "max_staleness", -1)

    # ---- writes ------------------------------------------------------------------------------
    def check_write(self, data: Any) -> None:
        """Refuse policy versions that are not whole numbers before they are written: a
        ``TypeError`` for bool or complex versions, a ``ValueError`` for fractional, NaN or
        infinite ones, both naming ``version_key`` (stored, they would make every later sample
        fail). Data without the entry is left to :meth:`sample`, which names the key."""
        if not is_tensor_collection(data):
            return
        versions = data.get(self._version_key, None)
        if not isinstance(versions, torch.Tensor):
            return
        if versions.dtype == torch.bool:
            raise TypeError(f"version_key {self._version_key!r} must hold integer policy "
                            f"versions, got dtype {versions.dtype}.")
        check_whole_numbers(versions, f"version_key {self._version_key!r}", "policy versions")

    # ---- sampling ----------------------------------------------------------------------------
    def versions(self, storage: Storage) -> torch.Tensor:
        """The policy version of every written slot (flat, int64: exact for any count, where
        float32 would round versions above 2**24), read from ``storage``."""
        data = storage.default_collate(storage[:])
        versions = data.get(self.version_key, None) if is_tensor_collection(data) else None
        if not isinstance(versions, torch.Tensor):
            raise KeyError(f"Could not find key {self.version_key!r} in the replay buffer "
                           "storage. Make sure data written to the buffer contains this key "
                           "(e.g., by adding the PolicyVersion transform to the environment "
                           "or enabling policy-version tracking on the collector).")
        return versions.reshape(len(storage), -1)[:, 0].to(torch.int64)

    def _fresh_enough(self, staleness: torch.Tensor) -> torch.Tensor:
        """Slots whose ``staleness`` is within :attr:`max_staleness` (an error if none is)."""
        if self._max_staleness < 0:
            return torch.arange(staleness.numel(), device=staleness.device)
        valid = (staleness <= self._max_staleness).nonzero().reshape(-1)
        if not valid.numel():
            raise RuntimeError(
                f"All {staleness.numel()} entries in the buffer exceed max_staleness="
                f"{self._max_staleness} (consumer_version={self._consumer_version}). Increase "
                "max_staleness or update collector policy weights more frequently.")
        return valid

    def _weights(self, staleness: torch.Tensor) -> torch.Tensor:
        """``staleness_weight_fn`` of ``staleness``, checked: one finite weight >= 0 each."""
        weights = torch.as_tensor(self.staleness_weight_fn(staleness)).float()
        if weights.shape != staleness.shape or not bool(torch.isfinite(weights).all()) \
                or bool((weights < 0).any()):
            raise StalenessWeightError("staleness_weight_fn must return one finite weight >= 0 "
                                       "per item "
                             "(check it for staleness <= -1, i.e. items newer than "
                             "consumer_version).")
        return weights

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Draw ``batch_size`` fresh-enough slots of positive weight, weighted by freshness."""
        check_batch_size(batch_size)
        check_not_empty(storage)
        # exact in int64: the cutoff compares whole numbers; the weight function and info get
        # float staleness, as TorchRL's (small numbers then, exact)
        staleness = self._consumer_version - self.versions(storage)
        valid = self._fresh_enough(staleness)
        staleness = staleness.float()
        weights = self._weights(staleness[valid])
        drawable = weights > 0
        if not bool(drawable.any()):
            raise StalenessWeightError(
                f"staleness_weight_fn gave weight 0 to every one of the {valid.numel()} items "
                f"that may be drawn (max_staleness={self._max_staleness}, consumer_version="
                f"{self._consumer_version}): there is nothing to draw.")
        valid, weights = valid[drawable], weights[drawable]
        generator = self._rng if self._rng is None or \
            self._rng.device == weights.device else None
        drawn = torch.multinomial(weights, batch_size, replacement=batch_size > valid.numel(),
                                  generator=generator)
        index = valid[drawn]
        return index, {STALENESS_KEY: staleness[index]}

    # ---- state -------------------------------------------------------------------------------
    def empty(self) -> None:
        """Reset :attr:`consumer_version` to 0 (as TorchRL)."""
        self._consumer_version = 0

    def state_dict(self) -> dict[str, Any]:
        return {"consumer_version": self._consumer_version,
                "max_staleness": self._max_staleness}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming the field unless ``state_dict`` can be loaded."""
        super().check_state_dict(state_dict)
        try:
            _version(state_dict["consumer_version"], "consumer_version", 0)
            _version(state_dict["max_staleness"], "max_staleness", -1)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{type(self).__name__} state_dict: {err}") from err

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked first: a bad one changes nothing)."""
        self.check_state_dict(state_dict)
        self._consumer_version = int(state_dict["consumer_version"])
        self._max_staleness = int(state_dict["max_staleness"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(consumer_version={self._consumer_version}, "
                f"max_staleness={self._max_staleness})")
