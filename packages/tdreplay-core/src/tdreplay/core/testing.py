"""Checks for the tests of components built on tdreplay: that a refused or failed call left a
buffer exactly as it was, and a step that fails on demand.

A component (a storage, sampler, writer or transform of a sibling package, or your own) keeps
the project's promise when a call that raises changes nothing: the same length, write count,
writer, sampler and storage state. :func:`buffer_snapshot` takes that state (copies, which
later writes cannot change), :func:`assert_same` compares two such snapshots (or any nested
dicts, lists, tuples, tensors, numpy arrays and TensorDicts, dtypes and shapes included) and
names the first entry that differs, :class:`FailOnce` is a transform (or ``collate_fn``)
that refuses one chosen call, and :func:`restored` copies a buffer each way a buffer is
restored or copied (``state_dict``, ``dumps``, pickle, deepcopy), for tests that compare the
copy with the original going on. :class:`StackedListStorage` is a list storage that reads as a
tensor storage, for tests of core's trajectory features without ``tdreplay-storages``.
:func:`id_rows` makes rows whose every entry follows from the row's id, and
:func:`read_id_rows` reads them back and checks that no row mixes entries of two writes (what
a write killed or interrupted half-way must not leave). :func:`in_forked_child` runs a check
in a forked child process and hands back what it returned (or what it raised).
:class:`InterruptOnce` raises ``KeyboardInterrupt`` at one step of a call (as Ctrl-C landing
there), and :class:`TellingSampler` records the slots a buffer told it of, for tests that a
write cut short leaves every row counted sampleable.

Examples
--------
>>> import pytest, torch
>>> from tdreplay.core import ListStorage, ReplayBuffer
>>> rb = ReplayBuffer(storage=ListStorage(4))
>>> _ = rb.extend([1, 2, 3])
>>> before = buffer_snapshot(rb)
>>> with pytest.raises(ValueError):
...     rb.load_state_dict({**rb.state_dict(), "_writer": {"cursor": 9, "write_count": 3}})
>>> assert_same(buffer_snapshot(rb), before)
"""

from __future__ import annotations

import contextlib
import copy
import errno
import multiprocessing
import os
import pickle
import shutil
import subprocess
import tempfile
import traceback
import unittest
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import is_tensor_collection

from .sampler import RandomSampler
from .storage import ListStorage

__all__ = ["BOOLS", "NOT_BOOLS", "NOT_BOOLS_OR_NONE", "RESTORES", "FailOnce",
           "InterruptOnce", "StackedListStorage", "TellingSampler", "assert_flag_refused",
           "assert_flag_taken", "assert_same", "buffer_snapshot", "fill_disk", "id_rows",
           "in_forked_child", "read_id_rows", "restored", "small_tmpfs"]

#: the ways :func:`restored` copies a buffer
RESTORES = ("state_dict", "dumps", "pickle", "deepcopy")


class StackedListStorage(ListStorage):
    """A :class:`~tdreplay.core.ListStorage` of TensorDicts that answers as a tensor storage
    does: a ``shape`` of its length, and several items read as one stacked TensorDict. Core's
    trajectory features (HER, sample units, slices of steps) read a storage that way; this lets
    their tests run on core alone.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> storage = StackedListStorage(4)
    >>> storage.set(range(3), [TensorDict({"x": torch.tensor(i)}, []) for i in range(3)])
    >>> storage.shape, storage[0:2]["x"].tolist()
    (torch.Size([3]), [0, 1])
    """

    @property
    def shape(self) -> torch.Size:
        return torch.Size([len(self)])

    def __getitem__(self, index: Any) -> Any:
        items = super().__getitem__(index)
        return torch.stack(items) if isinstance(items, list) else items


