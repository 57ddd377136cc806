"""``CatFrames``: stack the last N frames of each step's trajectory, vectorised over the batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import Compose, Transform
from tdreplay.core.transform import NestedKey

from ._utils import (
    gather_time,
    keys_arg,
    one_key,
    prefix_next,
    require_tensordict,
    strip_next,
    time_flags,
    trajectory_starts,
)
from .keys import ExcludeTransform

if TYPE_CHECKING:
    from tdreplay.samplers import SliceSampler


class CatFrames(Transform):
    """Concatenates each step's entry with those of the ``N - 1`` previous steps of its trajectory.

    The data has time as its last batch dimension: ``[..., T]`` (a collected batch, a
    ``[B, T]`` batch of slices, or the flat ``[num_slices * T]`` batch a slice sampler returns).
    ``done_key`` marks the last step of each trajectory, so step ``t`` starts a new trajectory when
    ``t == 0`` or ``done[t - 1]``; frames are never taken across that boundary. Before a
    trajectory's first step, frames are padded with that first frame (``padding="same"``) or with
    ``padding_value`` (``padding="constant"``).

    Frames are concatenated along ``dim`` (a negative feature dimension), oldest first: with
    ``N=4, dim=-3``, ``[..., T, 3, 84, 84]`` pixels become ``[..., T, 12, 84, 84]``.

    For an entry ``("next", key)`` whose root ``key`` is also in the data, the stack is taken
    along the observations ``key[t - N + 2], ..., key[t], ("next", key)[t]``, so that it is the
    stack the following step sees (padding included); other entries are stacked on their own.

    All frames come from one gather over the whole batch (no Python loop over the batch or over
    time), so the transform is cheap enough for a buffer's sample path.

    Slices: the boundaries must be in the data the transform sees. A ``SliceSampler`` reports
    the end of each slice (``("next", "truncated")``, ``("next", "done")``) in the sample info,
    which ``TensorDictReplayBuffer`` writes into the sample *before* the buffer's transforms,
    so as a buffer transform ``CatFrames`` never stacks frames across slices.

    Parameters
    ----------
    N : int
        Number of frames stacked (>= 1).
    dim : int
        Negative dimension (counted from the last one) along which frames are concatenated.
    in_keys, out_keys : sequence of nested keys
        Entries stacked. Defaults to ``["pixels"]``; ``out_keys`` defaults to ``in_keys``.
    padding : str
        ``"same"`` (default) or ``"constant"``.
    padding_value : float
        Value used with ``padding="constant"``.
    done_key : nested key
        Boolean entry marking the last step of each trajectory. Defaults to ``("next", "done")``.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> done = torch.tensor([False, True, False, False])  # trajectories [0, 1] and [2, 3]
    >>> td = TensorDict({"obs": torch.arange(4.).unsqueeze(-1), ("next", "done"): done}, [4])
    >>> CatFrames(3, -1, in_keys=["obs"])(td)["obs"]
    tensor([[0., 0., 0.],
            [0., 0., 1.],
            [2., 2., 2.],
            [2., 2., 3.]])
    """

    def __init__(
        self,
        N: int,
        dim: int,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        padding: str = "same",
        padding_value: float = 0.0,
        done_key: NestedKey = ("next", "done"),
    ) -> None:
        if not isinstance(N, int) or isinstance(N, bool) or N < 1:
            raise ValueError(f"CatFrames: N must be a positive int, got {N!r}.")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim >= 0:
            raise ValueError(f"CatFrames: dim must be a negative int (a feature dimension counted "
                             f"from the last one), got {dim!r}.")
        if padding not in ("same", "constant"):
            raise ValueError(f"CatFrames: padding must be 'same' or 'constant', got {padding!r}.")
        in_keys = ["pixels"] if in_keys is None else in_keys
        super().__init__(keys_arg(in_keys, "in_keys"),
                         None if out_keys is None else keys_arg(out_keys, "out_keys"))
        if not self.in_keys:
            raise ValueError("CatFrames needs at least one in_key.")
        self.N = N
        self.dim = dim
        self.padding = padding
        self.padding_value = padding_value
        self.done_key = one_key(done_key, "done_key")

    # ---- frame indices ---------------------------------------------------------------------
    def _frame_index(self, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Time index of the ``N`` frames ending at every step ``t``, clamped to the trajectory
        start, and the mask of frames that are real (not padding).

        ``start`` is ``[*batch, T]``; both outputs are ``[*batch, T, N]``.
        """
        T = start.shape[-1]
        t = torch.arange(T, device=start.device).unsqueeze(-1)
        wanted = t + torch.arange(1 - self.N, 1, device=start.device)
        wanted = wanted.expand(*start.shape, self.N)
        first = start.unsqueeze(-1)
        real = wanted >= first
        return torch.where(real, wanted, first), real

    def _merge(self, frames: torch.Tensor, real: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """``[*batch, T, N, *feat]`` frames -> ``[*batch, T, *feat]``, N folded into ``dim``."""
        feat_dims = frames.ndim - batch_dims - 1
        if self.padding == "constant":
            mask = real.reshape(real.shape + (1,) * feat_dims)
            frames = torch.where(mask, frames, torch.as_tensor(self.padding_value,
                                                               dtype=frames.dtype,
                                                               device=frames.device))
        axis = frames.ndim + self.dim  # the concatenation axis, in frames' layout
        frames = frames.movedim(batch_dims, axis - 1)
        return frames.flatten(axis - 1, axis)

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        last = time_flags(self, data, [self.done_key])
        batch_dims = data.batch_dims
        values = [self._get(data, key) for key in self.in_keys]
        for key, value in zip(self.in_keys, values):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"CatFrames: entry {key!r} is a {type(value).__name__}, not a "
                                "tensor.")
            feat_dims = value.ndim - batch_dims
            if not -feat_dims <= self.dim < 0:
                raise ValueError(f"CatFrames: dim={self.dim} is not a feature dimension of entry "
                                 f"{key!r} of shape {tuple(value.shape)} (batch dims "
                                 f"{tuple(data.batch_size)}).")
        own_index, own_real = self._frame_index(trajectory_starts(last))
        results = []
        for key, value in zip(self.in_keys, values):
            root_key = strip_next(key)
            root = data.get(root_key, None) if root_key is not None else None
            if isinstance(root, torch.Tensor) and root.shape == value.shape:
                # ("next", key)[t] follows key[t]: stack key[t-N+2..t] (the last N - 1 of the N
                # frames ending at t) then ("next", key)[t]
                past = gather_time(root, own_index[..., 1:], batch_dims)
                frames = torch.cat([past, value.unsqueeze(batch_dims)], batch_dims)
                real = torch.cat([own_real[..., 1:], torch.ones_like(own_real[..., :1])], -1)
            else:
                frames = gather_time(value, own_index, batch_dims)
                real = own_real
            results.append(self._merge(frames, real, batch_dims))
        for key, result in zip(self.out_keys, results):
            data.set(key, result)
        return data

    def make_rb_transform_and_sampler(self, batch_size: int | None = None,
                                      **sampler_kwargs: Any) -> tuple[Compose, SliceSampler]:
        """A buffer transform and sampler that stack frames on sample, so that a buffer stores
        single frames (``N`` times less memory than stacks).

        The sampler (a :class:`~tdreplay.transforms.frame_sampler.FrameStackSliceSampler`,
        built with ``sampler_kwargs``, e.g. ``traj_key=``) draws, for a batch of ``B``, ``B``
        slices of ``N`` consecutive steps; the transform stacks each slice's frames (for the
        in_keys and their ``("next", ...)`` entries) and keeps each slice's last step, so a
        sample has ``B`` rows, each with the ``N`` frames ending at it. Its write side drops
        the out_keys that are not in_keys, so stacks never reach the storage.
        ``batch_size`` is accepted for TorchRL's signature and unused (the buffer's batch
        size counts stacked rows).

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import TensorDictReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> t, sampler = CatFrames(N=3, dim=-1, in_keys=["obs"], out_keys=["stack"]
        ...                        ).make_rb_transform_and_sampler(batch_size=4, traj_key="ep")
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler,
        ...                             transform=t, batch_size=4)
        >>> obs = torch.arange(20.0).unsqueeze(-1)
        >>> done = (torch.arange(20) % 10 == 9).unsqueeze(-1)
        >>> _ = rb.extend(TensorDict({"obs": obs, ("next", "obs"): obs + 1,
        ...                           "ep": torch.arange(20) // 10, ("next", "done"): done}, [20]))
        >>> s = rb.sample()
        >>> s["stack"].shape, bool((s["stack"].diff(dim=-1) == 1).all())
        (torch.Size([4, 3]), True)
        """
        from .frame_sampler import make_frame_stack_sampler

        in_keys: list[NestedKey] = [*self.in_keys, *(prefix_next(k) for k in self.in_keys)]
        out_keys: list[NestedKey] = [*self.out_keys, *(prefix_next(k) for k in self.out_keys)]
        stacker = CatFrames(self.N, self.dim, in_keys=in_keys, out_keys=out_keys,
                            padding=self.padding, padding_value=self.padding_value,
                            done_key=self.done_key)
        transient = [key for key in out_keys if key not in set(in_keys)]
        transform = Compose(_LastOfWindows(stacker))
        if transient:
            transform.append(ExcludeTransform(*transient, inverse=True))
        return transform, make_frame_stack_sampler(self.N, **sampler_kwargs)

    def __repr__(self) -> str:
        return (f"CatFrames(N={self.N}, dim={self.dim}, padding={self.padding!r}, "
                f"keys={self.in_keys})")


class _LastOfWindows(Transform):
    """A flat sample of windows of ``N`` steps -> ``[-1, N]``, ``CatFrames``, last step each."""

    def __init__(self, stacker: CatFrames) -> None:
        super().__init__()
        self.stacker = stacker

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        n = self.stacker.N
        if data.batch_dims != 1 or data.batch_size[0] % n:
            raise ValueError(f"CatFrames (buffer transform): the sample must be flat with a "
                             f"multiple of N={n} rows (slices of N steps), got batch_size="
                             f"{tuple(data.batch_size)}.")
        return self.stacker(data.reshape(-1, n))[:, -1]

    def __repr__(self) -> str:
        return f"LastOfWindows({self.stacker!r})"
