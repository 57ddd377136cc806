"""``MinariExperienceReplay``: Minari datasets as read-only replay buffers in the TED layout.

On-disk layout under ``root``::

    <root>/<dataset_id>/                   the converted dataset (data_path_root)
        tdreplay-dataset.json              what was converted (written last: marks it complete)
        env_metadata.json                  the Minari dataset's spec, as TorchRL writes it
        data/                              one memory-mapped file per entry (TensorDict.memmap)
    <root>/<dataset_id>_split/             the same, split into padded episodes (split_trajs)

Each directory is built in a scratch directory beside it and renamed into place at the end, so
it is either complete or absent; the next construction reuses it without converting again,
unless it was converted from a local Minari dataset that has changed since (its files'
fingerprint is recorded in the marker) or it is a split made from another conversion.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdreplay.core import Sampler, Transform, Writer, split_trajectories
from tdreplay.core.file_room import mapped_like
from tdreplay.core.utils import check_count, check_flag, check_instance

from ._files import publish, remove_dir, remove_empty_dirs, staging_dir
from ._integrity import check_leaf_files, leaf_files, read_json
from ._minari_ted import episode_to_ted
from ._parallel_map import leaf_layout, load_memmap
from .base import BaseDatasetExperienceReplay

__all__ = ["MinariExperienceReplay"]

# 2: infos kept whole under "info" (no lifted "state"), TorchRL's spec keys, env_metadata.json,
#    the local source's fingerprint and the conversion's id; format-1 conversions are converted
#    again (with download=True or load_from_local_minari)
_FORMAT = 2
_MARKER = "tdreplay-dataset.json"
_ENV_METADATA = "env_metadata.json"  # TorchRL's metadata_path
# marker entries that are bookkeeping, not metadata
_INTERNAL = ("format", "files", "source", "conversion", "empty_episodes")
# local source files up to this size are hashed into the fingerprint as well
_HASH_LIMIT = 32 * 2**20
_DATA = "data"
_SPLIT_SUFFIX = "_split"
_MINARI_META = "metadata.json"  # beside Minari's data files (main_data.hdf5, ...)
_HDF5_FILE = "main_data.hdf5"  # Minari's HDF5 storage: one group episode_<id> per episode
# MINARI_DATASETS_PATH is process-wide: one download at a time may point it elsewhere
_MINARI_PATH_LOCK = threading.Lock()


def default_root() -> Path:
    """Where converted Minari datasets go by default: ``~/.cache/tdreplay/minari``."""
    return Path("~/.cache/tdreplay/minari").expanduser()


def local_minari_dir() -> Path:
    """Minari's local cache: ``$MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env) if env else Path("~/.minari/datasets").expanduser()


def _check_dataset_id(dataset_id: Any) -> str:
    if not isinstance(dataset_id, str) or not dataset_id:
        raise TypeError(f"dataset_id must be a non-empty str, got {dataset_id!r}.")
    parts = dataset_id.split("/")
    if dataset_id.startswith("/") or any(part in ("", ".", "..") for part in parts) \
            or "\\" in dataset_id or "\0" in dataset_id:
        raise ValueError(f"dataset_id {dataset_id!r} is not a Minari dataset id of the form "
                         "'(namespace/)name-v<version>' (it is also a path under root: no empty, "
                         "'.' or '..' parts).")
    return dataset_id


class _classproperty:
    """A read-only property of the class (and of its instances)."""

    def __init__(self, fget: Callable[[Any], Any]) -> None:
        self.fget = fget
        self.__doc__ = fget.__doc__

    def __get__(self, obj: Any, owner: type) -> Any:
        return self.fget(owner)


@contextmanager
def _minari_datasets_path(path: Path) -> Iterator[None]:
    """Point Minari's ``MINARI_DATASETS_PATH`` at ``path`` for the block."""
    with _MINARI_PATH_LOCK:
        previous = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = str(path)
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("MINARI_DATASETS_PATH", None)
            else:
                os.environ["MINARI_DATASETS_PATH"] = previous


def _download(dataset_id: str, root: Path) -> None:
    """``minari.download_dataset(dataset_id)``, its failures told in plain words."""
    import minari

    try:
        minari.download_dataset(dataset_id)
    except ImportError as err:
        raise ImportError(
            f"downloading the Minari dataset {dataset_id!r} needs Minari's remote backend: "
            f"pip install 'minari[hf]' ({err}).") from err
    except Exception as err:
        what = f"{type(err).__name__}: {err}"
        hint = (f"Nothing was written under {str(root)!r}. A dataset already in the local Minari "
                f"cache ({str(local_minari_dir())!r}) loads with load_from_local_minari=True.")
        if isinstance(err, ValueError) and not isinstance(err, OSError):
            # Minari's own checks: no such dataset or version on the remote
            raise ValueError(f"Minari could not download the dataset {dataset_id!r}: {what}. "
                             f"{hint}") from err
        raise ConnectionError(
            f"could not download the Minari dataset {dataset_id!r} with "
            f"minari.download_dataset ({what}); is the network reachable? {hint}") from err


