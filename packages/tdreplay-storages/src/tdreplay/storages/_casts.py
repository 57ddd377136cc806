"""The dtypes of a tensor storage's entries (pure functions): the rule for writing data of one
dtype into an entry of another (:func:`check_cast`), and a dtype read back from the name a
layout file or a checkpoint recorded for it (:func:`dtype_from_str`).

A tensor storage's entries keep the dtypes of the first data written. Data of another dtype is
cast when written, unless the cast would lose what the data says:

- refused whatever the values (``TypeError``): floating point into an integer or bool entry
  (``0.7`` would become ``0``), complex into a real entry (the imaginary part would go);
- refused for the values that do not fit (``ValueError``): a finite value beyond the range of
  a narrower floating entry (``1e300`` into float32 would become ``inf``), an integer outside
  the range of a narrower integer entry (it would wrap), an integer other than 0 and 1 into a
  bool entry;
- accepted: bool into anything, integers into floating entries (rounded to the nearest
  representable value, as ``torch`` does), floating into narrower floating entries within
  range (rounded; NaN and infinities stay), integers into integer entries within range,
  anything real into complex entries.

Only data whose dtype differs from the entry's is looked at: writes of the entry's own dtype
pay nothing.

A number (Python ``bool`` / ``int`` / ``float`` / ``complex`` or a numpy scalar) written into a
storage of tensors follows the same rule (:func:`number_tensor`): a Python ``float`` is
float64 data, an ``int`` int64 data, a numpy scalar data of its own dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._keys import entry_label

__all__ = ["check_cast", "dtype_from_str", "is_number", "number_tensor"]

_NUMBER_TYPES = (bool, int, float, complex, np.number, np.bool_)


def _limit(dtype: torch.dtype) -> float:
    """Largest finite value of ``dtype`` (``inf`` for bool)."""
    if dtype is torch.bool:
        return float("inf")
    if dtype.is_floating_point or dtype.is_complex:
        return float(torch.finfo(dtype).max)
    return float(torch.iinfo(dtype).max)


class _Number:
    """The argument a number written into the storage came as (how :func:`_refused` names it
    in place of an entry)."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value


def _refused(key: Any, src: torch.Tensor, dtype: torch.dtype, why: str) -> str:
    if isinstance(key, _Number):
        return (f"{key.name}={key.value!r} ({type(key.value).__name__}, written as {src.dtype} "
                f"data) into the storage's {dtype} data {why}; the storage refuses lossy casts: "
                f"pass a value it holds (e.g. torch.tensor({key.name}).to({dtype}) where the "
                "loss is intended).")
    return (f"{entry_label(key)}: {src.dtype} data written into the storage's {dtype} entry "
            f"{why}; "
            "the storage refuses lossy casts: convert the data first (e.g. "
            f"data.to({dtype}) where the loss is intended).")


def check_cast(key: Any, src: torch.Tensor, dtype: torch.dtype) -> None:
    """Raise unless writing ``src`` into entry ``key`` of dtype ``dtype`` keeps every value
    (the rule of the module docstring). Reads the values only where the dtypes allow a loss.

    Examples
    --------
    >>> check_cast("obs", torch.tensor([1, 2]), torch.float32)        # int into float: fine
    >>> check_cast("obs", torch.tensor([0.5], dtype=torch.float64), torch.float32)
    >>> check_cast("action", torch.tensor([0.7]), torch.int64)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: entry 'action': torch.float32 data written into the storage's torch.int64 ...
    >>> check_cast("x", torch.tensor([1e300], dtype=torch.float64), torch.float32)
    Traceback (most recent call last):
    ...
    ValueError: entry 'x': torch.float64 data written into the storage's torch.float32 entry would turn 1e+300 into inf; ...
    """  # noqa: E501
    s = src.dtype
    if s is dtype or s is torch.bool:
        return
    if s.is_complex and not dtype.is_complex:
        raise TypeError(_refused(key, src, dtype, "would lose the imaginary part"))
    if s.is_floating_point and not (dtype.is_floating_point or dtype.is_complex):
        example = "True" if dtype is torch.bool else "0"
        raise TypeError(_refused(key, src, dtype, "would lose the fractional part (0.7 would "
                                 f"be stored as {example}; floating point data is refused there "
                                 "whatever its values)"))
    if not src.numel():
        return
    if dtype is torch.bool:  # integers: 0 and 1 only
        bad = src[(src != 0) & (src != 1)]
        if bad.numel():
            raise ValueError(_refused(key, src, dtype, f"would turn {bad[0].item()} into True"))
        return
    if dtype.is_floating_point or dtype.is_complex:
        if _limit(s) <= _limit(dtype):
            return
        values = torch.view_as_real(src) if s.is_complex else src
        if values.is_floating_point():
            values = values[torch.isfinite(values)]
            over = values[values.abs() > _limit(dtype)]
        else:  # integers, compared as float64 (abs of the least int64 would wrap)
            over = values[values.double().abs() > _limit(dtype)]
        if over.numel():
            raise ValueError(_refused(key, src, dtype, f"would turn {over[0].item()} into inf"))
        return
    info = torch.iinfo(dtype)  # integers into a narrower integer entry
    lo, hi = torch.iinfo(s).min, torch.iinfo(s).max
    if lo >= info.min and hi <= info.max:
        return
    bad = src[(src < info.min) | (src > info.max)]
    if bad.numel():
        raise ValueError(_refused(key, src, dtype, f"would wrap {bad[0].item()} around (the "
                                  f"{dtype} holds [{info.min}, {info.max}])"))


