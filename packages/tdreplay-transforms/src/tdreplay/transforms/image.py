"""Image transforms on plain torch (no torchvision): ``ToTensorImage``, ``Resize``,
``GrayScale``, ``CenterCrop``.

Images have any number of leading (batch, time) dimensions: ``ToTensorImage`` takes
channels-last ``[..., H, W, C]`` images, the others channels-first ``[..., C, H, W]`` ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag

from ._utils import keys_arg, require_tensordict

_MAX_CHANNELS = 4  # gray, gray + alpha, RGB, RGBA
_MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")


def _image_size(w: Any, h: Any, owner: str) -> tuple[int, int]:
    """``(w, h)`` with ``h`` defaulting to ``w``; both must be positive ints."""
    h = w if h is None else h
    for name, value in (("w", w), ("h", h)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}.")
    return w, h


class _ImageTransform(Transform):
    """Reads images at ``in_keys`` (``["pixels"]`` by default) and writes the result at
    ``out_keys``; subclasses implement :meth:`_image`."""

    def __init__(self, in_keys: Sequence[NestedKey] | NestedKey | None,
                 out_keys: Sequence[NestedKey] | NestedKey | None) -> None:
        in_keys = ["pixels"] if in_keys is None else in_keys
        super().__init__(keys_arg(in_keys, "in_keys"),
                         None if out_keys is None else keys_arg(out_keys, "out_keys"))
        if not self.in_keys:
            raise ValueError(f"{type(self).__name__} needs at least one in_key.")

    def _image(self, key: Any, image: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        images = [self.read_entry(data, key) for key in self.in_keys]  # read all before writing
        results = [self._image(key, image) for key, image in zip(self.in_keys, images)]
        for key, result in zip(self.out_keys, results):
            data.set(key, result)
        return data

    def _check(self, key: Any, image: Any, layout: str = "[..., C, H, W]") -> torch.Tensor:
        if not isinstance(image, torch.Tensor):
            raise TypeError(f"{type(self).__name__}: entry {key!r} is a {type(image).__name__}, "
                            f"not an image tensor {layout}.")
        if image.ndim < 3:
            raise ValueError(f"{type(self).__name__}: entry {key!r} of shape {tuple(image.shape)} "
                             f"is not an image: expected {layout} (at least 3 dimensions).")
        if image.dtype is torch.bool or image.is_complex():
            raise TypeError(f"{type(self).__name__}: entry {key!r} has dtype {image.dtype}; "
                            "images hold real numbers.")
        return image

    def _check_channels_first(self, key: Any, image: torch.Tensor) -> torch.Tensor:
        self._check(key, image)
        if image.shape[-3] > _MAX_CHANNELS and image.shape[-1] <= _MAX_CHANNELS:
            raise ValueError(
                f"{type(self).__name__}: entry {key!r} of shape {tuple(image.shape)} looks like a "
                "channels-last [..., H, W, C] image; this transform expects [..., C, H, W] "
                "(apply ToTensorImage first)."
            )
        return image


def _as_float(image: torch.Tensor) -> torch.Tensor:
    return image if image.is_floating_point() else image.to(torch.get_default_dtype())


def _back_to(result: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast a float result back to an integer image dtype (rounded, clamped to its range)."""
    if dtype.is_floating_point:
        return result.to(dtype)
    info = torch.iinfo(dtype)
    return result.round_().clamp_(info.min, info.max).to(dtype)


