"""``RemoteTensorDictReplayBuffer``: a TensorDict buffer served over ``torch.distributed.rpc``.

TorchRL's class of the same name (``torchrl.data.RemoteTensorDictReplayBuffer``): a
:class:`~tdreplay.core.TensorDictReplayBuffer` whose public methods also accept, in place of
the buffer, the ``RRef`` that ``rpc.remote`` returned for it, so that another RPC worker calls
them with ``rpc.rpc_sync(rref.owner(), Buffer.sample, args=(rref, 32))``. Called on the buffer
itself they are the buffer's own. It uses neither Ray nor anything of torch.distributed
beyond the ``RRef`` type.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tdreplay.core import TensorDictReplayBuffer

__all__ = ["RemoteTensorDictReplayBuffer"]


def _rref_type() -> Any:
    import torch.distributed.rpc as rpc

    return rpc.PyRRef if rpc.is_available() else None


def local_value(buffer: Any) -> Any:
    """``buffer`` itself, or the buffer an RRef owned by this worker refers to.

    Examples
    --------
    >>> rb = RemoteTensorDictReplayBuffer()
    >>> local_value(rb) is rb
    True
    """
    rref = _rref_type()
    if rref is not None and isinstance(buffer, rref):
        return buffer.local_value()
    return buffer


def _on_local_value(name: str) -> Callable[..., Any]:
    """TensorDictReplayBuffer's method ``name``, called on :func:`local_value` of ``self``.

    Named ``RemoteTensorDictReplayBuffer.<name>`` in this module, so that RPC pickles it by
    reference to this class (the inherited method would be pickled as the base class's, which
    does not accept an RRef).
    """
    method = getattr(TensorDictReplayBuffer, name)

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return method(local_value(self), *args, **kwargs)

    call.__module__ = __name__
    call.__qualname__ = f"RemoteTensorDictReplayBuffer.{name}"
    return call


class RemoteTensorDictReplayBuffer(TensorDictReplayBuffer):
    """A :class:`~tdreplay.core.TensorDictReplayBuffer` usable as an RPC remote, as TorchRL's.

    Build it on the worker that holds the data with ``rpc.remote(worker, cls, args=...)``
    (a subclass fixes the arguments, see the example); other workers then call its methods
    with the returned ``RRef`` in place of the buffer: ``rpc.rpc_sync(rref.owner(),
    cls.add, args=(rref, td))``. ``add``, ``extend``, ``sample``, ``update_priority``,
    ``update_tensordict_priority``, ``empty``, ``dumps`` / ``loads`` and ``state_dict`` /
    ``load_state_dict`` accept the RRef. Called locally the buffer is a
    :class:`~tdreplay.core.TensorDictReplayBuffer` with the same arguments.

    For buffers shared by processes on a Ray cluster, see :class:`RayReplayBuffer`.

    Examples
    --------
    Locally it is a TensorDict buffer:

    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.core import ListStorage
    >>> rb = RemoteTensorDictReplayBuffer(storage=ListStorage(10), batch_size=2)
    >>> rb.add(TensorDict({"a": torch.tensor([3])}, []))
    0
    >>> rb.sample()["a"].shape
    torch.Size([2, 1])

    Over RPC (two workers, ``rpc.init_rpc`` done on both; not run here):

    >>> class Node(RemoteTensorDictReplayBuffer):
    ...     def __init__(self, capacity):
    ...         super().__init__(storage=ListStorage(capacity))
    >>> import torch.distributed.rpc as rpc
    >>> rref = rpc.remote("BUFFER", Node, args=(1000,))  # doctest: +SKIP
    >>> rpc.rpc_sync(rref.owner(), Node.add, args=(rref, td))  # doctest: +SKIP
    0
    >>> rpc.rpc_sync(rref.owner(), Node.sample, args=(rref, 1))  # doctest: +SKIP
    """

    add = _on_local_value("add")
    extend = _on_local_value("extend")

    def sample(self, batch_size: int | None = None,  # type: ignore[override]  # TorchRL's order
               include_info: bool | None = None, return_info: bool = False) -> Any:
        """:meth:`TensorDictReplayBuffer.sample <tdreplay.core.TensorDictReplayBuffer.sample>`
        on :func:`local_value` of the buffer, with TorchRL's order for this class:
        ``(batch_size, include_info, return_info)`` (``rb.sample(3, True)``: ``include_info``,
        as TorchRL's; on other buffers the second is ``return_info``).

        Examples
        --------
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import ListStorage
        >>> rb = RemoteTensorDictReplayBuffer(storage=ListStorage(4))
        >>> _ = rb.extend(TensorDict({"a": torch.arange(3)}, [3]))
        >>> batch, info = rb.sample(2, None, True)  # return_info third, as TorchRL's
        >>> batch.batch_size, sorted(info)
        (torch.Size([2]), ['index'])
        """
        return TensorDictReplayBuffer.sample(local_value(self), batch_size,
                                             include_info=include_info,
                                             return_info=return_info)

    update_priority = _on_local_value("update_priority")
    update_tensordict_priority = _on_local_value("update_tensordict_priority")
    empty = _on_local_value("empty")
    dumps = _on_local_value("dumps")
    loads = _on_local_value("loads")
    state_dict = _on_local_value("state_dict")
    load_state_dict = _on_local_value("load_state_dict")
