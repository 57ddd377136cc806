"""``load_dataset`` and ``register_dataset``: datasets named by ``"<prefix>:<dataset id>"``.

The registry maps a source prefix (``"minari"``) to a dataset factory, called as
``factory(dataset_id, **kwargs)``, or to a ``"module:attribute"`` string naming one, imported
when the prefix is first used. It is process-global, as TorchRL's, and guarded by a lock:
threads may register and load at the same time.

Built in: ``"minari"`` (:class:`~tdreplay.datasets.MinariExperienceReplay`). TorchRL's other
built-in prefixes (``"atari"``, ``"atari_dqn"``, ``"d4rl"``, ``"gen_dgrl"``, ``"lerobot"``,
``"openml"``, ``"openx"``, ``"roboset"``, ``"vd4rl"``) are registered too, so that a program
written for TorchRL gets the same errors when it registers them again; loading one raises a
``NotImplementedError`` saying that tdreplay has no such dataset class (register a factory of
your own with ``replace=True`` to serve one).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from tdreplay.core.utils import check_flag

__all__ = ["DatasetFactory", "DatasetFactorySpec", "load_dataset", "register_dataset"]

#: a dataset factory: ``factory(dataset_id, **kwargs) -> dataset``
DatasetFactory = Callable[..., Any]
#: a dataset factory, or a ``"module:attribute"`` string naming one
DatasetFactorySpec = str | Callable[..., Any]

_LOCK = threading.Lock()
_REGISTRY: dict[str, DatasetFactorySpec] = {}


class _NotInTdreplay:
    """The factory of a TorchRL built-in prefix whose dataset class tdreplay does not have."""

    def __init__(self, prefix: str, class_name: str) -> None:
        self.prefix = prefix
        self.class_name = class_name

    def __call__(self, dataset_id: str, **kwargs: Any) -> Any:
        what = f"{self.prefix}:{dataset_id}"
        raise NotImplementedError(
            f"cannot load {what!r}: tdreplay has no {self.class_name} "
            f"(TorchRL's torchrl.data.datasets.{self.class_name}, which the {self.prefix!r} "
            f"prefix names). tdreplay's datasets: {_available()}. Use TorchRL for this dataset, "
            f"or serve the prefix with register_dataset({self.prefix!r}, factory, "
            "replace=True).")

    def __repr__(self) -> str:
        return f"<no {self.class_name} in tdreplay>"


def _normalize_prefix(prefix: Any, name: str = "prefix") -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"{name} must be a str, got {type(prefix).__name__}.")
    normalized = prefix.lower().strip()
    if not normalized or ":" in normalized:
        raise ValueError(f"Dataset source prefixes must be non-empty strings without ':'. "
                         f"Got {prefix!r} ({name}).")
    return normalized


def _available() -> tuple[str, ...]:
    """The registered prefixes that load a dataset (those tdreplay or the user serves)."""
    with _LOCK:
        return tuple(sorted(p for p, f in _REGISTRY.items() if not isinstance(f, _NotInTdreplay)))


def _describe_prefixes() -> str:
    with _LOCK:
        absent = tuple(sorted(p for p, f in _REGISTRY.items() if isinstance(f, _NotInTdreplay)))
    text = f"Supported prefixes: {_available()}."
    if absent:
        text += f" TorchRL's {absent} name datasets tdreplay has no class for."
    return text


def register_dataset(prefix: str, dataset: DatasetFactorySpec, *, replace: bool = False) -> None:
    """Register a dataset factory for :func:`load_dataset`, as TorchRL's ``register_dataset``.

    The prefix can then be used in ids of the form ``"<prefix>:<dataset-id>"``; the factory
    is called as ``dataset(dataset_id, **kwargs)``. Prefixes are case-insensitive (stored
    lower-case, surrounding spaces stripped).

    Parameters
    ----------
    prefix : str
        The source prefix, before the ``":"`` of an id: non-empty, without ``":"``.
    dataset : callable or str
        The dataset factory (e.g. a dataset class), or an import string
        ``"module:attribute"`` naming it, imported when the prefix is first loaded.
    replace : bool
        Replace an existing registration (otherwise a registered prefix raises ``KeyError``).

    Raises
    ------
    KeyError
        ``prefix`` is registered already and ``replace`` is ``False``.
    ValueError
        ``prefix`` is empty or holds ``":"``; a string ``dataset`` is not ``"module:attribute"``.
    TypeError
        ``prefix`` is not a str, ``dataset`` neither callable nor a str, ``replace`` not a bool.

    Examples
    --------
    >>> class ToyDataset:
    ...     def __init__(self, dataset_id, **kwargs):
    ...         self.dataset_id, self.kwargs = dataset_id, kwargs
    >>> register_dataset("toy", ToyDataset, replace=True)
    >>> data = load_dataset("toy:example", batch_size=4)
    >>> data.dataset_id, data.kwargs
    ('example', {'batch_size': 4})
    >>> register_dataset("toy", ToyDataset)
    Traceback (most recent call last):
    ...
    KeyError: "Dataset source 'toy' is already registered. Pass replace=True to overwrite it."
    >>> register_dataset("fractions", "fractions:Fraction", replace=True)  # imported when used
    >>> load_dataset("fractions:3/4")
    Fraction(3, 4)
    """
    normalized = _normalize_prefix(prefix)
    replace = check_flag(replace, "replace")
    if isinstance(dataset, str):
        module_name, _, attr_name = dataset.partition(":")
        if not module_name or not attr_name:
            raise ValueError(f"String dataset factories must use the 'module:attribute' format; "
                             f"got dataset={dataset!r}.")
    elif not callable(dataset):
        raise TypeError("dataset must be a callable dataset factory or a 'module:attribute' "
                        f"string, got {type(dataset).__name__}.")
    with _LOCK:
        if normalized in _REGISTRY and not replace:
            raise KeyError(f"Dataset source {normalized!r} is already registered. "
                           "Pass replace=True to overwrite it.")
        _REGISTRY[normalized] = dataset


def _resolve(prefix: str, spec: str) -> DatasetFactory:
    """The factory a ``"module:attribute"`` string names; errors name the prefix and string."""
    module_name, _, attr_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise type(err)(f"dataset source {prefix!r} is registered as {spec!r}, whose module "
                        f"cannot be imported: {err}", name=err.name, path=err.path) from err
    try:
        factory = getattr(module, attr_name)
    except AttributeError as err:
        raise AttributeError(f"dataset source {prefix!r} is registered as {spec!r}, but module "
                             f"{module_name!r} has no attribute {attr_name!r}.") from err
    if not callable(factory):
        raise TypeError(f"dataset source {prefix!r} is registered as {spec!r}, which is a "
                        f"{type(factory).__name__}, not a callable dataset factory.")
    return factory


def load_dataset(dataset_id: str, **kwargs: Any) -> Any:
    """Build the dataset a prefixed id names, as TorchRL's ``load_dataset``.

    ``"<prefix>:<name>"`` is split at its first ``":"``: the factory registered for
    ``prefix`` (case-insensitive) is called as ``factory(name, **kwargs)``. ``"minari"``
    builds a :class:`~tdreplay.datasets.MinariExperienceReplay`; TorchRL's other built-in
    prefixes (``"d4rl"``, ``"atari"``, ``"openx"``, ...) raise ``NotImplementedError``: tdreplay
    has no such dataset class. More prefixes are added with :func:`register_dataset`.

    Parameters
    ----------
    dataset_id : str
        A prefixed id, e.g. ``"minari:mujoco/hopper/expert-v0"``.
    **kwargs
        Forwarded to the factory (for Minari: ``batch_size``, ``root``, ``download``, ...).

    Returns
    -------
    The dataset the factory builds.

    Raises
    ------
    ValueError
        ``dataset_id`` has no prefix, or an unknown one (the message lists the supported ones).
    NotImplementedError
        The prefix is one of TorchRL's whose dataset class tdreplay does not have.
    TypeError
        ``dataset_id`` is not a str.

    Examples
    --------
    A Minari dataset converted earlier under ``root`` (``download=False``: never fetched):

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     load_dataset("minari:cartpole/none-v0", batch_size=8, root=root,
    ...                  download=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: the Minari dataset 'cartpole/none-v0' is not converted under root: ...
    >>> load_dataset("d4rl:halfcheetah-medium-v2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    NotImplementedError: cannot load 'd4rl:halfcheetah-medium-v2': tdreplay has no D4RL...
    >>> load_dataset("hopper-v2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: dataset_id must be prefixed with a source identifier (e.g. 'minari:...'). ...
    """
    if not isinstance(dataset_id, str):
        raise TypeError(f"dataset_id must be a str '<prefix>:<name>', got "
                        f"{type(dataset_id).__name__}.")
    if ":" not in dataset_id:
        raise ValueError(f"dataset_id must be prefixed with a source identifier (e.g. "
                         f"'minari:...'). Got: {dataset_id!r}. {_describe_prefixes()}")
    raw_prefix, name = dataset_id.split(":", 1)
    try:
        prefix = _normalize_prefix(raw_prefix)
    except ValueError:
        raise ValueError(f"dataset_id {dataset_id!r} has an empty source prefix before ':'. "
                         f"{_describe_prefixes()}") from None
    with _LOCK:
        spec = _REGISTRY.get(prefix)
    if spec is None:
        raise ValueError(f"Unknown dataset source {prefix!r} (dataset_id={dataset_id!r}). "
                         f"{_describe_prefixes()} Add one with register_dataset.")
    factory = _resolve(prefix, spec) if isinstance(spec, str) else spec
    return factory(name, **kwargs)


register_dataset("minari", "tdreplay.datasets.minari_data:MinariExperienceReplay")
for _prefix, _class_name in (
    ("atari", "AtariDQNExperienceReplay"),
    ("atari_dqn", "AtariDQNExperienceReplay"),
    ("d4rl", "D4RLExperienceReplay"),
    ("gen_dgrl", "GenDGRLExperienceReplay"),
    ("lerobot", "LeRobotExperienceReplay"),
    ("openml", "OpenMLExperienceReplay"),
    ("openx", "OpenXExperienceReplay"),
    ("roboset", "RobosetExperienceReplay"),
    ("vd4rl", "VD4RLExperienceReplay"),
):
    register_dataset(_prefix, _NotInTdreplay(_prefix, _class_name))
del _prefix, _class_name
