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


def _leaf_lengths(tree: Any, key: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every leaf of a converted tree: its key (``key.sub``) and shape."""
    if isinstance(tree, dict):
        return [item for name, sub in tree.items()
                for item in _leaf_lengths(sub, f"{key}.{name}")]
    return [(key, tuple(tree.shape))]


def _step_count(entries: dict[str, Any]) -> int:
    """The episode's step count, on which every entry agrees: ``observations`` holds one value
    more than the steps (the reset), ``actions``, ``rewards``, ``terminations`` and
    ``truncations`` one per step. Otherwise a ``ValueError`` naming the entries that disagree
    with most of the others, and the lengths of all of them."""
    implied: list[tuple[str, tuple[int, ...], int | None]] = []  # key, shape, steps it gives
    for name, tree in entries.items():
        extra = 1 if name == "observations" else 0
        for key, shape in _leaf_lengths(tree, name):
            implied.append((key, shape, shape[0] - extra if shape else None))
    counts = [steps for _, _, steps in implied]
    if len(set(counts)) == 1 and counts[0] is not None and counts[0] >= 0:
        return counts[0]

    def expected(key: str, steps: int) -> str:
        return (f"{steps + 1} = steps + 1" if key.startswith("observations")
                else f"{steps}, one per step")

    def length(key: str, shape: tuple[int, ...]) -> str:
        if not shape:
            return f"{key} a scalar"
        return f"{key} {shape[0]}" + (" (= steps + 1)" if key.startswith("observations") else "")

    votes = {steps: counts.count(steps) for steps in counts if steps is not None and steps >= 0}
    best = max(votes.values(), default=0)
    winners = [steps for steps, n in votes.items() if n == best]
    if len(winners) != 1 or best == 1:
        raise ValueError(
            "its entries disagree in length, and no step count is shared by most of them: "
            f"{', '.join(length(key, shape) for key, shape, _ in implied)} (observations hold "
            "one value more than the steps, the other entries one value per step).")
    steps = winners[0]
    odd = "; ".join(
        f"{key!r} has shape {shape}, " + (
            f"{shape[0]} value{'' if shape[0] == 1 else 's'} (expected {expected(key, steps)})"
            if shape else "a scalar")
        for key, shape, n in implied if n != steps)
    agree = ", ".join(length(key, shape) for key, shape, n in implied if n == steps)
    raise ValueError(f"its entries disagree in length: {odd}; the other entries give {steps} "
                     f"step{'' if steps == 1 else 's'} ({agree}).")


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
    observations = _to_tree(episode.observations, "observations", dropped)
    if observations is None:
        raise ValueError("the episode's observations hold no numeric data (text only).")
    actions = _to_tree(episode.actions, "actions", dropped)
    if actions is None:
        raise ValueError("the episode's actions hold no numeric data (text only).")
    values = {"rewards": episode.rewards, "terminations": episode.terminations,
              "truncations": episode.truncations}
    trees = {name: _to_tree(value, name, dropped) for name, value in values.items()}
    for name, tree in trees.items():
        if tree is None or isinstance(tree, dict):
            raise ValueError(f"the episode's {name} hold no numeric array of one value per "
                             f"step (got {type(values[name]).__name__}).")
    steps = _step_count({"observations": observations, "actions": actions, **trees})
    observations = _as_td(observations, steps + 1, "observations")
    flags = {}
    for name, source in (("reward", "rewards"), ("terminated", "terminations"),
                         ("truncated", "truncations")):
        tensor = _as_td(trees[source], steps, source)
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
