"""Trajectory utilities: :func:`split_trajectories`."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection, unravel_key

from .utils import check_whole_numbers

__all__ = ["check_trajectory_ids", "split_trajectories"]


def _as_tuple(key: Any) -> tuple[str, ...]:
    key = unravel_key(key)
    return key if isinstance(key, tuple) else (key,)


def _join(prefix: Any, name: str) -> Any:
    return name if prefix is None else unravel_key((*_as_tuple(prefix), name))


def _per_step(values: torch.Tensor, shape: torch.Size, what: str) -> torch.Tensor:
    """``values`` reduced to exactly one entry per step of a rollout of batch ``shape``."""
    if values.shape[: len(shape)] != shape:
        raise ValueError(f"{what} has shape {tuple(values.shape)}, which does not start with the "
                         f"rollout's batch size {tuple(shape)}.")
    return values.reshape(*shape, -1)


def check_trajectory_ids(ids: torch.Tensor, key: Any) -> torch.Tensor:
    """``ids``, refused unless they are trajectory ids as the slice samplers take them:
    integers, bools, or floats holding whole finite numbers (``ValueError`` naming ``key``
    for NaN, inf or fractional ids; ``TypeError`` for complex ones).

    Examples
    --------
    >>> check_trajectory_ids(torch.tensor([0.0, 0.0, 1.0]), "episode").tolist()
    [0.0, 0.0, 1.0]
    >>> check_trajectory_ids(torch.tensor([0.0, float("nan")]), "episode")
    Traceback (most recent call last):
    ...
    ValueError: the trajectory key 'episode' must hold whole-number trajectory ids: found nan.
    """
    check_whole_numbers(ids, f"the trajectory key {key!r}", "trajectory ids")
    return ids


def _ids_from_done(done: torch.Tensor) -> torch.Tensor:
    """Trajectory ids numbering the runs that ``done`` (``[..., T, k]``) closes, per row."""
    ended = (done != 0).any(-1)
    # a step starts a new trajectory when the previous step of its row was done
    starts = torch.zeros_like(ended)
    starts[..., 1:] = ended[..., :-1]
    starts[..., 0] = True
    return starts.reshape(-1).cumsum(0).reshape(ended.shape) - 1


def split_trajectories(
    rollout: TensorDictBase,
    *,
    prefix: Any = None,
    trajectory_key: Any = None,
    done_key: Any = None,
    as_nested: bool | torch.layout = False,
) -> TensorDictBase:
    """Split a rollout into one zero-padded row per trajectory.

    The rollout has its trajectories along its last batch dimension (``[T]`` or ``[B, T]``,
    e.g. a collector's output or slices sampled by a
    :class:`~tdreplay.samplers.SliceSampler` with ``strict_length=False``). A trajectory is a
    run of consecutive steps of one row with the same trajectory id; a row boundary always
    ends a trajectory. The result has batch size ``[num_trajectories, max_length]``, rows in
    order of their first step, every entry zero-padded after the trajectory's end, and a
    boolean ``mask`` entry beside the trajectory ids telling the real steps from the padding.
    The input is not modified.

    Parameters
    ----------
    rollout : TensorDictBase
        Batch size ``[..., T]`` (at least one dimension).
    prefix : NestedKey, optional
        Where the ids (``(prefix, "traj_ids")``) and the mask (``(prefix, "mask")``) live.
        Defaults to ``"collector"`` when the rollout has a ``"collector"`` entry, else no
        prefix (``"traj_ids"`` / ``"mask"``).
    trajectory_key : NestedKey, optional
        Entry holding the trajectory ids; supersedes ``prefix`` and ``done_key``. The mask is
        written next to it (``trajectory_key[:-1] + ("mask",)``).
    done_key : NestedKey, optional
        Used when the rollout has no trajectory ids: the end-of-trajectory flags, read under
        ``"next"`` as in TorchRL (``"done"``, the default, reads ``("next", "done")``; a key
        already starting with ``"next"`` is read as given). The ids computed from it are
        written at ``(prefix, "traj_ids")`` in the result.
    as_nested : bool or torch.layout
        Return a ``[num_trajectories]`` TensorDict of nested tensors (one entry per
        trajectory, no padding and no mask) instead; a layout (e.g. ``torch.jagged``) selects
        the nested layout (strided by default).

    Returns
    -------
    TensorDictBase
        The padded ``[num_trajectories, max_length]`` TensorDict (or the nested one).

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> rollout = TensorDict({
    ...     "obs": torch.arange(8.).view(2, 4),
    ...     "collector": {"traj_ids": torch.tensor([[0, 0, 1, 1], [2, 2, 2, 3]])},
    ... }, batch_size=[2, 4])
    >>> out = split_trajectories(rollout)
    >>> out.batch_size
    torch.Size([4, 3])
    >>> out["obs"].tolist()
    [[0.0, 1.0, 0.0], [2.0, 3.0, 0.0], [4.0, 5.0, 6.0], [7.0, 0.0, 0.0]]
    >>> out["collector", "mask"].sum(-1).tolist()
    [2, 2, 3, 1]
    """
    if not is_tensor_collection(rollout):
        raise TypeError(f"rollout must be a TensorDict, got {type(rollout).__name__}.")
    if rollout.batch_dims == 0:
        raise ValueError("rollout must have at least one batch dimension (time), got "
                         "batch_size=[].")
    ids, ids_key, mask_key, derived = _trajectory_ids(rollout, prefix, trajectory_key,
                                                      done_key)
    # runs of equal ids along time; a row boundary always starts a new run
    new_run = torch.ones(rollout.batch_size, dtype=torch.bool, device=ids.device)
    new_run[..., 1:] = ids[..., 1:] != ids[..., :-1]
    new_run = new_run.reshape(-1)
    starts = new_run.nonzero().squeeze(-1)
    lengths = torch.diff(starts, append=torch.tensor([new_run.numel()], device=starts.device))
    flat = rollout.reshape(-1)
    if derived:
        flat = flat.clone(recurse=False)
        flat.set(ids_key, ids.reshape(-1).to(torch.long))
    if as_nested:
        layout = as_nested if isinstance(as_nested, torch.layout) else torch.strided
        return _nested_runs(flat, lengths.tolist(), layout)
    out, mask = _padded_runs(flat, starts, lengths)
    out.set(mask_key, mask.to(rollout.device) if rollout.device is not None else mask)
    return out


def _trajectory_ids(rollout: TensorDictBase, prefix: Any, trajectory_key: Any, done_key: Any
                    ) -> tuple[torch.Tensor, Any, Any, bool]:
    """``(ids shaped like the batch, the ids' key, the mask's key, derived)``: the rollout's
    trajectory ids, or (``derived``) ids computed from its done flags (see
    :func:`split_trajectories`)."""
    shape = rollout.batch_size
    keys = rollout.keys(include_nested=True, leaves_only=True)
    if trajectory_key is not None:
        trajectory_key = unravel_key(trajectory_key)
        if trajectory_key not in keys:
            raise KeyError(f"trajectory_key {trajectory_key!r} is not in the rollout (keys: "
                           f"{sorted(map(str, keys))}).")
        parent = _as_tuple(trajectory_key)[:-1]
        ids_key, mask_key = trajectory_key, _join(parent if parent else None, "mask")
    else:
        if prefix is None and "collector" in rollout.keys():
            prefix = "collector"
        ids_key, mask_key = _join(prefix, "traj_ids"), _join(prefix, "mask")
        if ids_key not in keys:
            done_path = _as_tuple("done" if done_key is None else done_key)
            if done_path[0] != "next":
                done_path = ("next", *done_path)
            done_path = unravel_key(done_path)
            if done_path not in keys:
                raise KeyError(
                    f"split_trajectories needs trajectory ids at {ids_key!r} or done flags at "
                    f"{done_path!r}; the rollout has neither (keys: {sorted(map(str, keys))}). "
                    "Pass trajectory_key=... or done_key=...")
            done = _per_step(rollout.get(done_path), shape, f"done entry {done_path!r}")
            return _ids_from_done(done), ids_key, mask_key, True
    ids = _per_step(check_trajectory_ids(rollout.get(ids_key), ids_key), shape,
                    f"trajectory ids {ids_key!r}")
    if ids.shape[-1] != 1:
        raise ValueError(f"trajectory ids {ids_key!r} must hold one id per step, got shape "
                         f"{tuple(rollout.get(ids_key).shape)}.")
    return ids[..., 0], ids_key, mask_key, False


def _padded_runs(flat: TensorDictBase, starts: torch.Tensor, lengths: torch.Tensor
                 ) -> tuple[TensorDictBase, torch.Tensor]:
    """The runs of ``flat`` (beginning at ``starts``) as rows of ``[runs, longest]``,
    zero-padded, and the mask of their real steps."""
    num, max_len = starts.numel(), int(lengths.max())
    offsets = torch.arange(max_len, device=starts.device)
    mask = offsets < lengths[:, None]
    gather = torch.where(mask, starts[:, None] + offsets, starts[:, None])
    out = flat[gather.reshape(-1)].reshape(num, max_len)

    def pad(x: torch.Tensor) -> torch.Tensor:
        m = mask.to(x.device).reshape(num, max_len, *(1,) * (x.ndim - 2))
        return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))

    padded = out.apply(pad)
    assert padded is not None  # apply returns a new TensorDict unless inplace=True
    return padded, mask


def _nested_runs(flat: TensorDictBase, lengths: list[int], layout: torch.layout
                 ) -> TensorDictBase:
    """The runs of ``flat`` (``lengths`` steps each) as a TensorDict of nested tensors."""

    def nest(x: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
            return torch.nested.nested_tensor(list(x.split(lengths, 0)), layout=layout)

    nested = flat.apply(nest, batch_size=[len(lengths)], call_on_nested=False)
    assert nested is not None  # apply returns a new TensorDict unless inplace=True
    return nested
