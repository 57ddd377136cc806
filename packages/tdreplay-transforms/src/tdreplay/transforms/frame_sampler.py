"""Slice samplers whose batch size counts frame stacks, for ``CatFrames`` applied on sample.

``CatFrames.make_rb_transform_and_sampler`` builds them: a buffer that stores single frames
and stacks ``N`` of them on sample draws, for a batch of ``B``, ``B`` slices of ``N``
consecutive steps (``B * N`` rows), which its transform turns back into ``B`` stacked rows.
This module imports ``tdreplay.samplers`` (and with it numba), so ``tdreplay.transforms``
imports it only when such a sampler is made.
"""

from __future__ import annotations

from typing import Any

import torch

from tdreplay.core import Storage
from tdreplay.samplers import SliceSampler, SliceSamplerWithoutReplacement


def _frames(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"frames must be a positive int, got {value!r}.")
    return value


def _slice_arguments(owner: str, frames: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The slice sampler's arguments for stacks of ``frames`` frames, after refusing what
    would give slices of another length (which the stacking transform cannot regroup)."""
    if "slice_len" in kwargs or "num_slices" in kwargs:
        raise TypeError(f"{owner} sets slice_len to frames; do not pass slice_len or "
                        "num_slices.")
    why = ("every slice must hold exactly `frames` steps of one trajectory to be stacked and "
           "regrouped (a stack is drawn where `frames` steps end: a trajectory's first "
           "frames - 1 steps are never the kept step, and a trajectory shorter than a stack "
           "is never drawn)")
    if kwargs.get("strict_length", True) is not True:
        raise ValueError(f"{owner} needs strict_length=True, got "
                         f"strict_length={kwargs['strict_length']!r}: {why}.")
    span = kwargs.pop("span", False)  # (no span: the samplers' default)
    if span not in (False, (False, False), [False, False]):
        # (slices cut short at a trajectory's ends were regrouped across slice boundaries)
        raise ValueError(f"{owner} takes no span, got span={span!r}: {why}.")
    for name in ("truncated_key", "init_key"):
        # a slice here is the window of frames of the step it ends at, not a cut of its
        # trajectory: marking its last step truncated (and done) or its first step as a
        # reset would overwrite the stored flags of the steps a sample keeps
        if kwargs.pop(name, None) is not None:
            raise ValueError(f"{owner} takes no {name} (only None): its slices are windows of "
                             "frames, not cuts of trajectories, so samples carry the stored "
                             "done / truncated / is_init flags.")
    return {**kwargs, "slice_len": _frames(frames), "truncated_key": None, "init_key": None}


class FrameStackSliceSampler(SliceSampler):
    """A :class:`~tdreplay.samplers.SliceSampler` of slices of ``frames`` steps whose
    ``batch_size`` is a number of slices: ``sample(storage, B)`` returns ``B * frames`` rows.

    Each slice is the window of frames of one step, not a cut of its trajectory, so the
    sampler is built with ``truncated_key=None`` and ``init_key=None``: its info marks no
    slice end as truncated or done and no slice start as a reset, and a
    :class:`~tdreplay.core.TensorDictReplayBuffer` sample keeps the stored flags (passing
    either key raises ``ValueError``).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.storages import LazyTensorStorage
    >>> storage = LazyTensorStorage(20)
    >>> storage.set(torch.arange(20), TensorDict({"episode": torch.arange(20) // 10}, [20]))
    >>> sampler = FrameStackSliceSampler(4, traj_key="episode")
    >>> index, info = sampler.sample(storage, 3)
    >>> index.shape, info, sampler.truncated_key, sampler.init_key
    (torch.Size([12]), {}, None, None)
    """

    def __init__(self, frames: int, **kwargs: Any) -> None:
        arguments = _slice_arguments("FrameStackSliceSampler", frames, kwargs)
        self.frames = arguments["slice_len"]
        super().__init__(**arguments)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        return super().sample(storage, _frames(batch_size) * self.frames)


class FrameStackSliceSamplerWithoutReplacement(SliceSamplerWithoutReplacement):
    """:class:`FrameStackSliceSampler` drawing without replacement (``replacement=False``).

    Examples
    --------
    >>> sampler = FrameStackSliceSamplerWithoutReplacement(4, traj_key="episode")
    >>> sampler.slice_len, sampler.frames
    (4, 4)
    """

    def __init__(self, frames: int, **kwargs: Any) -> None:
        arguments = _slice_arguments("FrameStackSliceSamplerWithoutReplacement", frames, kwargs)
        self.frames = arguments["slice_len"]
        super().__init__(**arguments)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
        return super().sample(storage, _frames(batch_size) * self.frames)


def make_frame_stack_sampler(frames: int, **sampler_kwargs: Any) -> SliceSampler:
    """A frame-stack slice sampler; ``replacement=False`` gives the without-replacement one.

    Examples
    --------
    >>> type(make_frame_stack_sampler(3, traj_key="ep", replacement=False)).__name__
    'FrameStackSliceSamplerWithoutReplacement'
    """
    replacement = sampler_kwargs.pop("replacement", True)
    if replacement is False:
        return FrameStackSliceSamplerWithoutReplacement(frames, **sampler_kwargs)
    return FrameStackSliceSampler(frames, replacement=replacement, **sampler_kwargs)