class ToTensorImage(_ImageTransform):
    """Turns ``[..., H, W, C]`` images (e.g. uint8) into float ``[..., C, H, W]`` in ``[0, 1]``.

    Parameters
    ----------
    from_int : bool, optional
        Divide by 255. Defaults to ``None``: divide when the input is not floating point.
    unsqueeze : bool
        Add a leading dimension to a single image (``[H, W, C]`` -> ``[1, C, H, W]``), as
        TorchRL's: a batch of images (more than 3 dims) keeps its shape.
    dtype : torch.dtype, optional
        Output dtype, a floating dtype. Defaults to ``torch.get_default_dtype()``.
    in_keys, out_keys : sequence of nested keys
        Defaults to ``["pixels"]``.
    shape_tolerant : bool
        When the last dimension cannot be channels (more than 4), leave the layout as it is
        instead of raising (values are still scaled and cast).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"pixels": torch.full((2, 5, 8, 6, 3), 255, dtype=torch.uint8)}, [2, 5])
    >>> out = ToTensorImage()(td)["pixels"]
    >>> out.shape, out.dtype, out.max().item()
    (torch.Size([2, 5, 3, 8, 6]), torch.float32, 1.0)
    """

    def __init__(
        self,
        from_int: bool | None = None,
        unsqueeze: bool = False,
        dtype: torch.dtype | None = None,
        *,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        shape_tolerant: bool = False,
    ) -> None:
        from_int = check_flag(from_int, "ToTensorImage: from_int", allow_none=True)
        unsqueeze = check_flag(unsqueeze, "ToTensorImage: unsqueeze")
        shape_tolerant = check_flag(shape_tolerant, "ToTensorImage: shape_tolerant")
        super().__init__(in_keys, out_keys)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"ToTensorImage: dtype must be a floating torch.dtype, got {dtype!r}.")
        self.from_int = from_int
        self.unsqueeze = unsqueeze
        self.dtype = dtype
        self.shape_tolerant = shape_tolerant

    def _image(self, key: Any, image: torch.Tensor) -> torch.Tensor:
        self._check(key, image, "[..., H, W, C]")
        channels_last = image.shape[-1] <= _MAX_CHANNELS
        if not channels_last and not self.shape_tolerant:
            raise ValueError(
                f"ToTensorImage: entry {key!r} of shape {tuple(image.shape)} is not a "
                f"channels-last [..., H, W, C] image (C must be at most {_MAX_CHANNELS}, got "
                f"{image.shape[-1]}); pass shape_tolerant=True to keep its layout."
            )
        from_int = (not image.is_floating_point()) if self.from_int is None else self.from_int
        single = image.ndim == 3  # (what unsqueeze applies to, as TorchRL's)
        if channels_last:
            image = image.movedim(-1, -3)
        out = image.to(dtype=self.dtype, memory_format=torch.contiguous_format)
        if from_int:
            # in place only on a fresh copy, never on the caller's tensor
            out = out.div(255) if out is image else out.div_(255)
        if self.unsqueeze and single:
            out = out.unsqueeze(-4)
        return out


