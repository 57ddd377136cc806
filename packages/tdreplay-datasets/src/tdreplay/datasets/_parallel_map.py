"""Apply a function to a TensorDict chunk by chunk, in worker processes, into memmap files."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from tdreplay.core.file_room import mapped_like
from tdreplay.core.utils import check_count

# set in each worker process by _init_worker
_WORKER: dict[str, Any] = {}


def chunk_bounds(size: int, *, chunksize: int | None, num_chunks: int | None,
                 num_workers: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering ``range(size)``.

    ``chunksize`` fixes the length of every range (the last one may be shorter),
    ``num_chunks`` their number (lengths differ by one at most); by default there are four
    chunks per worker, so that a slow chunk does not keep the others idle.
    """
    if chunksize is not None:
        return [(start, min(start + chunksize, size)) for start in range(0, size, chunksize)]
    count = num_chunks if num_chunks is not None else 4 * max(num_workers, 1)
    count = max(1, min(count, size))
    base, extra = divmod(size, count)
    bounds, start = [], 0
    for i in range(count):
        stop = start + base + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def _index(dim: int, start: int, stop: int) -> tuple[slice, ...]:
    return (slice(None),) * dim + (slice(start, stop),)


def leaf_layout(td: TensorDictBase) -> dict[Any, tuple[tuple[int, ...], torch.dtype]]:
    """Entry -> (shape past the batch dims, dtype) of every leaf of ``td``."""
    return {key: (tuple(leaf.shape[td.batch_dims:]), leaf.dtype)
            for key, leaf in td.items(include_nested=True, leaves_only=True)}


def _call(fn: Callable[[TensorDictBase], TensorDictBase], chunk: TensorDictBase) -> TensorDictBase:
    """``fn(chunk)``, checked to be a non-empty TensorDict of the chunk's batch size."""
    result = fn(chunk)
    if not is_tensor_collection(result):
        raise TypeError(f"preprocess: fn must return a TensorDict, got {type(result).__name__}.")
    if result.batch_size != chunk.batch_size:
        raise ValueError(
            f"preprocess: fn must keep the batch size of the data it gets (it is applied to "
            f"chunks of samples): got batch size {tuple(result.batch_size)} for a chunk of "
            f"batch size {tuple(chunk.batch_size)}.")
    if result.is_empty():
        raise ValueError("preprocess: fn returned a TensorDict without entries.")
    return result


def apply_chunk(fn: Callable[[TensorDictBase], TensorDictBase], source: TensorDictBase,
                out: TensorDictBase, dim: int, start: int, stop: int) -> tuple[int, int]:
    """Write ``fn(source[chunk])`` to ``out[chunk]``; the chunk handed to ``fn`` is a copy.

    Raises ``TypeError``/``ValueError`` naming what ``fn`` returned when it is not a TensorDict
    of the chunk's batch size with the entries, shapes and dtypes of the first chunk's result.
    """
    index = _index(dim, start, stop)
    result = _call(fn, source[index].clone())
    target = out[index]
    expected, got = leaf_layout(target), leaf_layout(result)
    if expected != got:
        raise ValueError(
            f"preprocess: fn returned entries {sorted(map(str, got.items()))} for samples "
            f"{start}-{stop - 1}, but {sorted(map(str, expected.items()))} for the first chunk; "
            "fn must return the same entries, shapes and dtypes for every sample.")
    out[index] = result
    return start, stop


def _init_worker(fn: Callable, source: TensorDictBase, out: TensorDictBase, dim: int) -> None:
    torch.set_num_threads(1)
    _WORKER.update(fn=fn, source=source, out=out, dim=dim)


def _run_chunk(bounds: tuple[int, int]) -> tuple[int, int]:
    return apply_chunk(_WORKER["fn"], _WORKER["source"], _WORKER["out"], _WORKER["dim"], *bounds)


def parallel_map_to_memmap(
    fn: Callable[[TensorDictBase], TensorDictBase],
    source: TensorDictBase,
    prefix: Path,
    *,
    dim: int,
    num_workers: int,
    chunksize: int | None,
    num_chunks: int | None,
    mp_start_method: str | None,
    pbar: bool,
) -> TensorDictBase:
    """``fn`` applied to ``source`` along ``dim``, written as memmap files under ``prefix``.

    The first chunk runs in this process and lays out the output (one file per entry, the size
    of the whole result); the other chunks run in ``num_workers`` processes (``0``: in this
    process) that write their results straight into the files. Returns the output TensorDict.
    """
    from tqdm.auto import tqdm

    size = source.batch_size[dim]
    bounds = chunk_bounds(size, chunksize=chunksize, num_chunks=num_chunks,
                          num_workers=num_workers)
    start, stop = bounds[0]
    first = _call(fn, source[_index(dim, start, stop)].clone())
    one = first[_index(dim, 0, 1)]
    # (a full disk, a file-size limit: OSError naming the file here, not SIGBUS in a write)
    out = mapped_like(one.expand(source.batch_size), prefix, "the output of a preprocessing")
    if out.is_locked:
        out.unlock_()
    out[_index(dim, start, stop)] = first

    with tqdm(total=size, disable=not pbar, desc="preprocess", unit="sample") as bar:
        bar.update(stop - start)
        rest = bounds[1:]
        if num_workers == 0 or not rest:
            for b in rest:
                apply_chunk(fn, source, out, dim, *b)
                bar.update(b[1] - b[0])
        else:
            _run_in_workers(rest, bar, fn, source, out, dim, num_workers, mp_start_method)
    return out


def _run_in_workers(bounds: list[tuple[int, int]], bar: Any, fn: Callable, source: TensorDictBase,
                    out: TensorDictBase, dim: int, num_workers: int,
                    mp_start_method: str | None) -> None:
    """Run the chunks ``bounds`` in ``num_workers`` processes. A worker that dies (killed, out
    of memory, a crash) fails the whole call with a ``RuntimeError`` saying so: a
    ``multiprocessing.Pool`` would wait for its chunk for good."""
    ctx = multiprocessing.get_context(mp_start_method)
    with ProcessPoolExecutor(min(num_workers, len(bounds)), mp_context=ctx,
                             initializer=_init_worker,
                             initargs=(fn, source, out, dim)) as pool:
        futures = [pool.submit(_run_chunk, b) for b in bounds]
        try:
            for future in as_completed(futures):
                b_start, b_stop = future.result()
                bar.update(b_stop - b_start)
        except BrokenProcessPool as err:
            raise RuntimeError(
                "preprocess: a worker process died while applying fn (killed, out of memory, "
                "or a crash in fn); nothing was kept. Retry, or pass num_workers=0 to run fn in "
                "this process and see its error.") from err
        finally:
            for future in futures:
                future.cancel()


def resolve_num_workers(num_workers: int | None) -> int:
    """``None`` -> the number of CPUs; otherwise an int >= 0 (``0``: no worker process)."""
    workers = check_count(num_workers, "num_workers", 0)
    return (os.cpu_count() or 1) if workers is None else workers


def load_memmap(path: Path) -> TensorDict:
    """The memmap TensorDict saved under ``path``, unlocked, its files mapped copy-on-write
    (``mode="r"``): what a buffer writes into it (a restore, ``storage.set``) changes this
    process's view only, never the files other buffers and later runs read."""
    td = TensorDict.load_memmap(path, mode="r")
    if td.is_locked:
        td.unlock_()
    return td
