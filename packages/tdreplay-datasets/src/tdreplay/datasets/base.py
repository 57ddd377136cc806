"""``BaseDatasetExperienceReplay``: a read-only replay buffer over a dataset kept on disk."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection

from tdreplay.core import Sampler, TensorDictReplayBuffer, Transform, Writer
from tdreplay.core.utils import check_count, check_flag
from tdreplay.storages import TensorStorage
from tdreplay.writers import ImmutableDatasetWriter

from ._files import (
    FileVersion,
    changed_files,
    check_empty_destination,
    file_versions,
    publish,
    remove_dir,
    staging_dir,
)
from ._parallel_map import load_memmap, parallel_map_to_memmap, resolve_num_workers


class BaseDatasetExperienceReplay(TensorDictReplayBuffer):
    """A read-only :class:`~tdreplay.core.TensorDictReplayBuffer` over a dataset on disk.

    The dataset is a TensorDict (memory-mapped files in practice) wrapped in a
    :class:`~tdreplay.storages.TensorStorage`, which counts as full. Writes are refused by
    the default :class:`~tdreplay.writers.ImmutableDatasetWriter`. Subclasses (e.g.
    :class:`~tdreplay.datasets.MinariExperienceReplay`) fetch and convert their data and
    define :attr:`data_path` and :attr:`data_path_root`.

    Parameters
    ----------
    data : TensorDictBase
        The dataset, batch size ``[N]`` (one row per step) or ``[N, *inner]`` (e.g.
        ``[num_episodes, max_len]``; samples then have batch size ``[B, *inner]``: the
        storage holds ``N`` rows, each an item of batch size ``inner``, and reads them back
        with it, with or without a ``collate_fn``).
    batch_size : int, optional
        Default batch size of :meth:`sample`.
    sampler : Sampler, optional
        Defaults to :class:`~tdreplay.core.RandomSampler`.
    writer : Writer, optional
        Defaults to :class:`~tdreplay.writers.ImmutableDatasetWriter`.
    collate_fn, pin_memory, prefetch, transform, generator
        As :class:`~tdreplay.core.ReplayBuffer`.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from tensordict import TensorDict
    >>> class SquaresDataset(BaseDatasetExperienceReplay):
    ...     def __init__(self, root):
    ...         self.root = Path(root)
    ...         data = TensorDict({"x": torch.arange(10.0)}, [10]).apply(lambda x: x ** 2)
    ...         super().__init__(data.memmap(self.data_path), batch_size=4)
    ...     @property
    ...     def data_path_root(self):
    ...         return self.root / "squares"
    ...     data_path = data_path_root
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     data = SquaresDataset(tmp)
    ...     sample = data.sample()
    ...     print(len(data), bool((sample["x"] == sample["index"].float() ** 2).all()))
    ...     doubled = data.preprocess(lambda td: td.set("x", 2 * td["x"]), num_workers=0,
    ...                               dest=Path(tmp) / "doubled")
    ...     print(doubled.get(torch.tensor([3]))["x"].tolist())
    ...     data.delete()
    ...     print(data.data_path.exists())
    10 True
    [18.0]
    False
    """

    def __init__(
        self,
        data: TensorDictBase,
        *,
        batch_size: int | None = None,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Transform | Callable[[Any], Any] | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        check_flag(pin_memory, "pin_memory")
        if not is_tensor_collection(data):
            raise TypeError(f"data must be a TensorDict, got {type(data).__name__}.")
        if data.batch_dims == 0 or data.batch_size[0] == 0:
            raise ValueError(f"data must have at least one row, got batch size "
                             f"{tuple(data.batch_size)}.")
        self._data = data
        super().__init__(
            storage=TensorStorage(data),
            sampler=sampler,
            writer=writer if writer is not None else ImmutableDatasetWriter(),
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform,
            batch_size=batch_size,
            generator=generator,
        )
        self._files_revision = self._storage.revision  # (the rows are the files')
        #: the files the data maps, as they were when mapped: a copy (which maps them again)
        #: and preprocess's workers refuse files replaced since (a new conversion)
        self._mapped_versions = file_versions(data)

    def _check_files_unchanged(self, what: str) -> None:
        """``RuntimeError`` naming the files the data maps that were replaced or removed
        since this buffer mapped them: ``what`` (a copy, workers) would read them by path."""
        changed = changed_files(self._mapped_versions)
        if changed:
            raise RuntimeError(_files_replaced(type(self).__name__, changed, what))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle as :meth:`__getstate__` says; the copy checks, before it maps the files
        again, that they are the ones this buffer maps (a conversion of the same dataset
        since replaced them: the copy would read other data than this buffer)."""
        reduced = super().__reduce_ex__(protocol)
        assert isinstance(reduced, tuple)  # (object's reduce of a class with __getstate__)
        return (_copy_of_dataset, (type(self), self._mapped_versions), *reduced[2:])

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the buffer (a copy maps the dataset's files again); a ``UserWarning`` when
        rows were written or restored into it in this process: they live in this process's
        copy-on-write pages, not in the files, and the copy reads the files."""
        if self._storage.revision != self._files_revision:
            warnings.warn(
                f"{type(self).__name__}: rows were written or restored into this dataset "
                "buffer in this process (storage.set, load_state_dict, loads): they are not in "
                "its files, which the copy being made reads. Save the buffer with dumps / "
                "state_dict to carry them.", UserWarning, stacklevel=2)
        return super().__getstate__()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._files_revision = self._storage.revision  # (a copy reads the files)
        if "_mapped_versions" not in state:  # (pickled by a release before 0.6.3)
            self._mapped_versions = file_versions(self._data)

    def __deepcopy__(self, memo: dict[int, Any]) -> BaseDatasetExperienceReplay:
        """``copy.deepcopy``: a buffer of its own (sampler, writer, generator, transforms)
        that maps the dataset's files again, as a pickled copy does; the files are never
        written, so the two share them safely. Rows written or restored into this buffer in
        this process are not in the files: the copy warns, as :meth:`__getstate__` says
        (the memory-mapped tensors of the files cannot be deep-copied one by one: torch
        raised ``RuntimeError``).

        Examples
        --------
        >>> import copy, tempfile, torch
        >>> from tensordict import TensorDict
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     data = TensorDict({"x": torch.arange(6.0)}, [6]).memmap(tmp)
        ...     rb = BaseDatasetExperienceReplay(data, batch_size=2)
        ...     twin = copy.deepcopy(rb)
        ...     print(twin[:]["x"].tolist(), twin.sampler is rb.sampler)
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] False
        """
        copied: BaseDatasetExperienceReplay = pickle.loads(pickle.dumps(self))
        memo[id(self)] = copied
        return copied

    @property
    def data_path(self) -> Path:
        """Path to the dataset's files, including the split (e.g. split trajectories)."""
        raise NotImplementedError(f"{type(self).__name__} does not define data_path.")

    @property
    def data_path_root(self) -> Path:
        """Path to the dataset's root directory (the unsplit data)."""
        raise NotImplementedError(f"{type(self).__name__} does not define data_path_root.")

    def delete(self) -> None:
        """Delete the dataset's files (:attr:`data_path` and :attr:`data_path_root`) from disk.

        The buffer keeps the data it has mapped until it is dropped; the next construction
        of the dataset converts it again.
        """
        for path in dict.fromkeys([Path(self.data_path), Path(self.data_path_root)]):
            if path.exists():
                remove_dir(path)

    def preprocess(
        self,
        fn: Callable[[TensorDictBase], TensorDictBase],
        dim: int = 0,
        num_workers: int | None = None,
        *,
        chunksize: int | None = None,
        num_chunks: int | None = None,
        mp_start_method: str | None = None,
        num_frames: int | None = None,
        pbar: bool = False,
        dest: str | os.PathLike,
    ) -> TensorStorage:
        """Apply ``fn`` to the whole dataset and return a new storage with the results.

        ``fn`` must be unitary: it acts on each sample independently (it is called on chunks
        of samples along ``dim``, copies of the dataset's data that it may modify) and returns
        a TensorDict of the chunk's batch size with the same entries for every chunk. The
        results are written as memory-mapped files under ``dest``; the dataset itself is not
        changed (:meth:`delete` removes it once it is no longer needed).

        Parameters
        ----------
        fn : callable
            ``fn(chunk) -> TensorDict``. Must be picklable with the ``"spawn"`` and
            ``"forkserver"`` start methods (a module-level function).
        dim : int
            Dimension of the data along which it is cut into chunks.
        num_workers : int, optional
            Worker processes; ``None`` uses one per CPU, ``0`` runs everything in this process.
        chunksize : int, optional
            Samples per chunk (exclusive with ``num_chunks``).
        num_chunks : int, optional
            Number of chunks (exclusive with ``chunksize``). Defaults to 4 per worker.
        mp_start_method : str, optional
            ``"fork"``, ``"spawn"`` or ``"forkserver"``; defaults to multiprocessing's.
        num_frames : int, optional
            Only the first ``num_frames`` rows of the dataset are transformed (all when
            larger), e.g. to try a transform out.
        pbar : bool
            Show a progress bar (tqdm).
        dest : path
            A new or empty directory for the result. The result appears there whole: it is
            built in a scratch directory beside ``dest`` and renamed at the end, and nothing
            is left behind if ``fn`` fails.

        Returns
        -------
        TensorStorage
            A full storage over the memory-mapped results, for use in a new buffer.
        """
        pbar = check_flag(pbar, "pbar")
        dest = Path(dest)
        check_empty_destination(dest, "dest")
        source = self._data
        if isinstance(dim, bool) or not isinstance(dim, int) \
                or not -source.batch_dims <= dim < source.batch_dims:
            raise ValueError(f"dim must be an int in [{-source.batch_dims}, {source.batch_dims}) "
                             f"(the data has batch size {tuple(source.batch_size)}), got {dim!r}.")
        dim %= source.batch_dims
        workers = resolve_num_workers(num_workers)
        chunksize = check_count(chunksize, "chunksize", 1)
        num_chunks = check_count(num_chunks, "num_chunks", 1)
        if chunksize is not None and num_chunks is not None:
            raise ValueError("pass chunksize or num_chunks, not both.")
        if mp_start_method is not None and \
                mp_start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"mp_start_method must be one of "
                             f"{multiprocessing.get_all_start_methods()}, got {mp_start_method!r}.")
        if check_count(num_frames, "num_frames", 1) is not None:
            source = source[:num_frames]
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}.")
        self._check_workers_read_these_rows(workers, mp_start_method)
        with staging_dir(dest) as scratch:
            parallel_map_to_memmap(
                fn, source, scratch / "data", dim=dim, num_workers=workers, chunksize=chunksize,
                num_chunks=num_chunks, mp_start_method=mp_start_method, pbar=pbar)
            if not publish(scratch / "data", dest):
                raise FileExistsError(f"dest {str(dest)!r} was filled by someone else while "
                                      "preprocessing.")
        return TensorStorage(load_memmap(dest))

    def _check_workers_read_these_rows(self, workers: int, start_method: str | None) -> None:
        """Refuse a :meth:`preprocess` whose worker processes would read other rows than this
        buffer: they map the files by path (a worker started by ``fork`` reads this
        process's pages), so rows written or restored into the buffer in this process
        (``spawn`` / ``forkserver`` workers) or files replaced since it mapped them (any
        worker) would be mixed with the rows chunk 0 reads here."""
        if not workers:
            return
        self._check_files_unchanged(f"preprocess's {workers} worker processes")
        method = start_method or multiprocessing.get_start_method(allow_none=True) \
            or multiprocessing.get_context().get_start_method()
        if method != "fork" and self._storage.revision != self._files_revision:
            raise RuntimeError(
                f"{type(self).__name__}.preprocess: rows were written or restored into this "
                "dataset buffer in this process (storage.set, load_state_dict, loads); the "
                f"{workers} worker processes ({method!r} start method) would read the files "
                "instead, and the result would mix both. Use num_workers=0 or "
                "mp_start_method='fork'. Nothing was written.")


def _files_replaced(buffer: str, changed: list[str], what: str) -> str:
    shown = ", ".join(repr(name) for name in changed[:3]) + (" ..." if len(changed) > 3 else "")
    return (f"{buffer}: the dataset's files were replaced or removed since this buffer mapped "
            f"them ({shown}: a new conversion of the same dataset?), and {what} would read "
            "them by path, i.e. possibly other data than this buffer holds (any rewrite of a "
            "file counts, by inode, size and modification time: a touch too, or a conversion "
            "of the same data elsewhere). Build a new buffer over the files as they are now, "
            "or save this one with dumps to carry its rows.")


def _copy_of_dataset(cls: type[BaseDatasetExperienceReplay],
                     versions: dict[str, FileVersion]) -> BaseDatasetExperienceReplay:
    """The object a pickled dataset buffer is rebuilt into (its state set after), once the
    files it maps are found to be those the pickled buffer mapped."""
    changed = changed_files(versions)
    if changed:
        raise RuntimeError(_files_replaced(cls.__name__, changed, "a copy of it"))
    return cls.__new__(cls)
