"""``ObservationNorm``: a fixed affine normalisation, its ``loc`` and ``scale`` as state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag, check_key

from ._state import affine_args, affine_map, check_loc_scale, checked_state
from ._utils import keys_arg, require_tensordict


class ObservationNorm(Transform):
    """Affine map of entries on sample: ``obs * scale + loc`` (``(obs - loc) / scale`` with
    ``standard_normal=True``); the inverse map on extend for ``in_keys_inv``.

    ``loc`` and ``scale`` are given, or left out and computed from data with
    :meth:`init_stats_from` (TorchRL's ``init_stats`` rolls out an environment; a buffer has
    the data already). They are the transform's state: :meth:`state_dict` /
    :meth:`load_state_dict` (keys ``loc``, ``scale``, ``standard_normal``, as TorchRL's).

    Parameters
    ----------
    loc, scale : number or tensor, optional
        Both or neither. A number ``scale`` is clamped to at least ``eps``.
    in_keys : sequence of nested keys
        Entries normalised on sample (required).
    out_keys : sequence of nested keys, optional
        Where they go; defaults to ``in_keys``.
    in_keys_inv, out_keys_inv : sequence of nested keys, optional
        Entries mapped back on extend (nothing happens on extend without them):
        ``out_keys_inv[i]`` read, ``in_keys_inv[i]`` written, as TorchRL's.
    standard_normal : bool
        Standardise (``(obs - loc) / scale``) instead of ``obs * scale + loc``.
    eps : float, optional
        Lower bound of the scale; defaults to the machine epsilon of a floating ``scale``
        tensor, else ``1e-6``.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> t = ObservationNorm(loc=1.0, scale=2.0, in_keys=["obs"], in_keys_inv=["obs"])
    >>> t(TensorDict({"obs": torch.ones(2)}, [2]))["obs"]
    tensor([3., 3.])
    >>> t.inv(TensorDict({"obs": torch.ones(2)}, [2]))["obs"]
    tensor([0., 0.])
    >>> data = TensorDict({"obs": torch.randn(1000, 3) * 5 + 2}, [1000])
    >>> t = ObservationNorm(in_keys=["obs"], standard_normal=True)
    >>> t.init_stats_from(data)
    >>> out = t(data.clone())["obs"]
    >>> bool(out.mean(0).abs().max() < 1e-4), bool((out.std(0) - 1).abs().max() < 1e-4)
    (True, True)
    """

    def __init__(
        self,
        loc: float | torch.Tensor | None = None,
        scale: float | torch.Tensor | None = None,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        standard_normal: bool = False,
        eps: float | None = None,
    ) -> None:
        if in_keys is None:
            raise RuntimeError("ObservationNorm needs in_keys: the entries to normalise.")
        if (loc is None) != (scale is None):
            raise ValueError("ObservationNorm: give both loc and scale, or neither (and call "
                             "init_stats_from).")
        super().__init__(keys_arg(in_keys, "in_keys"),
                         None if out_keys is None else keys_arg(out_keys, "out_keys"),
                         keys_arg(in_keys_inv, "in_keys_inv"),
                         None if out_keys_inv is None else keys_arg(out_keys_inv, "out_keys_inv"))
        if eps is None:
            floating = isinstance(scale, torch.Tensor) and scale.dtype.is_floating_point
            eps = torch.finfo(scale.dtype).eps if floating else 1e-6  # type: ignore[union-attr]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
            raise ValueError(f"ObservationNorm: eps must be a non-negative number, got {eps!r}.")
        self.eps = float(eps)
        self.standard_normal = check_flag(standard_normal, "ObservationNorm: standard_normal")
        self.loc: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        if loc is not None and scale is not None:
            loc, held = affine_args(self, loc, scale)
            if not isinstance(scale, torch.Tensor):
                held = held.clamp_min(self.eps)
            _check_divisor(held, self.standard_normal)
            self.loc, self.scale = loc, held

    @property
    def initialized(self) -> bool:
        """Whether ``loc`` and ``scale`` are set."""
        return self.loc is not None

    def _stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.loc is None or self.scale is None:
            raise RuntimeError("ObservationNorm: loc and scale are not initialized; pass them to "
                               "the constructor or call init_stats_from(data).")
        return self.loc, self.scale

    def _apply_transform(self, obs: torch.Tensor) -> torch.Tensor:
        loc, scale = self._stats()
        return affine_map(self, obs, loc, scale, normalise=self.standard_normal)

    def _inv_apply_transform(self, obs: torch.Tensor) -> torch.Tensor:
        loc, scale = self._stats()
        return affine_map(self, obs, loc, scale, normalise=not self.standard_normal)

    def init_stats_from(
        self,
        data: TensorDictBase,
        reduce_dim: int | Sequence[int] = 0,
        keep_dims: Sequence[int] | None = None,
        key: NestedKey | None = None,
    ) -> None:
        """Set ``loc`` and ``scale`` from the mean and standard deviation of ``data[key]``.

        ``reduce_dim`` are the dimensions reduced (``0``: over the batch); ``keep_dims`` (a
        subset of them) stay as singletons. ``key`` defaults to the only in_key. Raises a
        ``RuntimeError`` when the stats are already set or not finite.
        """
        if self.initialized:
            raise RuntimeError(f"ObservationNorm: loc and scale are already initialized "
                               f"({self.loc}, {self.scale}).")
        if key is None:
            if len(self.in_keys) > 1:
                raise RuntimeError("ObservationNorm has several in_keys: pass key= to say which "
                                   "entry the stats come from.")
            key = self.in_keys[0]
        value = self.read_entry(require_tensordict(self, data), check_key(key, "key"))
        dims = [reduce_dim] if isinstance(reduce_dim, int) else list(reduce_dim)
        if not dims or not all(isinstance(d, int) and -value.ndim <= d < value.ndim for d in dims):
            raise ValueError(f"ObservationNorm: reduce_dim={reduce_dim!r} must name dimensions "
                             f"of {key!r} (shape {tuple(value.shape)}).")
        dims = sorted(d % value.ndim - value.ndim for d in dims)
        keep = sorted(d % value.ndim - value.ndim for d in (keep_dims or ()))
        if not set(keep) <= set(dims):
            raise ValueError("ObservationNorm: keep_dims must be part of reduce_dim.")
        loc = value.mean(dims, keepdim=True)
        scale = value.std(dims, keepdim=True)
        for d in sorted(set(dims) - set(keep)):
            loc, scale = loc.squeeze(d), scale.squeeze(d)
        if not self.standard_normal:
            scale = 1 / scale.clamp_min(self.eps)
            loc = -loc * scale
        if not (torch.isfinite(loc).all() and torch.isfinite(scale).all()):
            raise RuntimeError("ObservationNorm: non-finite loc or scale computed from the data.")
        self.loc, self.scale = loc, scale.clamp_min(self.eps)

    #: ``loc`` / ``scale`` are saved with the buffer's ``state_dict`` / ``dumps``
    has_state = True

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``loc``, ``scale`` and ``standard_normal`` (``{}`` while not initialized)."""
        if self.loc is None or self.scale is None:
            return {}
        return {"loc": self.loc.clone(), "scale": self.scale.clone(),
                "standard_normal": torch.tensor(self.standard_normal)}

    def check_state_dict(self, state_dict: Any) -> None:
        """Refuse (``TypeError`` / ``KeyError`` naming the field) a state other than ``{}``
        or ``loc``, ``scale``, ``standard_normal`` tensors, and (``ValueError``) one whose
        ``standard_normal`` is not one value or whose ``loc`` / ``scale`` are not finite, do
        not broadcast together or differ in shape from the ``loc`` / ``scale`` held
        (as TorchRL's; an uninitialized transform takes any); changes nothing."""
        if isinstance(state_dict, dict) and not state_dict:
            return
        check_loc_scale(self, checked_state(self, state_dict, ("loc", "scale", "standard_normal")))
        _check_divisor(state_dict["scale"], bool(state_dict["standard_normal"]))

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state_dict` returned (checked before anything changes; ``{}``
        makes the transform uninitialized again)."""
        self.check_state_dict(state_dict)
        if not state_dict:
            self.loc = self.scale = None
            return
        self.loc, self.scale = state_dict["loc"].clone(), state_dict["scale"].clone()
        self.standard_normal = bool(state_dict["standard_normal"])

    def __repr__(self) -> str:
        if self.loc is None or self.scale is None:
            return f"ObservationNorm(uninitialized, keys={self.in_keys})"
        return (f"ObservationNorm(loc={self.loc.tolist()}, scale={self.scale.tolist()}, "
                f"keys={self.in_keys})")


def _check_divisor(scale: torch.Tensor, standard_normal: bool) -> None:
    """``ValueError`` naming ``scale`` when it holds a zero and divides (``standard_normal``:
    ``(obs - loc) / scale`` would be ``inf`` / ``nan`` in every sample).

    >>> _check_divisor(torch.tensor([1.0, 0.0]), standard_normal=False)  # multiplies: fine
    >>> _check_divisor(torch.tensor([1.0, 0.0]), standard_normal=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ObservationNorm: scale holds 0 at 1 of its 2 entries, ...
    """
    if standard_normal:
        zeros = int((scale == 0).sum())
        if zeros:
            raise ValueError(f"ObservationNorm: scale holds 0 at {zeros} of its {scale.numel()} "
                             "entries, and standard_normal=True divides by it: every sample "
                             "would be inf / nan. Give a positive scale (a number scale is "
                             "clamped to eps).")
