"""How data crosses between a client and a buffer actor: tensor bytes out of band, no copies.

Ray pickles a ``torch.Tensor`` through torch's own reducer, which serialises every storage into
a byte string (``torch.save``): the bytes are copied into that string, the string into Ray's
message, and back out on the other side. :func:`pack` instead pickles the structure (a
TensorDict, a tensor, a list or tuple of them, any picklable object) with protocol 5 and
hands every CPU tensor's memory over as an out-of-band buffer: a flat ``uint8`` numpy view of
the tensor, which Ray writes once into its object store (numpy arrays are Ray's zero-copy
type). :func:`unpack` rebuilds each tensor as a view of the buffer it receives, so a reader in
the object store's process gets tensors backed by the shared-memory object, without a copy.

The only copies along ``extend`` are therefore the one into the object store and the storage's
own write of the rows; along ``sample``, the storage's gather of the rows and the one into the
object store. Non-contiguous tensors are made contiguous first (one copy, as any transport
would need); tensors off the CPU travel through torch's reducer.
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["Packed", "pack", "sendable_batch", "unpack"]


class Packed:
    """A pickled structure (``header``) and the raw bytes of its tensors (``buffers``).

    ``buffers`` are ``uint8`` numpy arrays: Ray moves them through its object store without
    pickling their contents.
    """

    __slots__ = ("header", "buffers")

    def __init__(self, header: bytes, buffers: list[np.ndarray]) -> None:
        self.header = header
        self.buffers = buffers

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data carried out of band."""
        return sum(b.nbytes for b in self.buffers)

    def __getstate__(self) -> tuple[bytes, list[np.ndarray]]:
        return self.header, self.buffers

    def __setstate__(self, state: tuple[bytes, list[np.ndarray]]) -> None:
        self.header, self.buffers = state

    def __repr__(self) -> str:
        return f"Packed(header={len(self.header)} bytes, buffers={len(self.buffers)}, " \
               f"nbytes={self.nbytes})"


def _rebuild_tensor(buffer: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` viewing ``buffer`` (no copy)."""
    # buffers received from Ray are flagged read-only; the tensor views them all the same (the
    # warning torch gives about it is silenced once per message, in unpack)
    flat = torch.from_numpy(np.frombuffer(buffer, dtype=np.uint8))
    return flat.view(dtype).reshape(shape)


class _TensorPickler(pickle.Pickler):
    """Pickles CPU strided tensors as an out-of-band view of their bytes."""

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor) or obj.device.type != "cpu" \
                or obj.layout is not torch.strided or obj.is_quantized:
            return NotImplemented
        tensor = obj.detach()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy()
        buffer = pickle.PickleBuffer(raw)  # type: ignore[arg-type]  # ndarray exports a buffer
        return _rebuild_tensor, (buffer, tensor.dtype, tuple(tensor.shape))


def pack(obj: Any) -> Packed:
    """Pickle ``obj`` with the bytes of its CPU tensors kept out of band.

    Examples
    --------
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.arange(6.0).reshape(3, 2)}, [3])
    >>> packed = pack(td)
    >>> packed.nbytes  # the 24 bytes of "obs" travel outside the pickle
    24
    >>> unpack(packed)["obs"][2].tolist()
    [4.0, 5.0]
    """
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    try:
        _TensorPickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as err:  # (a lambda, a lock, ...)
        raise TypeError(f"cannot send a {type(obj).__name__} to a remote buffer: it does not "
                        f"pickle ({err}).") from err
    return Packed(out.getvalue(), [np.frombuffer(b.raw(), dtype=np.uint8) for b in buffers])


def sendable_batch(data: Any) -> Any:
    """``data`` as a remote buffer's ``extend`` can send it: an iterator (a generator) becomes
    the list of its items, as a local buffer takes any iterable; anything else as it is.

    Examples
    --------
    >>> sendable_batch(i * i for i in range(3))
    [0, 1, 4]
    >>> sendable_batch(range(3))
    range(0, 3)
    """
    return list(data) if isinstance(data, Iterator) else data


def unpack(obj: Any, *, copy: bool = False) -> Any:
    """Rebuild what :func:`pack` packed; tensors view the received buffers.

    With ``copy=True`` the buffers are copied first, so the tensors own their memory (for a
    storage that keeps references to the items it is given). Anything that is not a
    :class:`Packed` is returned as is.
    """
    if not isinstance(obj, Packed):
        return obj
    buffers = [np.array(b, copy=True) for b in obj.buffers] if copy else obj.buffers
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return pickle.loads(obj.header, buffers=buffers)