def _open_local(dataset_id: str) -> Any:
    """The Minari dataset ``dataset_id`` of the local Minari cache (never downloads)."""

    where = local_minari_dir() / dataset_id / _DATA
    if not where.is_dir():
        raise FileNotFoundError(
            f"the Minari dataset {dataset_id!r} is not in the local Minari cache: looked for "
            f"{str(where)!r} (the cache is $MINARI_DATASETS_PATH, else ~/.minari/datasets). "
            "Create it with minari, or pass load_from_local_minari=False to download it.")
    return _open_minari(dataset_id, where)


def _source_fingerprint(dataset_id: str) -> dict[str, list[Any]]:
    """The fingerprint of the local Minari dataset ``dataset_id``'s files.

    Every file under ``<local cache>/<dataset_id>/data`` (path relative to it) maps to
    ``[size, mtime_ns, sha256]``; the hash is left out (``None``) for files over 32 MiB. A
    ``FileNotFoundError`` naming the directory when the dataset is not in the cache.
    """
    where = local_minari_dir() / dataset_id / _DATA
    if not where.is_dir():
        _open_local(dataset_id)  # raises the FileNotFoundError naming where it looked
    fingerprint: dict[str, list[Any]] = {}
    for path in sorted(where.rglob("*")):
        if not path.is_file():
            continue
        stat = path.stat()
        digest = None
        if stat.st_size <= _HASH_LIMIT:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        fingerprint[path.relative_to(where).as_posix()] = [stat.st_size, stat.st_mtime_ns, digest]
    return fingerprint


def _data_files(where: Path) -> str:
    """The data files of the Minari dataset directory ``where`` (e.g. ``main_data.hdf5``)."""
    try:
        names = sorted(str(p) for p in where.iterdir() if p.is_file() and p.name != _MINARI_META)
    except OSError:
        names = []
    return ", ".join(repr(n) for n in names) or repr(str(where))


def _episode_place(where: Path | None, episode_id: Any) -> str:
    """Where the Minari dataset directory ``where`` keeps episode ``episode_id``: its group
    ``episode_<id>`` in ``main_data.hdf5`` (Minari's HDF5 storage), its directory ``<id>``
    (Minari's Arrow storage), else the dataset's data files."""
    if where is None:
        return "its data files"
    if (where / _HDF5_FILE).is_file():
        return f"group 'episode_{episode_id}' of the file {str(where / _HDF5_FILE)!r}"
    if (where / str(episode_id)).is_dir():
        return f"the directory {str(where / str(episode_id))!r}"
    return f"in {_data_files(where)}"


def _unreadable(dataset_id: str, where: Path, err: Exception) -> ValueError:
    """The error for a Minari dataset whose files cannot be read, naming them."""
    culprit = where / _MINARI_META
    if not culprit.is_file() and where.is_dir():  # (minari: "No data found in data path")
        return ValueError(f"cannot read the Minari dataset {dataset_id!r}: its {_MINARI_META} "
                          f"is missing ({str(culprit)!r}), without which Minari reads none of "
                          f"its data files ({type(err).__name__}: {err}).")
    named = repr(str(culprit)) if isinstance(err, json.JSONDecodeError) and culprit.is_file() \
        else _data_files(where)
    return ValueError(f"cannot read the Minari dataset {dataset_id!r}: {named} is damaged or not "
                      f"a Minari dataset file ({type(err).__name__}: {err}).")


#: what reading a damaged Minari file raises: h5py's errors are OSError, ValueError, KeyError,
#: TypeError, and RuntimeError for some damaged HDF5 structures ("free block size is zero?")
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, RuntimeError)


def _open_minari(dataset_id: str, where: Path) -> Any:
    """``minari.MinariDataset(where)``; a damaged file is a ``ValueError`` naming it."""
    import minari

    try:
        return minari.MinariDataset(where)
    except _UNREADABLE as err:
        raise _unreadable(dataset_id, where, err) from err


def _episodes(dataset: Any, dataset_id: str, where: Path | None) -> Iterator[Any]:
    """``dataset.iterate_episodes()``; a file that cannot be read is named in the error."""
    episodes = iter(dataset.iterate_episodes())
    while True:
        try:
            episode = next(episodes)
        except StopIteration:
            return
        except _UNREADABLE as err:
            if where is None:
                raise
            raise _unreadable(dataset_id, where, err) from err
        yield episode


def _serialize_space(space: Any) -> str | None:
    from minari.serialization import serialize_space

    try:
        return serialize_space(space)
    except Exception:  # a space Minari cannot serialize: metadata without it
        return None


def _space_to_dict(space: Any) -> dict[str, Any] | None:
    """A gymnasium space as TorchRL 0.14 writes it into ``env_metadata.json``: ``Dict``,
    ``Box`` and ``Discrete`` as dicts; ``Text`` (as in TorchRL) and every other space (on
    which TorchRL raises) as ``None``."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {"type": "Dict",
                "subspaces": {key: _space_to_dict(sub) for key, sub in space.spaces.items()}}
    if isinstance(space, spaces.Box):
        return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(),
                "dtype": str(space.dtype), "shape": list(space.shape)}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "dtype": str(space.dtype), "n": int(space.n),
                "shape": list(space.shape)}
    return None


def _as_json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists; what JSON cannot hold, e.g.
    a callable entry point, becomes its ``str``)."""
    return json.loads(json.dumps(value, default=str))