def _frozen(value: Any) -> Any:
    """A deep copy of ``value`` that later writes to the buffer cannot change."""
    if isinstance(value, torch.Tensor) or is_tensor_collection(value):
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {key: _frozen(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_frozen(item) for item in value]
        if hasattr(value, "_fields"):  # a named tuple: built from its fields
            return type(value)(*items)
        return type(value)(items)
    return value


def restored(rb: Any, make: Callable[[], Any], how: str, keep: list[Any] | None = None) -> Any:
    """A copy of the buffer ``rb`` made as ``how`` says (one of :data:`RESTORES`):
    ``"state_dict"`` and ``"dumps"`` restore ``rb``'s state into a new buffer from ``make()``
    (``dumps`` through a temporary directory); ``"pickle"`` and ``"deepcopy"`` copy ``rb``.

    ``keep``: a list ``rb`` is appended to when it is copied, to keep it alive (a copy of a
    memory-mapped storage maps the original's files, which the original removes when it is
    collected).

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(4))
    >>> _ = rb.extend([1, 2, 3])
    >>> [restored(rb, lambda: ReplayBuffer(storage=ListStorage(4)), how)[:]
    ...  for how in RESTORES]
    [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]]
    """
    if how == "state_dict":
        new = make()
        new.load_state_dict(rb.state_dict())
        return new
    if how == "dumps":
        with tempfile.TemporaryDirectory() as path:
            rb.dumps(path)
            new = make()
            new.loads(path)
        return new
    if how not in RESTORES:
        raise ValueError(f"how must be one of {RESTORES}, got {how!r}.")
    if keep is not None:
        keep.append(rb)
    return pickle.loads(pickle.dumps(rb)) if how == "pickle" else copy.deepcopy(rb)


def buffer_snapshot(rb: Any) -> dict[str, Any]:
    """What a call that raises must leave unchanged in the buffer ``rb``: its length, write
    count, and the writer's, sampler's and storage's ``state_dict`` (copies).

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(4))
    >>> _ = rb.extend([1, 2])
    >>> snapshot = buffer_snapshot(rb)
    >>> snapshot["len"], snapshot["writer"]
    (2, {'cursor': 2, 'write_count': 2})
    """
    state = {"len": len(rb), "write_count": rb.write_count, "writer": rb.writer.state_dict(),
             "sampler": rb.sampler.state_dict(), "storage": rb.storage.state_dict()}
    return {name: _frozen(value) for name, value in state.items()}


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Raise ``AssertionError`` naming the first entry (``where`` and the keys and positions
    leading to it) where ``a`` and ``b`` differ: dicts by their keys, lists and tuples item by
    item (of the same type and length), tensors and numpy arrays by type, dtype, shape and
    values (NaN equal to NaN), TensorDicts by batch size, keys and leaves, anything else by
    ``==``.

    Examples
    --------
    >>> assert_same({"a": [torch.ones(2)]}, {"a": [torch.ones(2)]})
    >>> nan, big = torch.tensor([float("nan"), 1.0]), torch.finfo(torch.float32).max
    >>> assert_same(nan, nan.clone())
    >>> assert_same(torch.tensor([float("inf")]), torch.tensor([big]))
    Traceback (most recent call last):
    ...
    AssertionError: state: tensor([inf]) vs tensor([3.4028e+38])
    >>> assert_same({"a": [torch.ones(2)]}, {"a": [torch.ones(2, dtype=torch.float64)]})
    Traceback (most recent call last):
    ...
    AssertionError: state['a'][0]: torch.float32 of shape (2,) vs torch.float64 of shape (2,)
    """
    if isinstance(a, (torch.Tensor, np.ndarray)):
        _require(type(a) is type(b), f"{where}: a {type(a).__name__} vs a {type(b).__name__}")
        _require(a.dtype == b.dtype and a.shape == b.shape,
                 f"{where}: {a.dtype} of shape {tuple(a.shape)} vs {b.dtype} of shape "
                 f"{tuple(b.shape)}")
        if isinstance(a, torch.Tensor):
            nan = a.isnan() if a.is_floating_point() or a.is_complex() else None
            equal = (torch.equal(a, b) if nan is None else torch.equal(nan, b.isnan())
                     and torch.equal(a.masked_fill(nan, 0), b.masked_fill(nan, 0)))
        else:
            equal = np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        _require(equal, f"{where}: {a} vs {b}")
    elif is_tensor_collection(a):
        _require(is_tensor_collection(b), f"{where}: a {type(a).__name__} vs a {type(b).__name__}")
        _require(a.batch_size == b.batch_size,
                 f"{where}: batch size {a.batch_size} vs {b.batch_size}")
        keys = sorted(a.keys(True, True), key=str)
        _require(keys == sorted(b.keys(True, True), key=str), f"{where}: keys differ")
        for key in keys:
            assert_same(a.get(key), b.get(key), f"{where}[{key!r}]")
    elif isinstance(a, dict):
        _require(isinstance(b, dict), f"{where}: a dict vs a {type(b).__name__}")
        _require(sorted(a, key=str) == sorted(b, key=str),
                 f"{where}: keys {sorted(a, key=str)} vs {sorted(b, key=str)}")
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        _require(type(a) is type(b) and len(a) == len(b),
                 f"{where}: a {type(a).__name__} of {len(a)} vs {b!r}")
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        _require(a == b, f"{where}: {a!r} vs {b!r}")


def _require(condition: bool, message: str) -> None:
    """``AssertionError(message)`` unless ``condition`` (an ``assert`` statement would vanish
    under ``python -O``)."""
    if not condition:
        raise AssertionError(message)


class FailOnce:
    """A transform (or ``collate_fn``) that returns what it gets, except at its call numbered
    ``at`` (from 0), which raises ``error``.

    Examples
    --------
    >>> step = FailOnce(at=1)
    >>> step(5)
    5
    >>> step(6)
    Traceback (most recent call last):
    ...
    RuntimeError: FailOnce refused call 1
    >>> step(7), step.calls
    (7, 3)
    """

    def __init__(self, at: int = 0, error: type[Exception] = RuntimeError) -> None:
        self.at, self.error, self.calls = at, error, 0

    def __call__(self, data: Any) -> Any:
        self.calls += 1
        if self.calls - 1 == self.at:
            raise self.error(f"FailOnce refused call {self.at}")
        return data


class InterruptOnce:
    """``fn`` whose first call raises ``KeyboardInterrupt``, as an interrupt (Ctrl-C, or what a
    signal handler raises) landing at that step: before ``fn`` runs, once it ran
    (``after=True``), or once ``instead`` ran in its place with the same arguments (e.g. a
    write of other values: a write cut short half-way). Later calls run ``fn``; ``fired``
    says whether the interrupt was raised. Monkeypatch a method of a buffer's storage,
    sampler or writer with it.

    Examples
    --------
    >>> seen = []
    >>> step = InterruptOnce(seen.append, after=True)
    >>> try:
    ...     step(1)
    ... except KeyboardInterrupt:
    ...     print("interrupted")
    interrupted
    >>> step(2), seen, step.fired
    (None, [1, 2], True)
    """

    def __init__(self, fn: Callable[..., Any], after: bool = False,
                 instead: Callable[..., Any] | None = None) -> None:
        self.fn, self.after, self.instead, self.fired = fn, after, instead, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fired:
            return self.fn(*args, **kwargs)
        self.fired = True
        if self.instead is not None:
            self.instead(*args, **kwargs)
        elif self.after:
            self.fn(*args, **kwargs)
        raise KeyboardInterrupt


class TellingSampler(RandomSampler):
    """A uniform sampler that records in ``told`` the slots the buffer told it of (written
    rows), and saves them in its state: after a write, ``told`` holds every row counted.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(4), sampler=TellingSampler())
    >>> _ = rb.extend([1, 2, 3]); _ = rb.add(4)
    >>> sorted(rb.sampler.told), rb.sampler.state_dict()
    ([0, 1, 2, 3], {'told': [0, 1, 2, 3]})
    """

    def __init__(self) -> None:
        super().__init__()
        self.told: set[int] = set()

    def extend(self, index: torch.Tensor) -> None:
        self.told.update(torch.as_tensor(index).reshape(-1).tolist())

    def add(self, index: int) -> None:
        self.told.add(int(index))

    def state_dict(self) -> dict[str, Any]:
        return {"told": sorted(self.told)}


def id_rows(ids: Any) -> Any:
    """A TensorDict of ``len(ids)`` rows whose every entry follows from the row's id (int64
    ``id``; float64 ``a`` of 3 values, each the id; float32 ``b`` = -id; int64
    ``("next", "z")`` = 10 * id): :func:`read_id_rows` finds a row holding entries of two
    writes.

    Examples
    --------
    >>> td = id_rows([4, 7])
    >>> td["a"][1].tolist(), td["b"].tolist(), td["next", "z"].tolist()
    ([7.0, 7.0, 7.0], [-4.0, -7.0], [40, 70])
    """
    from tensordict import TensorDict

    ids = torch.as_tensor(ids)
    n = len(ids)
    return TensorDict({"id": ids, "a": ids.double().unsqueeze(-1).expand(n, 3).clone(),
                       "b": (-ids).float(), ("next", "z"): ids * 10}, [n])


def read_id_rows(storage: Any) -> list[int]:
    """The ids of the rows of ``storage`` (anything ``[:]`` reads as rows of
    :func:`id_rows`; an empty one has none); ``AssertionError`` naming the ids of the rows
    whose entries do not all follow from their id (entries of different writes).

    Examples
    --------
    >>> td = id_rows([1, 2, 3])
    >>> read_id_rows(td)
    [1, 2, 3]
    >>> td["b"][1] = 5.0  # row 2 half-written
    >>> read_id_rows(td)
    Traceback (most recent call last):
    ...
    AssertionError: rows mixing entries of different writes: [2]
    """
    if not len(storage):
        return []
    td = storage[:]
    ids = td["id"]
    whole = ((td["a"] == ids.double().unsqueeze(-1)).all(-1) & (td["b"] == (-ids).float())
             & (td["next", "z"] == ids * 10))
    _require(bool(whole.all()),
             f"rows mixing entries of different writes: {ids[~whole].tolist()}")
    return [int(i) for i in ids.tolist()]


#: what a boolean argument takes (:func:`tdreplay.core.utils.check_flag`)
BOOLS = (True, False, np.bool_(True), np.bool_(False))
#: what a boolean argument refuses: ``"False"`` is a true string, the numbers and tensors are
#: not bools
NOT_BOOLS = ("yes", "False", 1, 0, None, torch.tensor(True))
#: what a boolean argument where ``None`` means the default refuses
NOT_BOOLS_OR_NONE = ("yes", "False", 1, 0, torch.tensor(False))


def assert_flag_refused(build: Callable[..., Any], name: str, value: Any,
                        prefix: str = "") -> None:
    """``build(**{name: value})`` raises the ``TypeError`` of a boolean argument given
    ``value`` (``"<prefix><name> must be a bool..."``); ``AssertionError`` otherwise.

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> assert_flag_refused(ListStorage, "compilable", "yes")
    """
    try:
        build(**{name: value})
    except TypeError as err:
        _require(str(err).startswith(f"{prefix}{name} must be a bool"),
                 f"{name}={value!r}: TypeError of another argument: {err}")
        return
    raise AssertionError(f"{name}={value!r} was taken: a boolean argument must refuse it")


def assert_flag_taken(build: Callable[..., Any], name: str, value: Any,
                      read: Callable[[Any], Any] | None = None) -> None:
    """``build(**{name: value})`` takes ``value`` (one of :data:`BOOLS`) and, with ``read``,
    holds it as a Python bool; ``AssertionError`` otherwise.

    Examples
    --------
    >>> from tdreplay.core import ListStorage
    >>> assert_flag_taken(ListStorage, "compilable", np.bool_(True), lambda s: s.compilable)
    """
    built = build(**{name: value})
    if read is not None:
        got = read(built)
        _require(type(got) is bool and got == bool(value),
                 f"{name}={value!r} is held as {got!r}, not the bool {bool(value)}")


class ForkedChildError(AssertionError):
    """What :func:`in_forked_child` raises when the child raised or did not finish."""


def _run_and_send(fn: Callable[[], Any], conn: Any) -> None:
    """The forked child's work for :func:`in_forked_child`."""
    try:
        outcome: tuple[Any, ...] = ("ok", fn())
    except BaseException as exc:  # everything goes back to the parent
        outcome = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    conn.send(outcome)
    conn.close()


