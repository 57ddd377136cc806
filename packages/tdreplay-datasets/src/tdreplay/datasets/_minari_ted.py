"""Minari episodes in TorchRL's TED layout (one TensorDict row per step)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


def _to_tree(value: Any, key: str, dropped: set[str]) -> Any:
    """Minari data (arrays, dicts, tuples, lists) as tensors / nested dicts of tensors.

    Text (``str``/``bytes`` arrays and lists, ``Text`` spaces) has no tensor form: its key is
    added to ``dropped`` and ``None`` returned.
    """
    if isinstance(value, dict):
        out = {}
        for name, sub in value.items():
            converted = _to_tree(sub, f"{key}.{name}", dropped)
            if converted is not None:
                out[str(name)] = converted
        return out or None
    if isinstance(value, tuple):
        return _to_tree({str(i): sub for i, sub in enumerate(value)}, key, dropped)
    if isinstance(value, torch.Tensor):
        return value
    array = np.asarray(value)
    if array.dtype.kind in "OUSV":
        dropped.add(key)
        return None
    return torch.from_numpy(np.ascontiguousarray(array))


def _as_td(tree: Any, steps: int, key: str) -> torch.Tensor | TensorDict:
    """A converted tree as a tensor or a TensorDict of batch size ``[steps]``."""
    if isinstance(tree, dict):
        return TensorDict({name: _as_td(sub, steps, f"{key}.{name}") for name, sub in tree.items()},
                          batch_size=[steps])
    if tree.ndim == 0 or tree.shape[0] != steps:
        raise ValueError(f"Minari entry {key!r} has shape {tuple(tree.shape)}; expected "
                         f"{steps} entries along its first dimension.")
    return tree


def _pad_front(tree: Any, steps: int) -> Any:
    """Entries with one value per step (no value at reset) padded to ``steps + 1`` with a zero
    value in front, so every info entry has a value at reset and after each step."""
    if isinstance(tree, dict):
        return {name: _pad_front(sub, steps) for name, sub in tree.items()}
    if tree.ndim and tree.shape[0] == steps:
        return torch.cat([torch.zeros_like(tree[:1]), tree])
    return tree


def episode_to_ted(episode: Any, dropped: set[str]) -> TensorDict:
    """One Minari episode (``minari.EpisodeData``) as a TED TensorDict of batch size ``[T]``.

    Step ``t`` holds ``observation`` (observation ``t``), ``action``, ``episode`` (the
    episode's id), ``("next", "observation")`` (observation ``t + 1``), and ``("next",
    "reward" | "terminated" | "truncated" | "done")`` of shape ``[1]``, with ``done =
    terminated | truncated``. Dict (and tuple) observations, actions and infos become nested
    TensorDicts; ``infos`` are recorded at reset and after each step, so ``info`` is the info
    before the step and ``("next", "info")`` the one after it. Every info entry stays there,
    one named ``state`` included (``("info", "state")``), as in TorchRL 0.14, which moves only
    a ``state`` group stored beside ``infos`` in the episode's HDF5 group; Minari 0.5 writes
    none, and its reader would not return one. Keys of text data are added to ``dropped``
    and left out.
    """
    steps = len(episode.rewards)
    observations = _to_tree(episode.observations, "observations", dropped)
    if observations is None:
        raise ValueError("the episode's observations hold no numeric data (text only).")
    observations = _as_td(observations, steps + 1, "observations")
    actions = _to_tree(episode.actions, "actions", dropped)
    if actions is None:
        raise ValueError("the episode's actions hold no numeric data (text only).")
    flags = {}
    for name, values in (("reward", episode.rewards), ("terminated", episode.terminations),
                         ("truncated", episode.truncations)):
        tensor = _as_td(_to_tree(values, name, dropped), steps, name)
        flags[name] = tensor.reshape(steps, 1)
    flags["terminated"] = flags["terminated"].to(torch.bool)
    flags["truncated"] = flags["truncated"].to(torch.bool)
    flags["done"] = flags["terminated"] | flags["truncated"]

    td = TensorDict(
        {
            "observation": observations[:-1],
            "action": _as_td(actions, steps, "actions"),
            "episode": torch.full((steps,), int(episode.id), dtype=torch.int64),
            "next": TensorDict({"observation": observations[1:], **flags}, batch_size=[steps]),
        },
        batch_size=[steps],
    )
    infos = _to_tree(episode.infos or {}, "infos", dropped)
    if infos:
        info_td = _as_td(_pad_front(infos, steps), steps + 1, "infos")
        if not isinstance(info_td, TensorDict):
            raise TypeError(f"episode infos must be a dict of entries, got {type(infos).__name__}.")
        if not info_td.is_empty():
            td.set("info", info_td[:-1])
            td.set(("next", "info"), info_td[1:])
    return td
