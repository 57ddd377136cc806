"""What :class:`~tdreplay.distributed.ShardedReplayBuffer` computes on the client side, as
functions: global slots <-> (shard, local slot), checked priority updates, and the merge of
the batches drawn from several shards into one (module docstring of :mod:`.sharded`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensor_collection

from tdreplay.core import CheckpointError
from tdreplay.core.checkpoint import CheckpointNotFoundError
from tdreplay.core.priority_shapes import priority_for_index
from tdreplay.core.utils import take_rows

from ._client_state import check_client_state
from ._wire import pack
from .checkpoints import join_location, read_text, write_text

__all__ = ["PRIORITY_WEIGHT_KEY", "check_every_shard", "check_manifest", "check_unwritten",
           "ask_counts", "concat", "draw_shards", "head", "known_total", "merge_samples",
           "priority_for_slots", "shard_name", "split_priority_rows",
           "split_priority_update", "split_slots", "to_global",
           "write_manifest"]

PRIORITY_WEIGHT_KEY = "priority_weight"
MANIFEST = "sharded.json"


def shard_name(name: str, shard: int) -> str:
    """The Ray name of shard ``shard`` of the sharded buffer ``name``."""
    return f"{name}/shard-{shard}"


def concat(parts: Sequence[Any]) -> Any:
    """Join batches along their first dimension (tensors, TensorDicts, lists, tuples, dicts)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, torch.Tensor) or is_tensor_collection(first):
        return torch.cat(list(parts), 0)
    if isinstance(first, list):
        return [item for part in parts for item in part]
    if isinstance(first, tuple):
        return tuple(concat([part[i] for part in parts]) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: concat([part[key] for part in parts]) for key in first}
    raise TypeError(f"cannot join samples of type {type(first).__name__} drawn from several "
                    "shards (expected tensors, TensorDicts, lists, tuples or dicts of them).")


def to_global(offsets: torch.Tensor, shard: int, slots: Any) -> torch.Tensor:
    """Shard ``shard``'s local ``slots`` as global slots (``-1`` entries stay ``-1``)."""
    slots = torch.as_tensor(slots)
    offset = offsets[shard]
    return torch.where(slots >= 0, slots + offset, slots)


