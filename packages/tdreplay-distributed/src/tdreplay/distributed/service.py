"""The ``"ray"`` service backend: ``ReplayBuffer(..., service_backend="ray")`` (as TorchRL's).

Registered through the entry point ``ray`` of the group ``tdreplay.service_backends`` (see
:mod:`tdreplay.core.service_backends`): with ``tdreplay-distributed`` installed, any buffer class
built with ``service_backend="ray"`` (or inside ``with service_backend("ray"):``) returns a
:class:`~tdreplay.distributed.RayReplayBuffer` that serves that class, built with the same
arguments, from a Ray actor.

Examples
--------
>>> from functools import partial
>>> import torch
>>> from tdreplay.core import ListStorage, ReplayBuffer
>>> rb = ReplayBuffer(storage=partial(ListStorage, 10), batch_size=2, service_backend="ray",
...                   service_backend_options={"ray_init_config": {"num_cpus": 1}})
>>> type(rb).__name__, rb.service_backend, rb.transport_kind
('RayReplayBuffer', 'ray', 'ray')
>>> rb.extend([torch.tensor(1.0), torch.tensor(2.0)]).tolist()
[0, 1]
>>> rb.close()
"""

from __future__ import annotations

from typing import Any

from .ray_buffer import RayReplayBuffer

__all__ = ["RAY_SERVICE_OPTIONS", "ray_service"]

#: ``service_backend_options`` of the ``"ray"`` backend: TorchRL's (``ray_init_config``,
#: ``remote_config``) and the other options of :class:`RayReplayBuffer`.
RAY_SERVICE_OPTIONS = frozenset({"ray_init_config", "remote_config", "name", "namespace",
                                 "call_timeout", "start_timeout", "checkpoint_path"})


def ray_service(buffer_cls: type, options: dict[str, Any], transport: str,
                transport_options: dict[str, Any], kwargs: dict[str, Any]) -> RayReplayBuffer:
    """A :class:`RayReplayBuffer` serving ``buffer_cls(**kwargs)``.

    ``transport``: ``"auto"`` / ``"ray"`` (data through Ray's object store) or
    ``"distributed"`` (clients over torch.distributed channels, with ``transport_options``
    ``backend`` and ``timeout``: see :mod:`~tdreplay.distributed.transport`); ``options``
    (``service_backend_options``) take the keys of :data:`RAY_SERVICE_OPTIONS`.

    Raises
    ------
    TypeError
        An option that is not one of :data:`RAY_SERVICE_OPTIONS`, or a transport option the
        transport does not take.
    ValueError
        Another transport, or a bad transport option.
    """
    unknown = sorted(set(options) - RAY_SERVICE_OPTIONS)
    if unknown:
        raise TypeError(f"Unexpected Ray replay-buffer service options: {unknown} (accepted: "
                        f"{sorted(RAY_SERVICE_OPTIONS)}).")
    return RayReplayBuffer(replay_buffer_cls=buffer_cls, transport=transport,
                           transport_options=transport_options, **options, **kwargs)