class Resize(_ImageTransform):
    """Resizes ``[..., C, H, W]`` images to ``[..., C, h, w]`` with
    :func:`torch.nn.functional.interpolate`.

    Parameters
    ----------
    w : int
        Output width.
    h : int, optional
        Output height; defaults to ``w``.
    interpolation : str
        ``"bilinear"`` (default), ``"bicubic"``, ``"nearest"``, ``"nearest-exact"`` or
        ``"area"`` (a torchvision ``InterpolationMode`` works too). Bilinear and bicubic use
        ``antialias=True``, as torchvision's tensor resize does.
    in_keys, out_keys : sequence of nested keys
        Defaults to ``["pixels"]``.

    Integer images are resized in floating point, then rounded and cast back. The output is
    ``[..., h, w]`` (TorchRL's ``Resize`` hands ``[w, h]`` to torchvision as ``(height, width)``;
    the two agree for square outputs).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"pixels": torch.rand(2, 5, 3, 64, 48)}, [2, 5])
    >>> Resize(32, 16)(td)["pixels"].shape
    torch.Size([2, 5, 3, 16, 32])
    """

    def __init__(
        self,
        w: int,
        h: int | None = None,
        interpolation: Any = "bilinear",
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__(in_keys, out_keys)
        w, h = _image_size(w, h, "Resize")
        mode = getattr(interpolation, "value", interpolation)
        if not isinstance(mode, str) or mode.lower() not in _MODES:
            raise ValueError(f"Resize: interpolation must be one of {_MODES}, got "
                             f"{interpolation!r}.")
        self.w = w
        self.h = h
        self.interpolation = mode.lower()

    def _image(self, key: Any, image: torch.Tensor) -> torch.Tensor:
        self._check_channels_first(key, image)
        *lead, c, height, width = image.shape
        flat = _as_float(image).reshape(-1, c, height, width)
        smooth = self.interpolation in ("bilinear", "bicubic")
        out = F.interpolate(flat, size=(self.h, self.w), mode=self.interpolation,
                            align_corners=False if smooth else None, antialias=smooth)
        return _back_to(out, image.dtype).reshape(*lead, c, self.h, self.w)

    def __repr__(self) -> str:
        return (f"Resize(w={self.w}, h={self.h}, interpolation={self.interpolation}, "
                f"keys={self.in_keys})")


class GrayScale(_ImageTransform):
    """Turns RGB ``[..., 3, H, W]`` images into grayscale ``[..., 1, H, W]``.

    Uses the ITU-R 601-2 luma weights (0.2989, 0.587, 0.114), as torchvision. Single-channel
    images pass through; integer images are truncated back to their dtype (as torchvision).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"pixels": torch.ones(4, 3, 8, 8)}, [4])
    >>> out = GrayScale()(td)["pixels"]
    >>> out.shape, round(out[0, 0, 0, 0].item(), 4)
    (torch.Size([4, 1, 8, 8]), 0.9999)
    """

    def __init__(self, in_keys: Sequence[NestedKey] | NestedKey | None = None,
                 out_keys: Sequence[NestedKey] | NestedKey | None = None) -> None:
        super().__init__(in_keys, out_keys)

    def _image(self, key: Any, image: torch.Tensor) -> torch.Tensor:
        self._check(key, image)
        channels = image.shape[-3]
        if channels == 1:
            return image
        if channels != 3:
            raise ValueError(f"GrayScale: entry {key!r} of shape {tuple(image.shape)} is not an "
                             f"RGB [..., 3, H, W] image (got {channels} channels at dim -3).")
        r, g, b = _as_float(image).unbind(-3)
        gray = (0.2989 * r).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3)
        return gray.to(image.dtype)


class CenterCrop(_ImageTransform):
    """Crops the center ``h x w`` region of ``[..., C, H, W]`` images.

    Parameters
    ----------
    w : int
        Output width.
    h : int, optional
        Output height; defaults to ``w``.
    in_keys, out_keys : sequence of nested keys
        Defaults to ``["pixels"]``.

    As torchvision's ``center_crop``: the crop starts at ``round((H - h) / 2)`` and
    ``round((W - w) / 2)``, and an image smaller than the crop is first padded with zeros.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> image = torch.arange(16.).reshape(1, 1, 4, 4)
    >>> CenterCrop(2)(TensorDict({"pixels": image}, [1]))["pixels"][0, 0]
    tensor([[ 5.,  6.],
            [ 9., 10.]])
    """

    def __init__(
        self,
        w: int,
        h: int | None = None,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__(in_keys, out_keys)
        w, h = _image_size(w, h, "CenterCrop")
        self.w = w
        self.h = h

    def _image(self, key: Any, image: torch.Tensor) -> torch.Tensor:
        self._check_channels_first(key, image)
        height, width = image.shape[-2:]
        if height < self.h or width < self.w:
            pad_h = max(self.h - height, 0)
            pad_w = max(self.w - width, 0)
            image = F.pad(image, [pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2])
            height, width = image.shape[-2:]
        top = int(round((height - self.h) / 2.0))
        left = int(round((width - self.w) / 2.0))
        return image[..., top: top + self.h, left: left + self.w]

    def __repr__(self) -> str:
        return f"CenterCrop(w={self.w}, h={self.h}, keys={self.in_keys})"