def is_number(value: Any) -> bool:
    """Whether ``value`` is a number a storage of tensors takes (:func:`number_tensor`): a
    Python ``bool`` / ``int`` / ``float`` / ``complex`` or a numpy scalar.

    Examples
    --------
    >>> is_number(3.0), is_number(np.int8(2)), is_number(torch.tensor(3.0)), is_number("3")
    (True, True, False, False)
    """
    return isinstance(value, _NUMBER_TYPES)


def number_tensor(name: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
    """``value`` (a number: :func:`is_number`) as a 0-dim tensor of ``dtype``, refused as
    :func:`check_cast` refuses a tensor of its dtype (``TypeError`` / ``ValueError`` naming
    argument ``name``) when the cast would lose what it says: ``2.5`` (float64 data) into an
    int64 storage, ``1e300`` into a float32 one, ``300`` into an int8 one.

    Examples
    --------
    >>> number_tensor("value", 3, torch.float32)
    tensor(3.)
    >>> number_tensor("value", np.float32(0.5), torch.float16)
    tensor(0.5000, dtype=torch.float16)
    >>> number_tensor("value", 3.0, torch.int64)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: value=3.0 (float, written as torch.float64 data) into the storage's torch.int64 ...
    """
    if isinstance(value, np.generic):
        try:
            src = torch.from_numpy(np.asarray(value))
        except TypeError:  # (float128, ...: no torch dtype)
            raise TypeError(f"{name}={value!r}: numpy {value.dtype} data has no torch dtype; "
                            f"the storage holds {dtype} data.") from None
    elif isinstance(value, bool):
        src = torch.tensor(value)
    elif isinstance(value, int) and not -(2**63) <= value < 2**63:
        if not (dtype.is_floating_point or dtype.is_complex):  # (an int64 tensor cannot hold it)
            held = "0 and 1" if dtype is torch.bool else \
                f"[{torch.iinfo(dtype).min}, {torch.iinfo(dtype).max}]"
            raise ValueError(f"{name}={value!r} (int) does not fit the storage's {dtype} data "
                             f"(it holds {held}).")
        src = torch.tensor(float(value), dtype=torch.float64)  # (rounded, as ints are)
    else:
        src = torch.tensor(value, dtype=torch.float64 if isinstance(value, float)
                           else torch.complex128 if isinstance(value, complex) else torch.int64)
    check_cast(_Number(name, value), src, dtype)
    return src.to(dtype)


def dtype_from_str(name: str) -> torch.dtype:
    """The torch dtype ``str(dtype)`` wrote (``"torch.float32"`` or ``"float32"``).

    Raises ``ValueError`` for a name that is not a torch dtype.

    Examples
    --------
    >>> dtype_from_str("torch.int64"), dtype_from_str("float32")
    (torch.int64, torch.float32)
    """
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}.")
    return dtype
