"""Whole-buffer reads, in-place edits and queries of the buffer a ``RayReplayBuffer`` serves.

:class:`RemoteEditsMixin` forwards ``read_all_in_order``, ``write_all``, ``set_``,
``set_at_``, ``update_`` and ``query`` (TorchRL's ``ReplayBuffer`` methods, whose signatures
they keep) to the buffer in the actor, each in one actor call: an edit is applied whole or not
at all, and a bad one raises its own error and changes nothing. What comes back (rows,
trajectories) is a copy owned by the caller, never a view of the actor's storage: changing it
changes nothing remotely until it is written back (``write_all``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

from tensordict import is_tensor_collection

from tdreplay.core.query import Trajectory, check_predicate
from tdreplay.core.utils import check_flag

from ._wire import pack, unpack
from .client import ActorClient

__all__ = ["RemoteEditsMixin", "check_end"]

SelfT = TypeVar("SelfT", bound="RemoteEditsMixin")


def check_end(end: Any, method: str) -> int | None:
    """``end`` as an int (``None`` kept); ``TypeError`` naming it and ``method`` for anything
    that is not an integer (a bool included)."""
    if end is None:
        return None
    if not isinstance(end, bool):
        try:
            return operator.index(end)
        except TypeError:
            pass
    raise TypeError(f"{method}: end must be an int (a number of leading rows) or None, got "
                    f"{end!r}.")


class RemoteEditsMixin:
    """The served buffer's whole-buffer reads, in-place edits and ``query`` (mixed into
    ``RayReplayBuffer``)."""

    _client: ActorClient

    def _edit(self, method: str, *args: Any, **kwargs: Any) -> None:
        self._client.drop_prefetched()  # (drawn before the edit)
        self._client.call("edit", method, pack((args, kwargs)))

    def read_all_in_order(self, end: int | None = None) -> Any:
        """The stored rows in physical (storage) order, ``rb[:end]`` (all of them by default),
        as the served buffer's ``read_all_in_order``; a copy owned by the caller.

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 4))
        >>> _ = rb.extend(torch.arange(6))  # rows 0 and 1 wrap around
        >>> rb.read_all_in_order().tolist(), rb.read_all_in_order(2).tolist()
        ([4, 5, 2, 3], [4, 5])
        >>> rb.close()
        """
        end = check_end(end, "read_all_in_order")
        return unpack(self._client.call("read_all_in_order", end), copy=True)

    def write_all(self, data: Any, end: int | None = None) -> None:
        """Write ``data`` back in physical order, ``rb[:end] = data``, as the served buffer's
        ``write_all`` (``end``: the leading size of ``data`` by default). Batches this client
        drew ahead (``prefetch``) are dropped.

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 4))
        >>> _ = rb.extend(torch.arange(4))
        >>> data = rb.read_all_in_order()
        >>> rb.write_all(data * 10)
        >>> rb.read_all_in_order().tolist()
        [0, 10, 20, 30]
        >>> rb.close()
        """
        self._edit("write_all", data, check_end(end, "write_all"))

    def set_(self: SelfT, key: Any, value: Any) -> SelfT:
        """Set entry ``key`` of every written row in place (the served buffer's ``set_``;
        needs a tensor storage); returns this buffer.

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import TensorDictReplayBuffer
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 4),
        ...                      replay_buffer_cls=TensorDictReplayBuffer)
        >>> _ = rb.extend(TensorDict({"x": torch.zeros(3)}, [3]))
        >>> rb.set_("x", torch.tensor([1.0, 2.0, 3.0]))[:]["x"].tolist()
        [1.0, 2.0, 3.0]
        >>> _ = rb.set_at_("x", torch.tensor([9.0]), torch.tensor([1]))
        >>> _ = rb.update_({"x": rb[:]["x"] * 2})
        >>> rb[:]["x"].tolist()
        [2.0, 18.0, 6.0]
        >>> rb.close()
        """
        self._edit("set_", key, value)
        return self

    def set_at_(self: SelfT, key: Any, value: Any, index: Any) -> SelfT:
        """Set entry ``key`` at rows ``index`` in place (the served buffer's ``set_at_``);
        returns this buffer. See :meth:`set_` for an example."""
        self._edit("set_at_", key, value, index)
        return self

    def update_(self: SelfT, input_dict_or_td: Any, clone: bool = False, *,
                keys_to_update: Any = None) -> SelfT:
        """Update the written rows in place from a dict or TensorDict of entries (the served
        buffer's ``update_``: ``keys_to_update`` limits the entries written); returns this
        buffer. See :meth:`set_` for an example.

        Raises
        ------
        TypeError
            ``input_dict_or_td`` is not a dict or a TensorDict (nothing is sent).
        """
        if not (isinstance(input_dict_or_td, dict) or is_tensor_collection(input_dict_or_td)):
            raise TypeError(f"update_: input_dict_or_td must be a dict or a TensorDict, got "
                            f"{type(input_dict_or_td).__name__}.")
        clone = check_flag(clone, "clone")
        self._edit("update_", input_dict_or_td, clone, keys_to_update=keys_to_update)
        return self

    def query(self, predicate: Callable[[Trajectory], bool] | None = None, *,
              trajectory_key: Any = None) -> list[Trajectory]:
        """The stored trajectories (oldest first) for which ``predicate`` holds, as the served
        buffer's ``query``; copies owned by the caller, not views of the storage.

        ``predicate`` is pickled to the actor (by Ray's cloudpickle: a ``traj`` expression,
        a lambda or a function the actor can import) and runs there, so only the matching
        trajectories travel back; ``None`` returns every trajectory (the whole buffer).

        Examples
        --------
        >>> from functools import partial
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tdreplay.core import TensorDictReplayBuffer
        >>> from tdreplay.core.query import traj
        >>> from tdreplay.distributed import RayReplayBuffer
        >>> from tdreplay.storages import LazyTensorStorage
        >>> rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 10),
        ...                      replay_buffer_cls=TensorDictReplayBuffer)
        >>> _ = rb.extend(TensorDict({"episode": torch.tensor([0, 0, 0, 1, 1]),
        ...                           "next": {"reward": torch.ones(5, 1)}}, [5]))
        >>> [t.length for t in rb.query()], [t.length for t in rb.query(traj.length < 3)]
        ([3, 2], [2])
        >>> rb.close()
        """
        check_predicate(predicate)
        found: list[Trajectory] = unpack(self._client.call("query", predicate, trajectory_key),
                                          copy=True)
        return found