def _spec_entries(dataset: Any) -> dict[str, Any]:
    """The entries of the dataset's ``MinariDatasetSpec`` (``dataclasses.asdict``, as TorchRL's
    metadata) but its spaces, as they read back from JSON: ``env_spec`` is the gymnasium
    ``EnvSpec`` as a dict (or ``None``)."""
    spec = dataset.spec
    env_spec = spec.env_spec
    if dataclasses.is_dataclass(env_spec) and not isinstance(env_spec, type):
        env_spec = dataclasses.asdict(env_spec)
    return _as_json({
        "dataset_id": spec.dataset_id,
        "namespace": spec.namespace,
        "dataset_name": spec.dataset_name,
        "version": spec.version,
        "env_spec": env_spec,
        "data_path": str(spec.data_path),
        "combined_datasets": list(spec.combined_datasets),
        "total_episodes": int(spec.total_episodes),
        "total_steps": int(spec.total_steps),
        "minari_version": str(spec.minari_version),
    })


def _convert(dataset: Any, dataset_id: str, dest: Path, source: Path | None = None,
             extra: dict[str, Any] | None = None) -> None:
    """Write ``dataset`` (a ``minari.MinariDataset``) to ``dest`` in the TED layout.

    Episodes go one after the other in the dataset's order into memmap files sized for the
    whole dataset; a progress bar counts the steps. Text entries are left out with a warning.
    ``source`` is the Minari dataset's directory, named when its files cannot be read;
    ``extra`` goes into the marker. ``env_metadata.json`` gets the dataset's spec.
    """
    from tqdm.auto import tqdm

    total = int(dataset.total_steps)
    dropped: set[str] = set()
    data = None
    layout: dict[Any, tuple[tuple[int, ...], Any]] | None = None
    index = 0
    empty = 0  # episodes without steps: counted by Minari's total_episodes, no row here
    with tqdm(total=total, desc=f"converting {dataset_id}", unit="step") as bar:
        for episode in _episodes(dataset, dataset_id, source):
            try:
                td = episode_to_ted(episode, dropped)
            except (ValueError, TypeError) as err:
                raise type(err)(
                    f"episode {episode.id} of the Minari dataset {dataset_id!r} "
                    f"({_episode_place(source, episode.id)}) is damaged: {err}") from err
            steps = td.batch_size[0]
            if steps == 0:
                empty += 1
                continue
            if data is None:
                layout = leaf_layout(td)
                # (a full disk, a file-size limit: OSError naming the file, not SIGBUS below)
                data = mapped_like(td[0].expand(total), dest / _DATA, "a converted dataset")
            elif leaf_layout(td) != layout:
                raise ValueError(
                    f"episode {episode.id} of the Minari dataset {dataset_id!r} has entries "
                    f"{sorted(map(str, leaf_layout(td).items()))}, the first episode "
                    f"{sorted(map(str, (layout or {}).items()))}: cannot store them in one table.")
            if index + steps > total:
                raise ValueError(f"the Minari dataset {dataset_id!r} has more steps than the "
                                 f"{total} its metadata declares.")
            data[index:index + steps] = td
            index += steps
            bar.update(steps)
    if data is None:
        raise ValueError(f"the Minari dataset {dataset_id!r} has no steps.")
    if index != total:
        raise ValueError(f"the Minari dataset {dataset_id!r} has {index} steps, but its metadata "
                         f"declares {total}.")
    if dropped:
        warnings.warn(f"MinariExperienceReplay: text data has no tensor form and was dropped from "
                      f"{dataset_id!r}: {sorted(dropped)}.", UserWarning, stacklevel=4)
    spec = _spec_entries(dataset)
    (dest / _ENV_METADATA).write_text(json.dumps({
        **spec,
        "observation_space": _as_json(_space_to_dict(dataset.observation_space)),
        "action_space": _as_json(_space_to_dict(dataset.action_space)),
    }))
    _write_marker(dest, {
        **spec,
        "dataset_id": dataset_id,
        "split_trajs": False,
        "total_steps": total,
        "total_episodes": int(dataset.total_episodes),
        "observation_space": _serialize_space(dataset.observation_space),
        "action_space": _serialize_space(dataset.action_space),
        "dropped_text": sorted(dropped),
        # total_episodes less the episodes with rows, checked on every load
        "empty_episodes": empty,
        **(extra or {}),
        # leaf file -> size in bytes, checked on every load (a leaf missing from meta.json)
        "files": leaf_files(dest / _DATA),
    })


def _write_marker(path: Path, meta: dict[str, Any]) -> None:
    (path / _MARKER).write_text(json.dumps({"format": _FORMAT, **meta}, indent=1))


