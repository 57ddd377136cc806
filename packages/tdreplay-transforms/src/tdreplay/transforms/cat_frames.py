"""``CatFrames``: stack the last N frames of each step's trajectory, vectorised over the batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from tdreplay.core import Compose, Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag, check_key

from ._utils import (
    gather_time,
    keys_arg,
    prefix_next,
    require_tensordict,
    strip_next,
    time_flags,
    trajectory_ends,
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

    For an entry ``("next", key)`` whose root ``key`` is also in the data, the stack holds the
    stored frames ``("next", key)[t - N + 1], ..., ("next", key)[t]`` (as TorchRL's); in a
    trajectory starting at ``t0`` the frame before ``("next", key)[t0]`` is ``key[t0]``, and
    older slots are padding (``key[t0]`` with ``"same"``). When ``("next", key)[t]`` equals
    ``key[t + 1]`` within trajectories, this is the stack the following step sees (padding
    included). Other entries, and all entries with ``future=True``, are stacked on their own.

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
    as_inverse : bool
        If ``True``, the frames are stacked on the write side (``inv``, what a buffer runs on
        ``extend``: the storage holds the stacks) and samples are left as they are; if
        ``False`` (default), on sample. As TorchRL's.
    reset_key : nested key, optional
        Accepted for TorchRL's signature. TorchRL uses it only in an environment, to reset
        the frames of some of its batch; it has no effect in a buffer (trajectory starts come
        from ``done_key``).
    done_key : nested key, optional
        Boolean entry marking the last step of each trajectory, under ``"next"`` as in
        TorchRL: ``"done"`` (the default) reads ``("next", "done")``. A key that already
        starts with ``"next"`` is read as it is.
    future : bool
        If ``True``, step ``t`` gathers the ``N`` *upcoming* frames ``t, ..., t + N - 1``
        (oldest first) instead of the last ``N``; frames past the end of the trajectory or of
        the data are padded (``"same"``: with the trajectory's last frame). Each entry is
        stacked on its own (no ``("next", key)`` offset). Without ``done_key`` in the data,
        each row is one trajectory. As TorchRL's (0.14).
    mask_key : nested key, optional
        If given, a boolean ``[*batch, T, N]`` entry is written there, ``True`` for the slots
        of each window that are padding (out of the trajectory or of the data), as TorchRL's
        (the ``action_is_pad`` convention of chunked-action datasets).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> done = torch.tensor([False, True, False, False])  # trajectories [0, 1] and [2, 3]
    >>> td = TensorDict({"obs": torch.arange(4.).unsqueeze(-1), ("next", "done"): done}, [4])
    >>> CatFrames(3, -1, in_keys=["obs"], out_keys=["stack"])(td)["stack"]
    tensor([[0., 0., 0.],
            [0., 0., 1.],
            [2., 2., 2.],
            [2., 2., 3.]])

    Upcoming frames, with the mask of the padded slots:

    >>> out = CatFrames(3, -1, in_keys=["obs"], out_keys=["chunk"], padding="constant",
    ...                 padding_value=-1.0, future=True, mask_key="is_pad")(td)
    >>> out["chunk"]
    tensor([[ 0.,  1., -1.],
            [ 1., -1., -1.],
            [ 2.,  3., -1.],
            [ 3., -1., -1.]])
    >>> out["is_pad"][0]
    tensor([False, False,  True])

    The ``("next", key)`` stack holds the stored next frames (here ``obs + 0.5``), the
    trajectory's first ``obs`` before them:

    >>> steps = td.clone().set(("next", "obs"), td["obs"] + 0.5)
    >>> CatFrames(3, -1, in_keys=["obs", ("next", "obs")], out_keys=["s", ("next", "s")]
    ...           )(steps)["next", "s"]
    tensor([[0.0000, 0.0000, 0.5000],
            [0.0000, 0.5000, 1.5000],
            [2.0000, 2.0000, 2.5000],
            [2.0000, 2.5000, 3.5000]])

    With ``as_inverse=True`` the stacks are made when data is written:

    >>> t = CatFrames(2, -1, in_keys=["obs"], out_keys=["pair"], as_inverse=True)
    >>> t.inv(td)["pair"][1], "pair" in t(td.exclude("pair")).keys()
    (tensor([0., 1.]), False)
    """

    def __init__(
        self,
        N: int,
        dim: int,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        padding: str = "same",
        padding_value: float = 0.0,
        as_inverse: bool = False,
        reset_key: NestedKey | None = None,
        done_key: NestedKey | None = None,
        future: bool = False,
        mask_key: NestedKey | None = None,
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
        self.as_inverse = check_flag(as_inverse, "CatFrames: as_inverse")
        self.future = check_flag(future, "CatFrames: future")
        self.reset_key = None if reset_key is None else check_key(reset_key, "reset_key")
        self.mask_key = None if mask_key is None else check_key(mask_key, "mask_key")
        done = check_key("done" if done_key is None else done_key, "done_key")
        self.done_key = done if strip_next(done) is not None else prefix_next(done)

    # ---- frame indices ---------------------------------------------------------------------
    def _frame_index(self, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Time index of the ``N`` frames of every step's window, clamped to its trajectory,
        and the mask of frames that are real (not padding).

        ``last`` (bool, ``[*batch, T]``) marks trajectory ends; both outputs are
        ``[*batch, T, N]``. The window of step ``t`` is ``t - N + 1, ..., t`` (``t, ...,
        t + N - 1`` with ``future``).
        """
        T = last.shape[-1]
        t = torch.arange(T, device=last.device).unsqueeze(-1)
        offsets = torch.arange(self.N, device=last.device)
        if self.future:
            wanted = (t + offsets).expand(*last.shape, self.N)
            bound = trajectory_ends(last).unsqueeze(-1)
            real = wanted <= bound
        else:
            wanted = (t + offsets + (1 - self.N)).expand(*last.shape, self.N)
            bound = trajectory_starts(last).unsqueeze(-1)
            real = wanted >= bound
        return torch.where(real, wanted, bound), real

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

    # ---- forward / inverse -------------------------------------------------------------------
    def forward(self, data: TensorDictBase) -> TensorDictBase:
        """Stack the frames of a sample (unless ``as_inverse``: the sample is returned)."""
        if self.as_inverse:
            return data
        return self.unfolding(data)

    def inv(self, data: TensorDictBase) -> TensorDictBase:
        """Stack the frames of written data when ``as_inverse`` (on a shallow copy: the
        caller's TensorDict is left as it is); else return it."""
        if not self.as_inverse:
            return data
        return self.unfolding(require_tensordict(self, data).copy())

    def _boundaries(self, data: TensorDictBase) -> torch.Tensor:
        if self.future and data.batch_dims and data.get(self.done_key, None) is None:
            return torch.zeros(data.batch_size, dtype=torch.bool, device=data.device)
        return time_flags(self, data, [self.done_key])

    def unfolding(self, data: TensorDictBase, ends: torch.Tensor | None = None
                  ) -> TensorDictBase:
        """Write the stacks of the in_keys to the out_keys of ``data`` (time is its last batch
        dimension), whatever ``as_inverse``; returns ``data``.

        ``ends`` (bool, ``data.batch_size``) marks the last step of each trajectory; by
        default it is read from ``done_key``.

        Examples
        --------
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"obs": torch.arange(4.).unsqueeze(-1)}, [4])
        >>> ends = torch.tensor([True, False, False, False])      # trajectories [0], [1..3]
        >>> CatFrames(2, -1, in_keys=["obs"]).unfolding(td, ends)["obs"].tolist()
        [[0.0, 0.0], [1.0, 1.0], [1.0, 2.0], [2.0, 3.0]]
        """
        require_tensordict(self, data)
        if ends is None or data.batch_dims == 0:
            last = self._boundaries(data)  # (no time dimension: raises ValueError)
        elif not (isinstance(ends, torch.Tensor) and ends.dtype is torch.bool
                  and ends.shape == data.batch_size):
            raise ValueError(f"CatFrames: ends must be a bool tensor of the data's batch shape "
                             f"{tuple(data.batch_size)}, got {ends!r:.80}.")
        else:
            last = ends
        batch_dims = data.batch_dims
        values = [self.read_entry(data, key) for key in self.in_keys]
        for key, value in zip(self.in_keys, values):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"CatFrames: entry {key!r} is a {type(value).__name__}, not a "
                                "tensor.")
            feat_dims = value.ndim - batch_dims
            if not -feat_dims <= self.dim < 0:
                raise ValueError(f"CatFrames: dim={self.dim} is not a feature dimension of entry "
                                 f"{key!r} of shape {tuple(value.shape)} (batch dims "
                                 f"{tuple(data.batch_size)}).")
        own_index, own_real = self._frame_index(last)
        results = [self._stack(data, key, value, own_index, own_real)
                   for key, value in zip(self.in_keys, values)]
        for key, result in zip(self.out_keys, results):
            data.set(key, result)
        if self.mask_key is not None:
            data.set(self.mask_key, ~own_real)
        return data

    def _stack(self, data: TensorDictBase, key: NestedKey, value: torch.Tensor,
               index: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        batch_dims = data.batch_dims
        root_key = strip_next(key)
        root = data.get(root_key, None) if root_key is not None and not self.future else None
        if isinstance(root, torch.Tensor) and root.shape == value.shape:
            # the stored ("next", key) frames of steps t-N+1..t (TorchRL's layout); the slot
            # just before a trajectory's first step t0 holds key[t0] (the frame that
            # ("next", key)[t0] follows), older slots are padding (key[t0] with "same")
            frames = gather_time(value, index, batch_dims)
            first = gather_time(root, index[..., :1], batch_dims)  # key[t0] where slot 0 pads
            mask = real.reshape(real.shape + (1,) * (frames.ndim - real.ndim))
            frames = torch.where(mask, frames, first)
            real = torch.cat([real[..., 1:], torch.ones_like(real[..., :1])], -1)
        else:
            frames = gather_time(value, index, batch_dims)
        return self._merge(frames, real, batch_dims)

    def make_rb_transform_and_sampler(self, batch_size: int | None = None,
                                      **sampler_kwargs: Any) -> tuple[Compose, SliceSampler]:
        """A buffer transform and sampler that stack frames on sample, so that a buffer stores
        single frames (``N`` times less memory than stacks).

        The sampler (a :class:`~tdreplay.transforms.frame_sampler.FrameStackSliceSampler`,
        built with ``sampler_kwargs``, e.g. ``traj_key=``) draws, for a batch of ``B``, ``B``
        slices of ``N`` consecutive steps; the transform stacks each slice's frames (for the
        in_keys and their ``("next", ...)`` entries) and keeps each slice's last step, so a
        sample has ``B`` rows, each with the ``N`` frames ending at it (the ``("next", ...)``
        stack: the stored next frames of those ``N`` steps, as TorchRL's). A slice is the
        window of frames of its kept step, not a cut of its trajectory, so the sampler marks
        no truncation and no reset (``truncated_key=None``, ``init_key=None``): a sample keeps
        the stored done / terminated / truncated / ``is_init`` flags of its steps, with a
        ``TensorDictReplayBuffer`` as with a ``ReplayBuffer``. Its write side drops
        the out_keys that are not in_keys, so stacks never reach the storage.
        ``batch_size`` is accepted for TorchRL's signature and unused (the buffer's batch
        size counts stacked rows). The transform stacks on sample whatever ``as_inverse``
        (as TorchRL's). With ``future=True`` each slice's *first* step is kept, whose upcoming
        frames are the slice (TorchRL keeps the last step, whose upcoming frames are all
        padding); ``mask_key`` is written per kept step (``[B, N]``). Only whole slices of
        ``N`` steps of one trajectory are drawn (the sampler refuses ``strict_length=False``
        and ``span``), so the first ``N - 1`` steps of a trajectory are never a kept step
        (TorchRL's the same): to train on the steps right after a reset, store stacks
        (``CatFrames`` on the write side, ``N`` times the memory) instead.

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
                            reset_key=self.reset_key, done_key=self.done_key,
                            future=self.future, mask_key=self.mask_key)
        transient = [key for key in out_keys if key not in set(in_keys)]
        transform = Compose(_OneStepOfWindows(stacker))
        if transient:
            transform.append(ExcludeTransform(*transient, inverse=True))
        return transform, make_frame_stack_sampler(self.N, **sampler_kwargs)

    def __repr__(self) -> str:
        future = ", future=True" if self.future else ""
        inverse = ", as_inverse=True" if self.as_inverse else ""
        return (f"CatFrames(N={self.N}, dim={self.dim}, padding={self.padding!r}{future}"
                f"{inverse}, keys={self.in_keys})")


class _OneStepOfWindows(Transform):
    """A flat sample of windows of ``N`` steps -> ``[-1, N]``, ``CatFrames``, then the step
    whose stack the window holds: the last one (the first one with ``future``)."""

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
        windows = data.reshape(-1, n)
        ends = None
        if windows.get(self.stacker.done_key, None) is None:
            # each window lies in one trajectory (the frame-stack sampler's slices): without
            # stored done flags there is no boundary to find
            ends = torch.zeros(windows.batch_size, dtype=torch.bool, device=windows.device)
        return self.stacker.unfolding(windows, ends)[:, 0 if self.stacker.future else -1]

    def __repr__(self) -> str:
        return f"OneStepOfWindows({self.stacker!r})"
