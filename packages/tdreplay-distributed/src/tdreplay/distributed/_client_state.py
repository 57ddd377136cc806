"""What a sharded buffer's client keeps besides its shards, in its checkpoints: the round-robin
write cursor (which shard the next write goes to) and the state of its generator (which shard
each position of a batch is drawn from). Without them a restored buffer wrote to another shard
and drew other batches than the saved one would have."""

from __future__ import annotations

import base64
from typing import Any

import torch

__all__ = ["check_client_state", "client_state", "restore_client_state"]


def client_state(cursor: int, generator: torch.Generator | None) -> dict[str, Any]:
    """``{"cursor": int, "generator": str | None}`` (the generator's state, base64), plain
    JSON values.

    >>> g = torch.Generator().manual_seed(0)
    >>> state = client_state(3, g)
    >>> state["cursor"], isinstance(state["generator"], str)
    (3, True)
    """
    saved = None
    if generator is not None:
        saved = base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")
    return {"cursor": int(cursor), "generator": saved}


def _generator_state(saved: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(saved, validate=True)), dtype=torch.uint8)


def check_client_state(state: Any, num_shards: int) -> None:
    """``ValueError`` unless ``state`` is a :func:`client_state` this client can load (a cursor
    below ``num_shards``, a generator state a CPU generator takes). Changes nothing."""
    if not isinstance(state, dict) or set(state) != {"cursor", "generator"}:
        raise ValueError(f"the client state must be a dict of 'cursor' and 'generator', got "
                         f"{state!r:.200}.")
    cursor = state["cursor"]
    if isinstance(cursor, bool) or not isinstance(cursor, int) or not 0 <= cursor <= num_shards:
        raise ValueError(f"the client state's cursor must be an int in [0, {num_shards}], got "
                         f"{cursor!r}.")
    saved = state["generator"]
    if saved is None:
        return
    try:
        torch.Generator().set_state(_generator_state(saved))
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"the client state's generator state is damaged: {err}") from err


def restore_client_state(state: dict[str, Any], generator: torch.Generator | None) -> int:
    """Set ``generator`` to the saved state (when both have one: a buffer built without a
    generator draws from torch's global one, as the saved buffer may not have) and return the
    saved cursor. ``state`` was checked by :func:`check_client_state`.

    >>> g = torch.Generator().manual_seed(0)
    >>> state = client_state(1, g)
    >>> first = torch.rand(2, generator=g)
    >>> restore_client_state(state, g)
    1
    >>> torch.equal(torch.rand(2, generator=g), first)
    True
    """
    if generator is not None and state["generator"] is not None:
        generator.set_state(_generator_state(state["generator"]))
    return int(state["cursor"])