class MinariExperienceReplay(BaseDatasetExperienceReplay):
    """A `Minari <https://minari.farama.org>`_ dataset as a read-only replay buffer (TED layout).

    The dataset is converted once to memory-mapped files under ``<root>/<dataset_id>`` (with
    a progress bar) and reused by later constructions; data converted from the local Minari
    cache is converted again once that source has changed (see ``load_from_local_minari``).
    Each step ``t`` of each episode is a row with ``observation``, ``action``, ``episode``
    (the episode's id), ``("next", "observation")`` and ``("next", "reward" | "terminated" |
    "truncated" | "done")`` (shape ``[1]``, ``done = terminated | truncated``), exactly as in
    the Minari episodes. Dict (and tuple) observations and actions, and infos, become nested
    TensorDicts: ``info`` holds the info before the step, ``("next", "info")`` the one after
    it, every info entry included (one named ``state`` stays at ``("info", "state")``, as in
    TorchRL). Text has no tensor form: it is dropped with a warning.

    Parameters
    ----------
    dataset_id : str
        The Minari dataset, e.g. ``"D4RL/door/human-v2"`` (see :attr:`available_datasets`).
    batch_size : int, optional
        Default batch size of :meth:`sample` (``sample(batch_size)`` overrides it); with
        ``None`` every call passes one, as with any tdreplay buffer.

    Keyword Arguments
    -----------------
    root : path, optional
        Where converted datasets live. Defaults to ``~/.cache/tdreplay/minari``.
    download : bool or "force"
        ``True``: fetch and convert the dataset when it is not under ``root`` yet. ``False``:
        use only what is under ``root`` (``FileNotFoundError`` when it is missing, unless
        ``load_from_local_minari`` names a local source, which never touches the network).
        ``"force"``: fetch and convert again, replacing what is under ``root`` (the old data
        stays until the new one is complete). Any other value raises a ``ValueError`` (a
        truthy string such as ``"yes"`` is not taken for ``True``).
    sampler : Sampler, optional
        Defaults to :class:`~tdreplay.core.RandomSampler`.
    writer : Writer, optional
        Defaults to :class:`~tdreplay.writers.ImmutableDatasetWriter` (writes are refused).
    collate_fn : callable, optional
        Applied to each sampled batch.
    pin_memory : bool
        Pin sampled batches (when an accelerator is present).
    prefetch : int, optional
        Batches sampled ahead in a background thread.
    transform : Transform, optional
        Applied to every sample.
    split_trajs : bool
        Store the data as ``[num_episodes, max_len]``: one row per Minari episode (split on
        the ``episode`` ids), zero-padded after its end, with a boolean ``mask`` entry telling
        real steps from padding and a ``traj_ids`` entry (int64: the row's number on its real
        steps, 0 on the padding) as in TorchRL (see :func:`~tdreplay.core.split_trajectories`).
        TorchRL splits on ``done`` instead; the two agree unless an episode ends with neither
        ``terminated`` nor ``truncated`` (Minari accepts such episodes, e.g. a recording
        stopped early), which TorchRL merges into the next episode and tdreplay keeps on its
        own row. Samples are whole episodes, ``[batch_size, max_len]``. Kept in
        ``<root>/<dataset_id>_split``.
    load_from_local_minari : bool
        Read the dataset from the local Minari cache (``$MINARI_DATASETS_PATH``, else
        ``~/.minari/datasets``), e.g. one made with ``minari.create_dataset_from_buffers``,
        instead of downloading it. Raises ``FileNotFoundError`` naming the directory looked
        in when it is not there. The conversion records a fingerprint of the source's files
        (names, sizes, modification times in ns, and a SHA-256 of each file up to 32 MiB);
        a later construction with ``load_from_local_minari=True`` reuses it only while that
        fingerprint is unchanged, and converts again (replacing it, and the split made from
        it) otherwise, so data re-recorded under the same id is never served stale. TorchRL
        converts again on every such construction.

    Otherwise a dataset missing under ``root`` is fetched with ``minari.download_dataset``
    into a scratch directory beside its target (then converted and renamed into place; the
    raw download is not kept). If the download fails, a ``ConnectionError`` says so (a
    ``ValueError`` when Minari's remote has no such dataset) and nothing is left under
    ``root``.

    Attributes
    ----------
    available_datasets : list of str
        The ids on Minari's remote server (needs the network; ``ConnectionError`` offline).
    metadata : dict
        What was converted: the entries of the Minari dataset's spec, as in TorchRL
        (``dataset_id``, ``namespace`` and ``version`` (``None`` when the id has none),
        ``dataset_name``, ``env_spec`` (the gymnasium ``EnvSpec`` as a dict, ``None`` when the
        dataset recorded none), ``data_path`` (the Minari directory the data was read from, a
        ``str``; for a download, a scratch directory that no longer exists),
        ``combined_datasets`` (list), ``total_steps``, ``total_episodes``, ``minari_version``,
        ``observation_space``/``action_space`` as gymnasium spaces, not TorchRL specs), and
        tdreplay's ``dropped_text`` (keys left out), ``split_trajs`` and, with
        ``split_trajs``, ``max_len``.
    metadata_path : Path
        ``<root>/<dataset_id>/env_metadata.json``: the spec as TorchRL writes it.

    Examples
    --------
    A small dataset made locally with Minari, converted and sampled:

    >>> import os, shutil, tempfile, warnings
    >>> import gymnasium as gym, minari, numpy as np
    >>> from minari.data_collector import EpisodeBuffer
    >>> tmp = tempfile.mkdtemp()
    >>> previous = os.environ.get("MINARI_DATASETS_PATH")
    >>> os.environ["MINARI_DATASETS_PATH"] = os.path.join(tmp, "minari")
    >>> env = gym.make("CartPole-v1", max_episode_steps=10)
    >>> episodes = []
    >>> for seed in range(3):
    ...     obs, _ = env.reset(seed=seed)
    ...     observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
    ...     done = False
    ...     while not done:
    ...         obs, reward, terminated, truncated, _ = env.step(seed % 2)
    ...         done = terminated or truncated
    ...         observations.append(obs)
    ...         actions.append(seed % 2)
    ...         rewards.append(reward)
    ...         terminations.append(terminated)
    ...         truncations.append(truncated)
    ...     episodes.append(EpisodeBuffer(
    ...         id=seed, observations=np.stack(observations), actions=np.array(actions),
    ...         rewards=np.array(rewards), terminations=np.array(terminations),
    ...         truncations=np.array(truncations), infos={}))
    >>> with warnings.catch_warnings():  # minari's advice on authorship metadata
    ...     warnings.simplefilter("ignore")
    ...     _ = minari.create_dataset_from_buffers("cartpole/doc-v0", episodes, env=env,
    ...                                            algorithm_name="fixed")
    >>> data = MinariExperienceReplay("cartpole/doc-v0", batch_size=4,
    ...                               root=os.path.join(tmp, "converted"),
    ...                               load_from_local_minari=True)
    >>> sample = data.sample()
    >>> sample["observation"].shape, sample["next", "done"].shape, sample["action"].dtype
    (torch.Size([4, 4]), torch.Size([4, 1]), torch.int64)
    >>> len(data) == data.metadata["total_steps"], data.metadata["total_episodes"]
    (True, 3)
    >>> data.metadata["namespace"], data.metadata["dataset_name"], data.metadata["version"]
    ('cartpole', 'doc', 0)
    >>> data.metadata["env_spec"]["id"], data.metadata["env_spec"]["max_episode_steps"]
    ('CartPole-v1', 10)
    >>> data.metadata_path.name, data.metadata_path.is_file()
    ('env_metadata.json', True)
    >>> recorded = episodes
    >>> episodes = MinariExperienceReplay("cartpole/doc-v0", split_trajs=True,
    ...                                   root=os.path.join(tmp, "converted"), download=False,
    ...                                   load_from_local_minari=True)
    >>> episodes.sample(2)["mask"].shape == (2, episodes.metadata["max_len"])
    True
    >>> episodes[:]["traj_ids"][:, 0].tolist()
    [0, 1, 2]

    ``delete()`` removes what the buffer reads (here the split only, as in TorchRL):

    >>> episodes.delete()
    >>> sorted(os.listdir(os.path.join(tmp, "converted", "cartpole")))
    ['doc-v0']

    Re-recording the local dataset under the same id is seen by the next construction:

    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     shutil.rmtree(os.path.join(tmp, "minari", "cartpole", "doc-v0"))
    ...     _ = minari.create_dataset_from_buffers("cartpole/doc-v0", recorded[:1], env=env,
    ...                                            algorithm_name="fixed")
    >>> fresh = MinariExperienceReplay("cartpole/doc-v0", batch_size=4,
    ...                                root=os.path.join(tmp, "converted"),
    ...                                load_from_local_minari=True)
    >>> fresh.metadata["total_episodes"], len(fresh) == len(recorded[0].rewards)
    (1, True)
    >>> if previous is None:
    ...     del os.environ["MINARI_DATASETS_PATH"]
    ... else:
    ...     os.environ["MINARI_DATASETS_PATH"] = previous
    """

    def __init__(
        self,
        dataset_id: str,
        batch_size: int | None = None,
        *,
        root: str | os.PathLike | None = None,
        download: bool | str = True,
        sampler: Sampler | None = None,
        writer: Writer | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Transform | Callable[[Any], Any] | None = None,
        split_trajs: bool = False,
        load_from_local_minari: bool = False,
    ) -> None:
        self.dataset_id = _check_dataset_id(dataset_id)
        if isinstance(download, (bool, np.bool_)):
            download = bool(download)
        elif not (isinstance(download, str) and download == "force"):
            raise ValueError(f"download must be True, False or 'force', got {download!r}.")
        pin_memory = check_flag(pin_memory, "pin_memory")
        split_trajs = check_flag(split_trajs, "split_trajs")
        load_from_local_minari = check_flag(load_from_local_minari, "load_from_local_minari")
        # the buffer's own arguments, checked before any (long) conversion
        check_count(batch_size, "batch_size", 1)
        for value, kind, name in ((sampler, Sampler, "sampler"), (writer, Writer, "writer")):
            if value is not None:
                check_instance(value, kind, name)
        self.download = download
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a str, a path or None, got {type(root).__name__}.")
        self.root = Path(root).expanduser() if root is not None else default_root()
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(f"root must be a directory (the converted datasets live "
                                     f"under it), got the file {str(self.root)!r}.")
        self.split_trajs = split_trajs
        self.load_from_local_minari = load_from_local_minari

        if download == "force":
            self._build_flat(replace=True)
            if self.split_trajs:
                self._build_split(replace=True)
        else:
            self._prepare(download is True)
        data = self._load_checked(self.data_path)
        self.metadata = self._read_metadata(self.data_path)
        super().__init__(
            data,
            batch_size=batch_size,
            sampler=sampler,
            writer=writer,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform,
        )

    # ---- paths -------------------------------------------------------------------------------
    @property
    def data_path_root(self) -> Path:
        """The converted dataset: ``<root>/<dataset_id>``."""
        return self.root / self.dataset_id

    @property
    def _split_path(self) -> Path:
        """The dataset split into episodes: ``<root>/<dataset_id>_split`` (with or without
        ``split_trajs``)."""
        return self.root / (self.dataset_id + _SPLIT_SUFFIX)

    @property
    def data_path(self) -> Path:
        """The data this buffer reads: ``<root>/<dataset_id>_split`` with ``split_trajs``,
        else :attr:`data_path_root`."""
        return self._split_path if self.split_trajs else self.data_path_root

    @property
    def metadata_path(self) -> Path:
        """``<root>/<dataset_id>/env_metadata.json``, as in TorchRL (also with
        ``split_trajs``): the Minari dataset's spec (``dataclasses.asdict`` of
        ``MinariDatasetSpec``) as JSON, its spaces written as TorchRL writes them (``Dict``,
        ``Box`` and ``Discrete`` as dicts, other spaces as ``null``). Written with the
        conversion; :attr:`metadata` holds the same entries with gymnasium spaces."""
        return self.data_path_root / _ENV_METADATA

    @_classproperty
    def available_datasets(cls) -> list[str]:
        """The dataset ids on Minari's remote server, sorted (``ConnectionError`` offline)."""
        import minari

        try:
            remote = minari.list_remote_datasets()
        except ImportError as err:
            raise ImportError(f"listing Minari's remote datasets needs Minari's remote backend: "
                              f"pip install 'minari[hf]' ({err}).") from err
        except Exception as err:
            raise ConnectionError(
                f"could not list Minari's remote datasets ({type(err).__name__}: {err}); is the "
                "network reachable? minari.list_local_datasets() lists the local ones.") from err
        return sorted(remote)

    def delete(self) -> None:
        """Delete the data this buffer reads (:attr:`data_path`) from disk, as TorchRL does.

        With ``split_trajs=True`` that is only ``<root>/<dataset_id>_split``: the flat
        conversion stays, and the next construction with ``split_trajs`` splits it again
        without converting. Without ``split_trajs`` it is the flat conversion; a split made
        from it stays readable on its own and is made again once the flat data is converted
        anew. Empty namespace directories left under ``root`` are removed too. The buffer
        keeps the data it has mapped until it is dropped.
        """
        if self.data_path.exists():
            remove_dir(self.data_path)
        parents = self.data_path_root.relative_to(self.root).parents
        remove_empty_dirs([self.root / parent for parent in parents if parent != Path(".")])

    # ---- building ----------------------------------------------------------------------------
    def _conversion(self, path: Path) -> dict[str, Any] | None:
        """The marker of the complete conversion in ``path`` (of this or an older format:
        callers check ``"format"``), ``None`` when ``path`` is missing or empty; raises if it
        holds something else."""
        marker = path / _MARKER
        if marker.is_file():
            meta = read_json(marker, "the dataset marker file")
            if isinstance(meta.get("format"), int) and meta["format"] <= _FORMAT \
                    and meta.get("dataset_id") == self.dataset_id:
                return meta
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
            return None
        raise FileExistsError(
            f"{str(path)!r} exists but holds no dataset converted by this version of "
            f"tdreplay-datasets for {self.dataset_id!r}; remove it or pass download='force'.")

    def _prepare(self, download: bool) -> None:
        """Make sure :attr:`data_path` holds a current conversion (``download`` is not
        ``"force"``): reuse what is under ``root`` unless it is missing, of an older format,
        converted from a local Minari dataset that has changed since (or, with
        ``load_from_local_minari``, from anything else), or a split of another conversion."""
        fingerprint = _source_fingerprint(self.dataset_id) if self.load_from_local_minari \
            else None
        flat = self._conversion(self.data_path_root)
        flat_ok = flat is not None and flat.get("format") == _FORMAT and (
            fingerprint is None or flat.get("source") == fingerprint)
        split = self._conversion(self._split_path) if self.split_trajs else None
        if self.split_trajs and split is not None and split.get("format") == _FORMAT:
            if flat_ok:
                if flat is not None and split.get("conversion") == flat.get("conversion"):
                    return
            elif flat is None and fingerprint is None:
                return  # the flat conversion was deleted; its split stands on its own
        elif not self.split_trajs and flat_ok:
            return
        if not flat_ok:
            if download is False and fingerprint is None:
                if flat is None:
                    raise FileNotFoundError(
                        f"the Minari dataset {self.dataset_id!r} is not converted under root: "
                        f"looked for {str(self.data_path_root)!r}. Pass download=True to fetch "
                        "and convert it, or load_from_local_minari=True to convert it from the "
                        "local Minari cache.")
                raise FileNotFoundError(
                    f"the Minari dataset {self.dataset_id!r} under root "
                    f"({str(self.data_path_root)!r}) was converted by an older version of "
                    "tdreplay-datasets. Pass download=True or download='force' to convert it "
                    "again, or load_from_local_minari=True to convert it from the local Minari "
                    "cache.")
            self._build_flat(replace=flat is not None)
        if self.split_trajs:
            self._build_split(replace=split is not None)

    def _build_flat(self, replace: bool) -> None:
        target = self.data_path_root
        extra: dict[str, Any] = {"conversion": uuid.uuid4().hex, "source": None}
        with staging_dir(target) as scratch:
            if self.load_from_local_minari:
                source = local_minari_dir() / self.dataset_id / _DATA
                # taken before reading: a change made meanwhile shows at the next construction
                extra["source"] = _source_fingerprint(self.dataset_id)
                dataset = _open_local(self.dataset_id)
            else:

                raw = scratch / "minari"
                with _minari_datasets_path(raw):
                    _download(self.dataset_id, self.root)
                source = raw / self.dataset_id / _DATA
                dataset = _open_minari(self.dataset_id, source)
            built = scratch / "converted"
            built.mkdir()
            _convert(dataset, self.dataset_id, built, source, extra)
            del dataset
            if replace and extra["source"] is not None and self.download != "force":
                # another process may have converted the same source meanwhile: keep theirs
                current = self._conversion(target)
                if current is not None and current.get("format") == _FORMAT \
                        and current.get("source") == extra["source"]:
                    replace = False
            published = publish(built, target, replace=replace)
        if replace and published:
            # derived from the data just replaced
            if self._split_path.exists():
                remove_dir(self._split_path)

    def _build_split(self, replace: bool) -> None:
        target = self._split_path
        flat = self._load_checked(self.data_path_root)
        meta = self._read_metadata(self.data_path_root, raw=True)
        with staging_dir(target) as scratch:
            # one row per Minari episode (not per done-delimited run as in TorchRL, which
            # merges an episode ending with neither flag into the next one)
            split = split_trajectories(flat, trajectory_key="episode")
            rows, max_len = split.batch_size
            # TorchRL's traj_ids: the row's number (int64) on its real steps, 0 on the padding
            split.set("traj_ids", torch.where(
                split["mask"], torch.arange(rows, dtype=torch.int64)[:, None],
                torch.zeros((), dtype=torch.int64)))
            built = scratch / "converted"
            files = mapped_like(split, built / _DATA, "a dataset split by trajectory")
            files.update_(split)
            del files
            _write_marker(built, {**meta, "split_trajs": True, "max_len": max_len,
                                  "files": leaf_files(built / _DATA)})
            publish(built, target, replace=replace)

    def _load_checked(self, path: Path) -> Any:
        """The memmap data of the conversion in ``path``, after checking that every leaf file
        is there at its full size, that the ``env_metadata.json`` of the conversion (what
        :attr:`metadata_path` hands to TorchRL code; for a split, the flat conversion's when
        it is the one the split was made from) is whole, and that the counts it and the
        marker declare (``total_steps``, ``total_episodes``; what :attr:`metadata` shows) are
        those of the data (``ValueError`` naming the file and the field otherwise; nothing on
        disk changes: mapping a short file would zero-extend it)."""
        marker = read_json(path / _MARKER, "the dataset marker file")
        check_leaf_files(path / _DATA, marker.get("files"))
        env_path = self._env_metadata_of(path, marker)
        env = None if env_path is None else read_json(env_path, "the environment metadata file")
        try:
            data = load_memmap(path / _DATA)
            _check_leaf_shapes(data)
        except (KeyError, ValueError, RuntimeError, TypeError) as err:  # (json too)
            raise ValueError(f"the converted data under {str(path / _DATA)!r} is damaged (its "
                             f"meta.json files do not describe a TensorDict: {err!r}); convert "
                             "it again with download='force'.") from err
        counts = _check_counts(path, marker, data)
        if env_path is not None and env is not None:
            _check_env_metadata_counts(env_path, env, counts)
        return data

    def _env_metadata_of(self, path: Path, marker: dict[str, Any]) -> Path | None:
        """The ``env_metadata.json`` that describes the conversion in ``path`` (whose marker is
        ``marker``): a flat conversion's own; for a split, the flat conversion's
        (:attr:`metadata_path`) while that is the conversion the split was made from, else
        ``None`` (the flat one was deleted: the split stands on its own)."""
        if not marker.get("split_trajs"):
            return path / _ENV_METADATA
        flat = self._conversion(self.data_path_root)
        if flat is None or flat.get("conversion") != marker.get("conversion"):
            return None
        return self.data_path_root / _ENV_METADATA

    @staticmethod
    def _read_metadata(path: Path, raw: bool = False) -> dict[str, Any]:
        meta = read_json(path / _MARKER, "the dataset marker file")
        meta.pop("format", None)
        if raw:
            return meta
        for name in _INTERNAL:
            meta.pop(name, None)
        from minari.serialization import deserialize_space

        for name in ("observation_space", "action_space"):
            if meta.get(name) is not None:
                try:
                    meta[name] = deserialize_space(meta[name])
                except (KeyError, ValueError, TypeError, AttributeError) as err:  # (json too)
                    raise ValueError(f"{name} in the dataset marker file "
                                     f"{str(path / _MARKER)!r} is damaged ({err!r}); convert "
                                     "the dataset again with download='force'.") from err
        return meta


