"""``NextStateReconstructor``: rebuild ``("next", key)`` entries from the following sample row."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag, check_key, check_required_count

from ._utils import prefix_next, require_tensordict


def _optional_key(key: NestedKey | None, name: str) -> NestedKey | None:
    return None if key is None else check_key(key, name)


class NextStateReconstructor(Transform):
    """Fills ``("next", key)`` on sample with ``key`` of the next row, where that row follows.

    Data stored without its ``("next", ...)`` observations (they repeat the root observations
    one step later) gets them back on sample: for each position ``i`` of the flat ``[B]``
    sample, ``("next", key)[i] = key[i + 1]`` when row ``i + 1`` is the next step of the same
    trajectory, else ``fill_value``. Row ``i + 1`` follows row ``i`` when all the configured
    checks agree:

    - ``traj_key``: both rows carry the same trajectory id;
    - ``done_key``: row ``i`` is not the last step of its trajectory (catches two slices of one
      trajectory placed back to back);
    - ``step_count_key`` (off by default): the step counts are consecutive;
    - ``index_key`` (off by default): row ``i + 1`` was read from the slot ``slot_stride``
      after row ``i``'s (a buffer's samples hold their slots under ``"index"``; the next step
      of an environment is 1 slot on in a storage of ``ndim=1``, ``E`` slots on in one of
      ``ndim=2`` with ``E`` environments). A step across the end of the ring (last slot, then
      slot 0) is not rebuilt: the transform does not know the capacity.

    With a ``SliceSampler`` every step of a slice but its last is rebuilt. A random sample
    rarely holds the next step of a row, but two rows of one trajectory drawn one after the
    other pass the trajectory and done checks: give ``step_count_key`` or ``index_key`` for
    such samples, else their next observations are not those of the next step. An existing
    ``("next", key)`` entry is overwritten.

    Parameters
    ----------
    keys : sequence of nested keys
        Root entries whose ``("next", ...)`` counterparts are rebuilt. Defaults to
        ``("observation",)``.
    traj_key : nested key or None
        Trajectory ids. Defaults to ``("collector", "traj_ids")``; ``None`` skips the check.
    done_key : nested key or None
        End-of-trajectory flags. Defaults to ``("next", "done")``; ``None`` skips the check.
    step_count_key : nested key or None
        Step counts, checked when given.
    index_key : nested key or None
        The slots the rows were read from (``"index"`` in a buffer's samples), checked when
        given (skipped for a sample without it).
    slot_stride : int
        Slots from a step to the next step of its environment. Defaults to 1 (``ndim=1``).
    fill_value : float or int
        Written where no next step is in the sample. Defaults to NaN, which an integer entry
        cannot hold (``TypeError``): give an int for those.
    strict : bool
        Raise a ``KeyError`` when a configured check's entry is absent from the sample
        (default); ``False`` skips that check.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"observation": torch.arange(4.0).unsqueeze(-1),
    ...                  ("collector", "traj_ids"): torch.tensor([0, 0, 1, 1]),
    ...                  ("next", "done"): torch.tensor([False, True, False, True])}, [4])
    >>> NextStateReconstructor()(td)["next", "observation"].squeeze(-1)
    tensor([1., nan, 3., nan])
    """

    def __init__(
        self,
        keys: Sequence[NestedKey] = ("observation",),
        *,
        traj_key: NestedKey | None = ("collector", "traj_ids"),
        done_key: NestedKey | None = ("next", "done"),
        step_count_key: NestedKey | None = None,
        index_key: NestedKey | None = None,
        slot_stride: int = 1,
        fill_value: float = float("nan"),
        strict: bool = True,
    ) -> None:
        if isinstance(keys, str):
            keys = [keys]
        if not isinstance(keys, Sequence):
            raise TypeError(f"NextStateReconstructor: keys must be a sequence of keys, got "
                            f"{keys!r}.")
        root_keys = [check_key(key, "keys") for key in keys]
        if not root_keys:
            raise ValueError("NextStateReconstructor needs at least one key in keys.")
        super().__init__(in_keys=root_keys, out_keys=[prefix_next(k) for k in root_keys])
        self.keys = tuple(root_keys)
        self.traj_key = _optional_key(traj_key, "traj_key")
        self.done_key = _optional_key(done_key, "done_key")
        self.step_count_key = _optional_key(step_count_key, "step_count_key")
        self.index_key = _optional_key(index_key, "index_key")
        self.slot_stride = check_required_count(slot_stride, "NextStateReconstructor: slot_stride",
                                                1)
        if isinstance(fill_value, bool) or not isinstance(fill_value, (int, float)):
            raise TypeError(f"NextStateReconstructor: fill_value must be a number, got "
                            f"{fill_value!r}.")
        self.fill_value = fill_value
        self.strict = check_flag(strict, "NextStateReconstructor: strict")

    def _marker(self, data: TensorDictBase, key: NestedKey | None, what: str
                ) -> torch.Tensor | None:
        """The entry ``key`` reduced to one value per row, or ``None`` (check skipped)."""
        if key is None:
            return None
        value = data.get(key, None)
        if value is None:
            if self.strict:
                raise KeyError(f"NextStateReconstructor: the {what} {key!r} is not in the "
                               "sample. Pass the matching argument (None disables the check), "
                               "or strict=False to skip checks whose entry is absent.")
            return None
        if not isinstance(value, torch.Tensor) or value.ndim == 0 \
                or value.shape[0] != data.batch_size[0]:
            raise ValueError(f"NextStateReconstructor: the {what} {key!r} must have one value "
                             f"per row of the [{data.batch_size[0]}] sample.")
        return value.reshape(value.shape[0], -1)[:, 0]

    def follows(self, data: TensorDictBase) -> torch.Tensor:
        """A ``[B]`` bool mask: ``True`` at ``i`` when row ``i + 1`` is the next step of row
        ``i`` (always ``False`` for the last row)."""
        n = data.batch_size[0]
        valid = torch.zeros(n, dtype=torch.bool, device=data.device)
        valid[:-1] = True
        traj = self._marker(data, self.traj_key, "trajectory key")
        if traj is not None:
            valid[:-1] &= traj[1:] == traj[:-1]
        done = self._marker(data, self.done_key, "done key")
        if done is not None:
            valid[:-1] &= ~done[:-1].bool()
        steps = self._marker(data, self.step_count_key, "step-count key")
        if steps is not None:
            valid[:-1] &= steps[1:] == steps[:-1] + 1
        slots = data.get(self.index_key, None) if self.index_key is not None else None
        if isinstance(slots, torch.Tensor) and slots.ndim == 1 and slots.shape[0] == n:
            valid[:-1] &= slots[1:] == slots[:-1] + self.slot_stride
        return valid

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        if data.batch_dims != 1:
            raise ValueError(f"NextStateReconstructor expects a flat [B] sample, got "
                             f"batch_size={tuple(data.batch_size)}; reshape it to one dim.")
        n = data.batch_size[0]
        if n == 0:
            return data
        roots = [self.read_entry(data, key) for key in self.keys]
        nan_fill = isinstance(self.fill_value, float) and math.isnan(self.fill_value)
        for key, root in zip(self.keys, roots):
            if nan_fill and not root.is_floating_point():
                raise TypeError(f"NextStateReconstructor: entry {key!r} has the non-floating "
                                f"dtype {root.dtype}, which cannot hold NaN; pass an integer "
                                "fill_value.")
        invalid = ~self.follows(data)
        for out_key, root in zip(self.out_keys, roots):
            shifted = torch.empty_like(root)
            shifted[:-1] = root[1:]
            mask = invalid.reshape(n, *([1] * (root.ndim - 1)))
            data.set(out_key, torch.where(mask, root.new_full((), self.fill_value), shifted))
        return data

    def __repr__(self) -> str:
        return (f"NextStateReconstructor(keys={list(self.keys)}, traj_key={self.traj_key!r}, "
                f"done_key={self.done_key!r}, step_count_key={self.step_count_key!r}, "
                f"index_key={self.index_key!r})")