@contextlib.contextmanager
def small_tmpfs(path: Path, size: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` bytes at ``path`` (created) for a test of a full disk, and
    unmount it after; raises ``unittest.SkipTest`` (a skip for pytest too) where it cannot be
    mounted (mounting needs root and mount(8)).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> try:
    ...     with small_tmpfs(Path(tempfile.mkdtemp()) / "disk", 1 << 20) as disk:
    ...         print(disk.is_dir())
    ... except unittest.SkipTest:  # (where it cannot be mounted)
    ...     print(True)
    True
    """
    path.mkdir(parents=True, exist_ok=True)
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        raise unittest.SkipTest("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise unittest.SkipTest(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(disk: Path) -> Path:
    """Fill the file system of ``disk`` with one file (returned), to the last byte."""
    fd, name = tempfile.mkstemp(prefix="filler-", dir=disk)
    os.close(fd)
    filler = Path(name)
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
    return filler


def in_forked_child(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Fork (a ``multiprocessing`` process with the ``fork`` start method), call ``fn()`` in
    the child, and return what it returned (picklable). :class:`ForkedChildError` (an
    ``AssertionError``) with the child's traceback when it raised, or when it did not finish
    within ``timeout`` seconds (it is killed: a hang fails the test instead of stalling it).
    POSIX only.

    Examples
    --------
    >>> from tdreplay.core import ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=ListStorage(4))
    >>> _ = rb.extend([1, 2, 3])
    >>> import os
    >>> parent = os.getpid()
    >>> in_forked_child(lambda: (len(rb), os.getpid() != parent))
    (3, True)
    """
    context = multiprocessing.get_context("fork")
    receiving, sending = context.Pipe(duplex=False)
    child = context.Process(target=_run_and_send, args=(fn, sending), daemon=True)
    child.start()
    sending.close()
    try:
        if not receiving.poll(timeout):
            child.kill()
            raise ForkedChildError(f"the forked child did not finish within {timeout} s")
        try:
            outcome = receiving.recv()
        except EOFError:
            raise ForkedChildError("the forked child exited without a result") from None
    finally:
        receiving.close()
        child.join()
    if outcome[0] == "error":
        raise ForkedChildError(f"the forked child raised {outcome[1]}\n{outcome[2]}")
    return outcome[1]