def _check_counts(path: Path, marker: dict[str, Any], data: Any) -> dict[str, tuple[int, str]]:
    """``ValueError`` naming the marker file unless the counts it declares are those of
    ``data``, the conversion in ``path``: ``total_steps`` its rows (a split: its real steps,
    ``mask``), ``total_episodes`` its episodes (a split: its rows) and the episodes without
    steps the conversion skipped (``empty_episodes``; conversions without that entry: at
    least its episodes), a split's ``max_len`` its padded length. Reads the ``episode``
    (flat) or ``mask`` (split) entry only.

    Returns ``total_steps`` and ``total_episodes``, each as its value (checked) and what the
    data holds, in words (for :func:`_check_env_metadata_counts`)."""
    where = str(path / _MARKER)
    split = bool(marker.get("split_trajs"))

    def refuse(what: str) -> ValueError:
        return ValueError(f"the dataset marker file {where!r} is damaged: {what}; remove the "
                          "dataset (or pass download='force') to convert it again.")

    def declared(name: str) -> int:
        value = marker.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise refuse(f"its {name} is {value!r}, not a count")
        return value

    total_steps, total_episodes = declared("total_steps"), declared("total_episodes")
    empty = marker.get("empty_episodes")
    if empty is not None:
        empty = declared("empty_episodes")
    entry = "mask" if split else "episode"
    column = data.get(entry, None) if data.batch_dims == (2 if split else 1) else None
    if not isinstance(column, torch.Tensor):
        raise refuse(f"the data under {str(path / _DATA)!r} has no {entry!r} entry to count its "
                     "steps and episodes by")
    if split:
        episodes, max_len = data.batch_size
        steps = int(column.sum())
        if marker.get("max_len") != max_len:
            raise refuse(f"it declares max_len = {marker.get('max_len')!r}, but the data under "
                         f"{str(path / _DATA)!r} holds episodes padded to {max_len} steps")
    else:
        steps = data.batch_size[0]
        episodes = int((column[1:] != column[:-1]).sum()) + 1 if steps else 0
    if total_steps != steps:
        raise refuse(f"it declares total_steps = {total_steps}, but the data under "
                     f"{str(path / _DATA)!r} holds {steps} steps")
    # (without empty_episodes, a conversion by an earlier version: it may have skipped some)
    fits = total_episodes >= episodes if empty is None else total_episodes == episodes + empty
    skipped = f" and {empty} without steps" if empty else ""
    if not fits:
        raise refuse(f"it declares total_episodes = {total_episodes}, but the data under "
                     f"{str(path / _DATA)!r} holds {episodes} episodes{skipped}")
    if empty is None and total_episodes > episodes:  # (skipped by an earlier version)
        skipped = f" and {total_episodes - episodes} without steps"
    held = f"the data under {str(path / _DATA)!r} holds"
    return {"total_steps": (steps, f"{held} {steps} steps"),
            "total_episodes": (total_episodes, f"{held} {episodes} episodes{skipped}")}


