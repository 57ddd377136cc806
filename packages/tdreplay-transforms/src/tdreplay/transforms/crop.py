"""``RandomCropTensorDict``: a random sub-sequence of every sampled trajectory."""

from __future__ import annotations

import warnings

import torch
from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_key

from ._utils import require_tensordict


class RandomCropTensorDict(Transform):
    """Crops ``sub_seq_len`` consecutive steps at a random start along ``sample_dim``.

    Every row (every index of the other batch dimensions) gets its own start, drawn from the
    global torch random number generator (``torch.manual_seed`` makes it repeatable), so a
    ``[B, T]`` batch of sampled trajectories becomes ``[B, sub_seq_len]``. It runs on sample
    (its write side leaves data as it is); use it after a sampler that returns whole
    trajectories or long slices, as TorchRL's Dreamer and DDPG scripts do.

    With ``mask_key`` (a boolean entry of the batch shape whose ``True`` values come first
    along ``sample_dim``, e.g. the mask of padded trajectories), each row's crop is taken
    within its valid steps. The mask is not checked to be a prefix (as TorchRL's). When
    ``mask_key`` is given but not in the data, the crop ignores it (as TorchRL's).

    Unlike TorchRL 0.14.1, whose start is drawn in ``[0, length - sub_seq_len)`` (never the
    last possible start, and no crop at all of data exactly ``sub_seq_len`` long: it raises),
    the start is drawn in ``[0, length - sub_seq_len]``, so every sub-sequence is equally
    likely.

    Parameters
    ----------
    sub_seq_len : int
        Length of the sub-sequence kept (>= 1).
    sample_dim : int
        Batch dimension along which to crop. Defaults to ``-1`` (time). A non-negative
        dimension warns, as TorchRL's (it means another dimension for data of another
        number of batch dimensions).
    mask_key : nested key, optional
        Boolean entry of valid steps (see above). Defaults to ``None``.

    Raises
    ------
    RuntimeError
        When the data (or a row's valid steps) is shorter than ``sub_seq_len``, as TorchRL's.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.arange(20.0).reshape(2, 10)}, [2, 10])
    >>> _ = torch.manual_seed(0)
    >>> out = RandomCropTensorDict(4)(td)
    >>> out.batch_size, bool((out["obs"].diff(dim=-1) == 1).all())
    (torch.Size([2, 4]), True)
    >>> mask = torch.arange(10) < torch.tensor([[6], [4]])  # 6 and 4 valid steps
    >>> out = RandomCropTensorDict(4, mask_key="mask")(td.set("mask", mask))
    >>> bool(out["mask"].all()), out["obs"][1].tolist()
    (True, [10.0, 11.0, 12.0, 13.0])
    """

    def __init__(self, sub_seq_len: int, sample_dim: int = -1,
                 mask_key: NestedKey | None = None) -> None:
        if not isinstance(sub_seq_len, int) or isinstance(sub_seq_len, bool) or sub_seq_len < 1:
            raise ValueError(f"RandomCropTensorDict: sub_seq_len must be a positive int, got "
                             f"{sub_seq_len!r}.")
        if not isinstance(sample_dim, int) or isinstance(sample_dim, bool):
            raise TypeError(f"RandomCropTensorDict: sample_dim must be an int, got "
                            f"{sample_dim!r}.")
        if sample_dim >= 0:
            warnings.warn("RandomCropTensorDict: a non-negative sample_dim is a different "
                          "dimension for data of another number of batch dimensions; time is "
                          "the last batch dimension by convention (sample_dim=-1).",
                          stacklevel=2)
        super().__init__()
        self.sub_seq_len = sub_seq_len
        self.sample_dim = sample_dim
        self.mask_key = None if mask_key is None else check_key(mask_key, "mask_key")

    def _dim(self, data: TensorDictBase) -> int:
        if not data.batch_dims:
            raise RuntimeError("RandomCropTensorDict: cannot crop a TensorDict with an empty "
                               "batch_size.")
        if not -data.batch_dims <= self.sample_dim < data.batch_dims:
            raise ValueError(f"RandomCropTensorDict: sample_dim={self.sample_dim} is not a "
                             f"batch dimension of data of batch_size {tuple(data.batch_size)}.")
        return self.sample_dim % data.batch_dims

    def _lengths(self, data: TensorDictBase, dim: int) -> torch.Tensor | int:
        """The number of steps each row may be cropped in (keepdim along ``dim``)."""
        length = data.batch_size[dim]
        if length < self.sub_seq_len:
            raise RuntimeError(f"RandomCropTensorDict: cannot crop sub_seq_len="
                               f"{self.sub_seq_len} steps along sample_dim={self.sample_dim} "
                               f"of data of batch_size {tuple(data.batch_size)}.")
        mask = None if self.mask_key is None else data.get(self.mask_key, None)
        if mask is None:
            return length
        if not isinstance(mask, torch.Tensor) or mask.shape != data.batch_size:
            shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"RandomCropTensorDict: the mask {self.mask_key!r} must have the "
                             f"batch shape {tuple(data.batch_size)}, got {shape}.")
        lengths = mask.bool().sum(dim, keepdim=True)
        if bool((lengths < self.sub_seq_len).any()):
            raise RuntimeError(f"RandomCropTensorDict: cannot crop sub_seq_len="
                               f"{self.sub_seq_len} steps of a row with "
                               f"{int(lengths.min())} valid steps (mask {self.mask_key!r}).")
        return lengths

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        dim = self._dim(data)
        lengths = self._lengths(data, dim)
        shape = list(data.batch_size)
        shape[dim] = 1
        device = data.device
        if device is None:
            leaf = next(iter(data.values(True, True)), None)
            device = leaf.device if isinstance(leaf, torch.Tensor) else torch.device("cpu")
        if isinstance(lengths, int):
            starts = torch.randint(lengths - self.sub_seq_len + 1, shape, device=device)
        else:
            last_start = lengths.to(device) - self.sub_seq_len
            starts = (torch.rand(shape, device=device) * (last_start + 1)).long()
            starts = torch.minimum(starts, last_start)  # (a draw of u * n rounded up to n)
        view = [1] * data.batch_dims
        view[dim] = self.sub_seq_len
        index = starts + torch.arange(self.sub_seq_len, device=device).view(view)
        return data.gather(dim=dim, index=index)

    def __repr__(self) -> str:
        return (f"RandomCropTensorDict(sub_seq_len={self.sub_seq_len}, "
                f"sample_dim={self.sample_dim}, mask_key={self.mask_key!r})")
