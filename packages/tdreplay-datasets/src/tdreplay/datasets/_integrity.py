"""Checks of a converted dataset's files before they are mapped: nothing short, nothing missing.

A converted dataset is a ``TensorDict.memmap`` directory: a ``meta.json`` per (nested)
TensorDict listing its leaves (shape, dtype), one ``<key>.memmap`` file per leaf, and a
sub-directory per nested TensorDict. Mapping a leaf file that is shorter than its shape
zero-extends it on disk and reads zeros; a leaf file that is missing is skipped without a word.
:func:`check_leaf_files` refuses both (and unreadable ``meta.json`` files) with a ``ValueError``
naming the file, before anything is mapped, so a refused dataset is left on disk as it was.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

_META = "meta.json"
_LEAF_SUFFIX = ".memmap"


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; a ``ValueError`` naming the file when it is unreadable."""
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ValueError(f"{what} {str(path)!r} is missing: the dataset is incomplete; remove "
                         "it (or pass download='force') to convert it again.") from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{what} {str(path)!r} is damaged ({type(err).__name__}: {err}); remove "
                         "the dataset (or pass download='force') to convert it again.") from err
    if not isinstance(value, dict):
        raise ValueError(f"{what} {str(path)!r} is damaged: it holds a JSON "
                         f"{type(value).__name__}, not an object; remove the dataset (or pass "
                         "download='force') to convert it again.")
    return value


def _leaf_bytes(path: Path, key: str, entry: dict[str, Any]) -> int:
    """The size in bytes of the leaf ``key`` that ``entry`` (of ``path``'s meta.json) declares."""
    try:
        shape = [int(n) for n in entry["shape"]]
        dtype = getattr(torch, str(entry["dtype"]).removeprefix("torch."))
        if not isinstance(dtype, torch.dtype) or min(shape, default=0) < 0:
            raise ValueError(entry)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{str(path)!r} is damaged: its entry {key!r} declares no valid shape "
                         f"and dtype ({entry!r}); remove the dataset (or pass download='force') "
                         "to convert it again.") from err
    return math.prod(shape) * dtype.itemsize


def leaf_files(data_dir: Path) -> dict[str, int]:
    """Every leaf file of the memmap TensorDict in ``data_dir`` (path relative to it, with
    ``/``) and the size in bytes its ``meta.json`` declares for it."""
    files: dict[str, int] = {}

    def walk(directory: Path, prefix: str) -> None:
        meta_path = directory / _META
        meta = read_json(meta_path, "the dataset file")
        for key, entry in meta.items():
            if not isinstance(entry, dict):
                continue  # the TensorDict's own shape, device, class...
            if "dtype" in entry and "shape" in entry and not entry.get("is_nested", False):
                files[f"{prefix}{key}{_LEAF_SUFFIX}"] = _leaf_bytes(meta_path, key, entry)
            elif "type" in entry:
                walk(directory / key, f"{prefix}{key}/")

    walk(data_dir, "")
    return files


def check_leaf_files(data_dir: Path, recorded: Any = None) -> None:
    """Refuse a converted dataset whose leaf files are missing or not of their declared size.

    ``recorded`` is the ``files`` table the conversion wrote into the dataset's marker (leaf
    file -> size in bytes; absent in datasets converted by older versions): every file it
    lists must be listed by the ``meta.json`` files too, so a leaf dropped from them is caught.
    Reads sizes only: nothing on disk changes.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from tensordict import TensorDict
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = TensorDict({"x": torch.zeros(4, 2)}, [4]).memmap(tmp)
    ...     sizes = leaf_files(Path(tmp))
    ...     check_leaf_files(Path(tmp), sizes)
    ...     with open(Path(tmp) / "x.memmap", "r+b") as f:
    ...         _ = f.truncate(8)
    ...     try:
    ...         check_leaf_files(Path(tmp), sizes)
    ...     except ValueError as err:
    ...         print(sizes, "x.memmap" in str(err))
    {'x.memmap': 32} True
    """
    declared = leaf_files(data_dir)
    if recorded is not None and not isinstance(recorded, dict):
        raise ValueError(f"the dataset marker's table of leaf files under {str(data_dir)!r} is "
                         f"damaged (a {type(recorded).__name__}, not a table of file sizes); "
                         "remove the dataset (or pass download='force') to convert it again.")
    if isinstance(recorded, dict):
        for name, size in recorded.items():
            if declared.get(name) != size:
                raise ValueError(
                    f"the dataset file {str(data_dir / _META)!r} (or a nested meta.json) does not "
                    f"declare the leaf {name!r} of {size} bytes the conversion wrote: the dataset "
                    "is damaged; remove it (or pass download='force') to convert it again.")
        extra = sorted(set(declared) - set(recorded))
        if extra:
            raise ValueError(
                f"the dataset file {str(data_dir / _META)!r} (or a nested meta.json) declares "
                f"leaves the conversion did not write ({extra[:3]}): the dataset is damaged; "
                "remove it (or pass download='force') to convert it again.")
    for name, size in declared.items():
        path = data_dir / name
        try:
            actual = path.stat().st_size
        except FileNotFoundError:
            if size == 0:  # an empty entry needs no bytes
                continue
            raise ValueError(
                f"the dataset file {str(path)!r} is missing: the dataset is incomplete; remove "
                "it (or pass download='force') to convert it again.") from None
        if actual != size:
            raise ValueError(
                f"the dataset file {str(path)!r} holds {actual} bytes, but its entry needs "
                f"{size}: the file is {'truncated' if actual < size else 'damaged'}; remove the "
                "dataset (or pass download='force') to convert it again.")