def _check_env_metadata_counts(path: Path, env: dict[str, Any],
                               counts: dict[str, tuple[int, str]]) -> None:
    """``ValueError`` naming the environment metadata file ``path`` and the field unless the
    counts ``env`` (its contents) declares, ``total_steps`` and ``total_episodes`` (the Minari
    spec's, episodes without steps included), are ``counts``: those :func:`_check_counts`
    found in the data. ``metadata_path`` hands the file to TorchRL code, which reads them."""
    for name, (value, held) in counts.items():
        declared = env.get(name)
        if isinstance(declared, bool) or not isinstance(declared, int):
            what = f"its {name} is {declared!r}, not a count" if name in env \
                else f"it has no {name} entry"
        elif declared != value:
            what = f"it declares {name} = {declared}, but {held}"
        else:
            continue
        raise ValueError(f"the environment metadata file {str(path)!r} is damaged: {what}; "
                         "nothing was loaded. Remove the dataset (or pass download='force') "
                         "to convert it again.")


def _check_leaf_shapes(data: Any) -> None:
    """``ValueError`` naming the entry unless every leaf of ``data`` starts with its batch
    size (``load_memmap`` takes a ``meta.json`` whose shapes were edited to the same number of
    bytes, and the storage built on it then fails with a bare batch-size error)."""
    batch = tuple(data.batch_size)
    for key, value in data.items(include_nested=True, leaves_only=True):
        if tuple(value.shape[:len(batch)]) != batch:
            raise ValueError(f"entry {key!r} has shape {tuple(value.shape)}, which does not "
                             f"start with the data's batch size {batch}")