def split_slots(index: Any, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``index`` and the shard of each entry (``-1`` entries: shard ``-1``).

    ``offsets``: ``[0, size_0, size_0 + size_1, ...]``. Raises ``IndexError`` for slots outside
    ``[0, offsets[-1])`` (other than ``-1``), ``TypeError`` for non-integers.
    """
    try:
        flat = torch.as_tensor(index).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"index must be integers, got {type(index).__name__}.") from err
    if flat.dtype.is_floating_point or flat.dtype.is_complex or flat.dtype is torch.bool:
        raise TypeError(f"index must hold integers, got dtype {flat.dtype}.")
    flat = flat.to(torch.long)
    max_size = int(offsets[-1])
    bad = (flat < -1) | (flat >= max_size)
    if bool(bad.any()):
        raise IndexError(f"index must lie in [0, {max_size}) (the global slots of the "
                         f"{len(offsets) - 1} shards), got {flat[bad][:5].tolist()}. Nothing "
                         "was updated.")
    shard = torch.bucketize(flat, offsets[1:], right=True)
    return flat, torch.where(flat >= 0, shard, -1)


def _as_priority(priority: Any) -> torch.Tensor:
    """``priority`` as a tensor; ``TypeError`` naming it for what holds no numbers."""
    try:
        return torch.as_tensor(priority)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"priority must be a number, an array or a tensor of real numbers, got "
                        f"{type(priority).__name__} ({err}).") from err


def priority_for_slots(index: Any, priority: Any, n: int) -> torch.Tensor:
    """``priority`` as one value (or row of values) per entry of flat ``index`` (``n``
    entries), checked: real, finite and >= 0, of a shape that matches ``index`` (dims of size
    1 aside), broadcasts to it, or is its shape followed by trailing dims (as a sampler's
    ``update_priority``: never paired in flat order across other shapes)."""
    shape = torch.as_tensor(index).shape
    shaped = priority_for_index(_as_priority(priority), shape)
    priority = shaped.reshape(n, *shaped.shape[len(shape):])
    if priority.dtype is torch.bool or priority.is_complex():
        raise TypeError(f"priority must hold real numbers, got dtype {priority.dtype}.")
    values = priority.double()
    if n and not bool(((values >= 0) & (values < math.inf)).all()):
        raise ValueError("priority must be finite and >= 0. Nothing was updated.")
    return priority


def split_priority_update(index: Any, priority: Any, write_generation: Any,
                          offsets: torch.Tensor
                          ) -> list[tuple[int, torch.Tensor, torch.Tensor, dict[str, Any]]]:
    """``update_priority(index, priority, write_generation=...)`` of global slots as
    ``(shard, local slots, priorities, kwargs)`` per shard concerned, everything checked first.
    """
    flat, shard_of = split_slots(index, offsets)
    n = flat.numel()
    priority = priority_for_slots(index, priority, n)
    generation = None
    if write_generation is not None:
        generation = torch.as_tensor(write_generation).reshape(-1)
        if generation.numel() != n:
            raise ValueError(f"write_generation has {generation.numel()} entries for {n} "
                             "indices.")
    parts = []
    for k in range(len(offsets) - 1):
        mask = shard_of == k
        if not bool(mask.any()):
            continue
        kwargs = {} if generation is None else {"write_generation": generation[mask]}
        parts.append((k, flat[mask] - offsets[k], priority[mask], kwargs))
    return parts


def check_unwritten(parts: Sequence[tuple[int, torch.Tensor, Any, Any]],
                    unwritten: Sequence[Sequence[int]], offsets: torch.Tensor) -> None:
    """Raise ``IndexError`` naming the *global* slots that the shards found unwritten:
    ``unwritten[i]`` lists the local slots of ``parts[i]`` (``(shard, local slots, ...)``)
    that shard refuses. Nothing has changed on any shard when it raises.

    Examples
    --------
    >>> parts = [(0, torch.tensor([1]), None, None), (1, torch.tensor([2, 3]), None, None)]
    >>> check_unwritten(parts, [[], [3]], torch.tensor([0, 4, 8]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    IndexError: index points at unwritten slots [7] (global slots; shard 1 holds local slot ...
    """
    bad: list[int] = []
    where = []
    for (shard, _, _, _), local in zip(parts, unwritten):
        if len(local):
            bad.extend(int(offsets[shard]) + int(slot) for slot in local)
            where.append(f"shard {shard} holds local slot{'s' if len(local) > 1 else ''} "
                         f"{list(local)[:5]} unwritten")
    if bad:
        raise IndexError(f"index points at unwritten slots {bad[:5]} (global slots; "
                         f"{'; '.join(where)}): a priority there would belong to no item. "
                         "Nothing was updated on any shard.")


def check_every_shard(parts: Sequence[tuple[int, torch.Tensor, Any, Any]],
                      ask: Callable[[list[tuple[int, str, tuple[Any, ...]]], str],
                                    list[tuple[int, Any]]],
                      offsets: torch.Tensor) -> list[tuple[int, torch.Tensor, Any, Any]]:
    """Have every shard of ``parts`` (``(shard, local slots, priorities, kwargs)``, as from
    :func:`split_priority_update`) check its part of a priority update, changing nothing
    (``check_priority_update`` on the buffer actor): a shard's error (e.g. a priority that
    overflows with its ``alpha``, a NaN) raises, and unwritten slots raise ``IndexError`` naming
    their global slots (:func:`check_unwritten`). ``ask`` sends ``(shard, method, args)`` calls
    at once and returns ``(shard, result)`` of the shards that answered (one found dead is set
    aside). Returns the parts of the shards that answered: the update sends only those."""
    calls = [(k, "check_priority_update", (pack(local), pack(values)))
             for k, local, values, _ in parts]
    answered = dict(ask(calls, "update_priority")) if calls else {}
    kept = [part for part in parts if part[0] in answered]
    check_unwritten(kept, [answered[part[0]] for part in kept], offsets)
    return kept


def split_priority_rows(data: TensorDictBase, offsets: torch.Tensor
                        ) -> list[tuple[int, TensorDictBase]]:
    """The rows of a priority update (``data`` with a global ``index`` entry) as
    ``(shard, rows with local slots)`` per shard concerned; every slot is checked first."""
    if "index" not in data.keys():
        raise KeyError("update_tensordict_priority needs an 'index' entry in data (samples "
                       "carry one).")
    index = data.get("index")
    if index.ndim == 0 or data.batch_dims == 0:
        data, index = data.unsqueeze(0), index.reshape(1)
    _, slot_shard = split_slots(index, offsets)  # every slot in range
    shard_of = slot_shard.reshape(index.shape[0], -1)[:, 0]  # a row's slots share a shard
    parts = []
    for k in range(len(offsets) - 1):
        rows = (shard_of == k).nonzero().squeeze(-1)
        if not rows.numel():
            continue
        part = data[rows]
        local = part.get("index")
        part.set("index", torch.where(local >= 0, local - offsets[k], local))
        parts.append((k, part))
    return parts


#: One shard's part of a batch: ``(shard, data, info, shard's min p, beta, items drawn, items
#: kept)``; the batch keeps the first ``kept`` of the ``drawn`` items.
Piece = tuple[int, Any, dict[str, Any], float, float | None, int, int]

#: standard deviations of a shard's count a one-round draw asks for above its expected share
MARGIN_SD = 3.0


def known_total(masses: Sequence[Any], live: Sequence[int]) -> float:
    """Sum of the sampling masses of the ``live`` shards, ``nan`` if one of them is not
    known (``masses[k]``: ``(sum, min, len, max)`` or ``None``).

    >>> known_total([(2.0, 1.0, 2, None), None, (3.0, 1.0, 3, None)], [0, 2])
    5.0
    >>> known_total([(2.0, 1.0, 2, None), None], [0, 1])
    nan
    """
    if any(masses[k] is None for k in live):
        return math.nan
    return float(sum(masses[k][0] for k in live))


def ask_counts(batch_size: int, masses: Sequence[Any]) -> list[int]:
    """How many items to ask each shard for, in a one-round draw of ``batch_size`` items:
    ``n q + 3 sqrt(n q (1 - q)) + 2`` (at most ``n``) for a shard of known share ``q`` of the
    mass (``masses[k]``: ``(sum, min, len, max)``), 0 for a shard known empty, and an equal
    share for all when a mass is unknown or all are 0.

    >>> ask_counts(100, [(1.0, 1.0, 1, None), (3.0, 1.0, 3, None), (0.0, 1.0, 0, None)])
    [40, 90, 0]
    >>> ask_counts(100, [None, (3.0, 1.0, 3, None)])
    [67, 67]
    """
    sums = [None if m is None else float(m[0]) for m in masses]
    total = sum(v for v in sums if v is not None)
    if None in sums or not total > 0:
        shares = [1.0 / len(masses)] * len(masses)
    else:
        shares = [float(v) / total for v in sums]  # type: ignore[arg-type]
    asked = []
    for q in shares:
        mean = batch_size * q
        extra = MARGIN_SD * math.sqrt(mean * (1.0 - q)) + 2.0
        asked.append(0 if q == 0 else min(batch_size, math.ceil(mean + extra)))
    return asked


def draw_shards(batch_size: int, masses: Sequence[Any], live: Sequence[int],
                generator: torch.Generator | None, distinct: bool = False) -> torch.Tensor:
    """The shard of each of ``batch_size`` positions, drawn in proportion to the masses of
    the ``live`` shards (others weigh 0); ``RuntimeError`` when they are all empty.

    ``distinct`` (samplers without replacement, whose mass is their number of items): the
    positions take distinct items of the shards together, so no shard is asked for more
    items than it holds (a shard's count is hypergeometric, not multinomial), as one buffer
    draws a batch of distinct items; a batch larger than all the items has one position per
    item (every item once, as one buffer without replacement hands out all its items: a
    shard asked for more than it holds could never fill its count, and the sample failed).

    >>> which = draw_shards(6, [(2.0, 1.0, 2, None), (4.0, 1.0, 4, None)], [0, 1], None,
    ...                     distinct=True)
    >>> torch.bincount(which, minlength=2).tolist()  # every item of both shards
    [2, 4]
    >>> which = draw_shards(9, [(2.0, 1.0, 2, None), (4.0, 1.0, 4, None)], [0, 1], None,
    ...                     distinct=True)
    >>> torch.bincount(which, minlength=2).tolist()  # 6 positions: the 6 items
    [2, 4]
    """
    sums = torch.zeros(len(masses), dtype=torch.float64)
    for k in live:
        if masses[k] is not None:
            sums[k] = float(masses[k][0])
    total = float(sums.sum())
    if not total > 0:
        raise RuntimeError("Cannot sample from an empty storage: no shard holds an item yet, "
                           "extend the buffer first.")
    items = int(total)
    if distinct and items == total:
        items_drawn = _distinct_below(items, min(batch_size, items), generator)
        return torch.bucketize(items_drawn, torch.cumsum(sums, 0).long(), right=True)
    return torch.multinomial(sums / total, batch_size, replacement=True, generator=generator)


def _distinct_below(total: int, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """``n`` distinct integers of ``[0, total)``, uniformly, in random order: the first ``n``
    of a permutation when they are more than half of them, else redrawn until distinct (a
    few rounds: each draw repeats one drawn before with probability below 1/2), then
    shuffled."""
    if 2 * n > total:
        return torch.randperm(total, generator=generator)[:n]
    chosen = torch.randint(total, (n,), generator=generator).unique()
    while chosen.numel() < n:
        more = torch.randint(total, (n - chosen.numel(),), generator=generator)
        chosen = torch.cat([chosen, more]).unique()
    return chosen[torch.randperm(n, generator=generator)]


def head(data: Any, n: int) -> Any:
    """The first ``n`` items of a batch (tensors, TensorDicts, lists, tuples, dicts of them)."""
    if isinstance(data, (tuple, dict)) and not is_tensor_collection(data):
        if isinstance(data, tuple):
            return tuple(head(part, n) for part in data)
        return {key: head(value, n) for key, value in data.items()}
    return data[:n]


def merge_samples(which: torch.Tensor, pieces: Sequence[Piece], global_min: float,
                  offsets: torch.Tensor) -> tuple[Any, dict[str, Any]]:
    """One batch from the shards' draws, in the order of ``which`` (the shard each position
    drew), with global slots and global importance weights.

    ``pieces`` (:data:`Piece`): what each shard drew, in the order of their shards' first
    positions when grouped (several pieces of one shard follow each other). A shard's weights
    ``(p_i / min_k) ** -beta`` become ``(p_i / global_min) ** -beta``, ``global_min`` the
    least ``p`` over all shards (see :mod:`.sharded`).
    """
    pieces = sorted(pieces, key=lambda piece: piece[0])  # stable: a shard's pieces in order
    datas, infos, kept = [], [], []
    for k, data, info, shard_min, beta, drawn, keep in pieces:
        if keep < drawn:
            data = head(data, keep)
            info = {key: head(value, keep) if isinstance(value, torch.Tensor) and value.ndim
                    and value.shape[0] == drawn else value for key, value in info.items()}
        info = dict(info)
        info["index"] = to_global(offsets, k, info["index"])
        weight = info.get(PRIORITY_WEIGHT_KEY)
        if isinstance(weight, torch.Tensor) and beta is not None and shard_min > global_min:
            scale = math.exp(-beta * (math.log(shard_min) - math.log(global_min)))
            info[PRIORITY_WEIGHT_KEY] = (weight.double() * scale).to(weight.dtype)
        if is_tensor_collection(data):
            for key in ("index", PRIORITY_WEIGHT_KEY):
                if key in data.keys() and key in info:
                    data.set(key, info[key].to(data.get(key).dtype).reshape(
                        data.get(key).shape))
        datas.append(data)
        infos.append(info)
        kept.append(keep)
    # rows come grouped by shard; put each at the position that drew its shard
    order = torch.argsort(which, stable=True)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(which.numel())
    merged = datas[0] if len(datas) == 1 else take_rows(concat(datas), inverse)
    merged_info: dict[str, Any] = {}
    for key in infos[0]:
        values = [part[key] for part in infos]
        if all(isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == n
               for v, n in zip(values, kept)):
            merged_info[key] = torch.cat(values, 0).index_select(0, inverse)
        else:
            merged_info[key] = values
    return merged, merged_info


def write_manifest(root: str, num_shards: int, client: dict[str, Any] | None = None) -> None:
    """Write ``root/sharded.json`` (a path: atomically; a URL: one object), after the shards'
    checkpoints; ``client``: the client's state (:mod:`._client_state`)."""
    manifest: dict[str, Any] = {"num_shards": num_shards}
    if client is not None:
        manifest["client"] = client
    write_text(join_location(root, MANIFEST), json.dumps(manifest))


def check_manifest(root: str, num_shards: int) -> dict[str, Any] | None:
    """``CheckpointError`` unless ``root`` (a path or a URL) holds a sharded checkpoint of
    ``num_shards`` (``CheckpointNotFoundError``, a ``FileNotFoundError``: none there); returns
    the client state it holds (``None``: a checkpoint of an earlier version, which saved none)."""
    try:
        manifest = json.loads(read_text(join_location(root, MANIFEST)))
    except FileNotFoundError as err:
        raise CheckpointNotFoundError(f"{root} holds no sharded checkpoint (no {MANIFEST}): "
                                      f"{err}") from err
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{root} holds no readable sharded checkpoint ({MANIFEST}): "
                              f"{err}") from err
    if not isinstance(manifest, dict) or manifest.get("num_shards") != num_shards:
        shards = manifest.get("num_shards") if isinstance(manifest, dict) else None
        raise CheckpointError(f"the checkpoint at {root} has {shards} shards, this buffer "
                              f"{num_shards}.")
    client = manifest.get("client")
    if client is not None:
        try:
            check_client_state(client, num_shards)
        except ValueError as err:
            raise CheckpointError(f"{MANIFEST} at {root}: {err}") from err
    return client
