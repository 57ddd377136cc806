"""``PolicyAgeFilter``: drop rows stamped by a behaviour policy too many versions old."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag, check_key, check_required_count, is_int


def _check_current_version(value: Any) -> int | Callable[[], int]:
    if not callable(value) and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"PolicyAgeFilter: current_version must be an int or a callable "
                        f"returning one, got {value!r}.")
    return value


class PolicyAgeFilter(Transform):
    """Drops rows whose ``policy_version`` lags the current version by more than
    ``max_policy_lag``, on extend and add (stale rows never enter the buffer: ``add`` of a stale
    item writes nothing and returns an empty tensor of slots) and on sample (rows that became
    stale since are dropped, so a batch may come back smaller).

    A row's version is its oldest element's (``[B, T]`` rows: the minimum over ``T``). Data
    without the version entry passes through with a warning (once), or raises a ``KeyError``
    with ``strict=True``.

    Use it on a :class:`~tdreplay.core.TensorDictReplayBuffer` when the sample's ``index`` or
    ``priority_weight`` matter: they are entries of its batch, dropped with their rows. A
    plain ``ReplayBuffer``'s ``sample(return_info=True)`` returns the info of the rows drawn,
    before the filter dropped some (as TorchRL's), which then no longer line up with them.

    Parameters
    ----------
    current_version : int or callable
        The live policy version, or a function returning it (called on every filtering pass).
    max_policy_lag : int
        Largest allowed ``current_version - version`` (non-negative).
    policy_version_key : nested key
        Entry holding the version that produced each row. Defaults to ``"policy_version"``.
    strict : bool
        Raise on data without that entry instead of passing it through.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ReplayBuffer
    >>> from tdreplay.storages import LazyTensorStorage
    >>> version = {"now": 3}
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10),
    ...                   transform=PolicyAgeFilter(lambda: version["now"], max_policy_lag=1))
    >>> _ = rb.extend(TensorDict({"policy_version": torch.tensor([0, 2, 3])}, [3]))
    >>> len(rb)                                  # version 0 was too old to enter
    2
    >>> version["now"] = 4
    >>> rb[:]["policy_version"]                  # version 2 is now too old too
    tensor([3])
    """

    #: already filters both sides (``inv`` the writes, ``forward`` the samples): appended with
    #: ``invert=True`` its ``forward`` would filter the writes, and let one stale item that
    #: ``add`` writes through (``forward`` keeps one item: ``rb[i]`` reads it), so
    #: ``append_transform(t, invert=True)`` is refused
    invertible = False

    def __init__(
        self,
        current_version: int | Callable[[], int],
        max_policy_lag: int,
        *,
        policy_version_key: NestedKey = "policy_version",
        strict: bool = False,
    ) -> None:
        super().__init__()
        self._current_version = _check_current_version(current_version)
        self._max_policy_lag = check_required_count(max_policy_lag, "max_policy_lag", 0)
        self.policy_version_key = check_key(policy_version_key, "policy_version_key")
        self.strict = check_flag(strict, "PolicyAgeFilter: strict")
        self._warned = False

    @property
    def current_version(self) -> int | Callable[[], int]:
        """The live policy version, or the function returning it (settable; checked as the
        constructor checks it: a refused value leaves the filter as it was)."""
        return self._current_version

    @current_version.setter
    def current_version(self, value: int | Callable[[], int]) -> None:
        self._current_version = _check_current_version(value)

    @property
    def max_policy_lag(self) -> int:
        """Largest allowed ``current_version - version`` (settable; a non-negative int)."""
        return self._max_policy_lag

    @max_policy_lag.setter
    def max_policy_lag(self, value: int) -> None:
        self._max_policy_lag = check_required_count(value, "max_policy_lag", 0)

    def version_now(self) -> int:
        """The current policy version (calls ``current_version`` when it is a callable)."""
        version = self.current_version
        if not callable(version):
            return version
        now = version()
        if not is_int(now):  # (a float or a string was cut to an int silently)
            raise TypeError(f"PolicyAgeFilter: current_version must return an int (a Python, "
                            f"numpy or 0-d integer tensor), got {now!r}.")
        return int(now)

    def filter(self, data: Any) -> Any:
        """``data`` without its stale rows (unchanged when nothing is stale)."""
        if not isinstance(data, TensorDictBase) or data.batch_dims < 1 \
                or data.batch_size[0] == 0:
            return data
        version = self._version_of(data)
        if version is None:
            return data
        oldest = version.reshape(data.batch_size[0], -1).min(dim=-1).values
        keep = self.version_now() - oldest <= self.max_policy_lag
        return data if bool(keep.all()) else data[keep]

    def _version_of(self, data: TensorDictBase) -> Any:
        """The version entry of ``data``; ``None`` (with a warning, once) or ``KeyError``
        (``strict``) when there is none."""
        version = data.get(self.policy_version_key, None)
        if version is None:
            if self.strict:
                raise KeyError(f"PolicyAgeFilter: {self.policy_version_key!r} is not in the "
                               "data; check that the producer stamps versions under that key, "
                               "or pass strict=False to let unstamped data through.")
            if not self._warned:
                self._warned = True
                warnings.warn(f"PolicyAgeFilter: no {self.policy_version_key!r} entry in the "
                              "data; it passes through unfiltered.", UserWarning, stacklevel=4)
        return version

    def forward(self, data: Any) -> Any:
        """The rows of a batch that are fresh enough; one item (``rb[i]``) as it is."""
        return self.filter(data)

    def inv(self, data: Any) -> Any:
        """The rows of a batch to write that are fresh enough; for one item (``add``, no batch
        dim), the item, or ``None`` when it is stale (the buffer then writes nothing)."""
        if isinstance(data, TensorDictBase) and data.batch_dims == 0:
            version = self._version_of(data)
            if version is not None and self.version_now() - int(version.min()) \
                    > self.max_policy_lag:
                return None
            return data
        return self.filter(data)

    def __repr__(self) -> str:
        return (f"PolicyAgeFilter(max_policy_lag={self.max_policy_lag}, "
                f"policy_version_key={self.policy_version_key!r})")
