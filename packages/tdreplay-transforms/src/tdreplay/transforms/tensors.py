"""Transforms that reshape, concatenate, cast or move tensors: ``CatTensors``,
``FlattenObservation``, ``UnsqueezeTransform``, ``SqueezeTransform``, ``DTypeCastTransform``,
``DoubleToFloat``, ``DeviceCastTransform``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from tdreplay.core import Transform
from tdreplay.core.transform import NestedKey
from tdreplay.core.utils import check_flag, check_key

from ._utils import keys_arg, require_tensordict


class PositiveDimError(ValueError, RuntimeError):
    """A non-negative ``dim`` given to :class:`UnsqueezeTransform` / :class:`SqueezeTransform`
    without ``allow_positive_dim=True``.

    A ``ValueError`` (what tdreplay raised before), and the ``RuntimeError`` TorchRL raises in
    this case, so ``except RuntimeError:`` written for TorchRL catches it.

    Examples
    --------
    >>> [issubclass(PositiveDimError, e) for e in (ValueError, RuntimeError)]
    [True, True]
    >>> UnsqueezeTransform(0, in_keys=["obs"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.transforms.tensors.PositiveDimError: UnsqueezeTransform: dim=0 is not negative; ...
    """


class DimOutOfRangeError(ValueError, IndexError):
    """An entry that has no dimension ``dim`` for :class:`UnsqueezeTransform` /
    :class:`SqueezeTransform` to insert at or remove.

    A ``ValueError`` (what tdreplay raised before), and the ``IndexError`` torch (so TorchRL)
    raises in this case, so ``except IndexError:`` written for TorchRL catches it.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> t = UnsqueezeTransform(-3, in_keys=["obs"])
    >>> t(TensorDict({"obs": torch.zeros(4)}, [4]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.transforms.tensors.DimOutOfRangeError: UnsqueezeTransform: dim=-3 is out of range ...
    """


def _key_sort(key: NestedKey) -> str:
    return key if isinstance(key, str) else ".".join(key)


class CatTensors(Transform):
    """Concatenates several entries into one along ``dim`` on sample.

    Parameters
    ----------
    in_keys : sequence of nested keys
        Entries to concatenate (at least one).
    out_key : nested key
        Entry written. Defaults to ``"observation_vector"``, as in TorchRL.
    dim : int
        Dimension of concatenation; must be negative (counted from the last dimension, so it does
        not depend on the batch size). Defaults to ``-1``.
    del_keys : bool
        Remove the in_keys after concatenation. Defaults to ``True``.
    unsqueeze_if_needed : bool
        Give entries with fewer dimensions trailing singleton dimensions (a ``[B]`` reward joins
        a ``[B, 3]`` observation as ``[B, 1]``). Defaults to ``True``.
    unsqueeze_if_oor : bool
        As TorchRL: an entry that has no dimension ``dim`` (out of range) gets a leading one
        first (``dim=-2`` concatenates two ``[1]`` entries into ``[2, 1]``). Defaults to
        ``False``.
    sort : bool
        Concatenate in sorted key order (``True``, as in TorchRL) or in the order given.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"b": torch.ones(2, 3), ("a", "x"): torch.zeros(2)}, [2])
    >>> out = CatTensors([("a", "x"), "b"], "obs")(td)
    >>> out["obs"]
    tensor([[0., 1., 1., 1.],
            [0., 1., 1., 1.]])
    >>> "b" in out.keys()
    False
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey = "observation_vector",
        dim: int = -1,
        *,
        del_keys: bool = True,
        unsqueeze_if_needed: bool = True,
        unsqueeze_if_oor: bool = False,
        sort: bool = True,
    ) -> None:
        keys = keys_arg(in_keys, "in_keys")
        if not keys:
            raise ValueError("CatTensors needs in_keys: the entries to concatenate.")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim >= 0:
            raise ValueError(f"CatTensors: dim must be a negative int (counted from the last "
                             f"dimension), got {dim!r}.")
        if check_flag(sort, "CatTensors: sort"):
            keys = sorted(keys, key=_key_sort)
        out = check_key(out_key, "out_key")
        super().__init__(in_keys=keys)
        self.out_keys = [out]
        self.dim = dim
        self.del_keys = check_flag(del_keys, "CatTensors: del_keys")
        self.unsqueeze_if_needed = check_flag(unsqueeze_if_needed,
                                              "CatTensors: unsqueeze_if_needed")
        self.unsqueeze_if_oor = check_flag(unsqueeze_if_oor,
                                           "CatTensors: unsqueeze_if_oor")

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        values = [self.read_entry(data, key) for key in self.in_keys]
        if self.unsqueeze_if_needed:
            ndim = max(v.ndim for v in values)
            values = [v.reshape(v.shape + (1,) * (ndim - v.ndim)) for v in values]
        if self.unsqueeze_if_oor:  # (dim < 0: dimension -dim - 1 from the end must exist)
            values = [v if -self.dim <= v.ndim else v.unsqueeze(0) for v in values]
        try:
            out = torch.cat(values, self.dim)
        except (RuntimeError, IndexError) as err:
            shapes = {str(k): tuple(v.shape) for k, v in zip(self.in_keys, values)}
            raise ValueError(f"CatTensors cannot concatenate {shapes} along dim {self.dim}: "
                             f"{err}") from err
        if self.del_keys:
            for key in self.in_keys:
                if key != self.out_keys[0]:
                    data.del_(key)
        data.set(self.out_keys[0], out)
        return data

    def __repr__(self) -> str:
        return f"CatTensors(in_keys={self.in_keys}, out_key={self.out_keys[0]!r}, dim={self.dim})"


class FlattenObservation(Transform):
    """Flattens the dimensions ``first_dim`` to ``last_dim`` (both included) of entries on sample.

    Parameters
    ----------
    first_dim, last_dim : int
        First and last dimension flattened. Negative (counted from the last dimension, so they do
        not depend on the batch size) unless ``allow_positive_dim=True``; ``first_dim`` must not
        come after ``last_dim``.
    in_keys, out_keys : sequence of nested keys
        Entries flattened. Defaults to ``["pixels"]``; ``out_keys`` defaults to ``in_keys``.
    allow_positive_dim : bool
        Accept non-negative dims (counted from the first batch dimension).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(4, 3, 16)}, [4])
    >>> FlattenObservation(-2, -1, in_keys=["obs"], out_keys=["flat"])(td)["flat"].shape
    torch.Size([4, 48])
    """

    def __init__(
        self,
        first_dim: int,
        last_dim: int,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        allow_positive_dim: bool = False,
    ) -> None:
        allow_positive_dim = check_flag(allow_positive_dim,
                                        "FlattenObservation: allow_positive_dim")
        for name, value in (("first_dim", first_dim), ("last_dim", last_dim)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"FlattenObservation: {name} must be an int, got {value!r}.")
            if value >= 0 and not allow_positive_dim:
                raise ValueError(f"FlattenObservation: {name}={value} is not negative; pass "
                                 "allow_positive_dim=True to count from the first batch "
                                 "dimension.")
        if (first_dim < 0) == (last_dim < 0) and first_dim > last_dim:
            raise ValueError(f"FlattenObservation: first_dim={first_dim} comes after "
                             f"last_dim={last_dim}.")
        in_keys = ["pixels"] if in_keys is None else in_keys
        super().__init__(keys_arg(in_keys, "in_keys"),
                         None if out_keys is None else keys_arg(out_keys, "out_keys"))
        self.first_dim = first_dim
        self.last_dim = last_dim

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        values = [self.read_entry(data, key) for key in self.in_keys]
        results = []
        for key, value in zip(self.in_keys, values):
            try:
                results.append(value.flatten(self.first_dim, self.last_dim))
            except (IndexError, RuntimeError) as err:
                raise ValueError(f"FlattenObservation cannot flatten dims {self.first_dim}.."
                                 f"{self.last_dim} of entry {key!r} of shape "
                                 f"{tuple(value.shape)}: {err}") from err
        for key, result in zip(self.out_keys, results):
            data.set(key, result)
        return data

    def __repr__(self) -> str:
        return (f"FlattenObservation(first_dim={self.first_dim}, last_dim={self.last_dim}, "
                f"in_keys={self.in_keys}, out_keys={self.out_keys})")


class UnsqueezeTransform(Transform):
    """Inserts a singleton dimension at ``dim`` on sample; removes it on extend (inverse keys).

    Parameters
    ----------
    dim : int
        Where the new dimension goes. Negative (counted from the last dimension) unless
        ``allow_positive_dim=True``: a positive dim counts from the first batch dimension, so it
        means different things for samples of different batch sizes. A non-negative ``dim``
        without ``allow_positive_dim`` raises :class:`PositiveDimError` (both a ``ValueError``
        and TorchRL's ``RuntimeError``).
    allow_positive_dim : bool
        Accept a non-negative ``dim``.
    in_keys, out_keys : sequence of nested keys
        Entries unsqueezed on sample.
    in_keys_inv, out_keys_inv : sequence of nested keys, optional
        Entries squeezed at ``dim`` on extend (``out_keys_inv[i]`` read, ``in_keys_inv[i]``
        written, as TorchRL's). As TorchRL's (``tensor.squeeze(dim)``), an entry
        whose dimension ``dim`` is not of size one is written unchanged; an entry with no
        dimension ``dim`` at all raises :class:`DimOutOfRangeError` (a ``ValueError`` and
        TorchRL's ``IndexError``) naming it, and nothing is written.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(4, 3)}, [4])
    >>> UnsqueezeTransform(-2, in_keys=["obs"])(td)["obs"].shape
    torch.Size([4, 1, 3])

    On extend, a singleton ``dim`` is removed and any other size is kept:

    >>> inv = UnsqueezeTransform(-1, in_keys_inv=["act", "obs"])
    >>> out = inv.inv(TensorDict({"act": torch.zeros(4, 1), "obs": torch.zeros(4, 3)}, [4]))
    >>> out["act"].shape, out["obs"].shape
    (torch.Size([4]), torch.Size([4, 3]))
    """

    def __init__(
        self,
        dim: int,
        *,
        allow_positive_dim: bool = False,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        name = type(self).__name__
        allow_positive_dim = check_flag(allow_positive_dim, f"{name}: allow_positive_dim")
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"{name}: dim must be an int, got {dim!r}.")
        if dim >= 0 and not allow_positive_dim:
            raise PositiveDimError(f"{name}: dim={dim} is not negative; pass "
                                   "allow_positive_dim=True to count from the first batch "
                                   "dimension.")
        super().__init__(keys_arg(in_keys, "in_keys"),
                         None if out_keys is None else keys_arg(out_keys, "out_keys"),
                         keys_arg(in_keys_inv, "in_keys_inv"),
                         None if out_keys_inv is None else keys_arg(out_keys_inv, "out_keys_inv"))
        self.dim = dim

    def _unsqueeze(self, data: TensorDictBase, in_keys: list[NestedKey],
                   out_keys: list[NestedKey]) -> TensorDictBase:
        values = [self.read_entry(data, key) for key in in_keys]
        for in_key, value in zip(in_keys, values):
            if not -value.ndim - 1 <= self.dim <= value.ndim:
                raise DimOutOfRangeError(f"{type(self).__name__}: dim={self.dim} is out of "
                                         f"range for entry {in_key!r} of shape "
                                         f"{tuple(value.shape)}.")
        for out_key, value in zip(out_keys, values):
            data.set(out_key, value.unsqueeze(self.dim))
        return data

    def _squeeze(self, data: TensorDictBase, in_keys: list[NestedKey],
                 out_keys: list[NestedKey], *, need_singleton: bool) -> TensorDictBase:
        """Squeeze ``dim`` of each entry. With ``need_singleton`` a non-singleton ``dim`` raises
        ``ValueError``; without, it leaves the entry as it is (TorchRL's ``squeeze(dim)``). A
        ``dim`` the entry does not have raises either way; nothing is set before the checks."""
        values = [self.read_entry(data, key) for key in in_keys]
        for in_key, value in zip(in_keys, values):
            if not -value.ndim <= self.dim < value.ndim:
                raise DimOutOfRangeError(f"{type(self).__name__}: entry {in_key!r} of shape "
                                         f"{tuple(value.shape)} has no dimension at "
                                         f"dim={self.dim} to squeeze.")
            if need_singleton and value.shape[self.dim] != 1:
                raise ValueError(f"{type(self).__name__}: entry {in_key!r} of shape "
                                 f"{tuple(value.shape)} has no singleton dimension at "
                                 f"dim={self.dim} to squeeze.")
        for out_key, value in zip(out_keys, values):
            data.set(out_key, value.squeeze(self.dim))
        return data

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        return self._unsqueeze(data, self.in_keys, self.out_keys)

    def inv(self, data: TensorDictBase) -> TensorDictBase:
        if not self.in_keys_inv:
            return data
        data = require_tensordict(self, data).copy()
        # (TorchRL's direction: out_keys_inv read, in_keys_inv written)
        return self._squeeze(data, self.out_keys_inv, self.in_keys_inv, need_singleton=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, keys={self.in_keys})"


class SqueezeTransform(UnsqueezeTransform):
    """Removes the singleton dimension ``dim`` on sample; inserts it back on extend (inverse keys).

    The mirror of :class:`UnsqueezeTransform`, with the same arguments. An entry whose
    dimension ``dim`` is not of size one raises a ``ValueError`` (TorchRL leaves it unchanged).
    ``squeeze_dim=`` (TorchRL's older name of ``dim``) is accepted.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(4, 3, 1)}, [4])
    >>> SqueezeTransform(-1, in_keys=["obs"])(td)["obs"].shape
    torch.Size([4, 3])
    """

    def __init__(
        self,
        dim: int | None = None,
        *,
        allow_positive_dim: bool = False,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        squeeze_dim: int | None = None,
    ) -> None:
        if dim is None:
            if squeeze_dim is None:
                raise TypeError("SqueezeTransform: dim must be given.")
            warnings.warn("SqueezeTransform: squeeze_dim is deprecated, pass dim.",
                          DeprecationWarning, stacklevel=2)
            dim = squeeze_dim
        elif squeeze_dim is not None:
            raise TypeError("SqueezeTransform: give dim or squeeze_dim, not both.")
        super().__init__(dim, allow_positive_dim=allow_positive_dim, in_keys=in_keys,
                         out_keys=out_keys, in_keys_inv=in_keys_inv, out_keys_inv=out_keys_inv)

    @property
    def squeeze_dim(self) -> int:
        """The dimension squeezed on sample (``dim``)."""
        return self.dim

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        return self._squeeze(data, self.in_keys, self.out_keys, need_singleton=True)

    def inv(self, data: TensorDictBase) -> TensorDictBase:
        if not self.in_keys_inv:
            return data
        data = require_tensordict(self, data).copy()
        # (TorchRL's direction: out_keys_inv read, in_keys_inv written)
        return self._unsqueeze(data, self.out_keys_inv, self.in_keys_inv)


class DTypeCastTransform(Transform):
    """Casts entries from ``dtype_in`` to ``dtype_out`` on sample, back on extend.

    Parameters
    ----------
    dtype_in, dtype_out : torch.dtype
        Source and target dtypes.
    in_keys, out_keys : sequence of nested keys, optional
        Entries cast on sample. When ``in_keys`` is not given, every entry of dtype ``dtype_in``
        is cast.
    in_keys_inv, out_keys_inv : sequence of nested keys, optional
        Entries cast back to ``dtype_in`` on extend (``out_keys_inv[i]`` read,
        ``in_keys_inv[i]`` written, as TorchRL's). When neither ``in_keys`` nor ``in_keys_inv``
        is given, every entry of dtype ``dtype_out`` is cast back (the mirror of the forward).

    Appended with ``invert=True``, it stores data in ``dtype_out`` (e.g. half precision) and,
    without ``in_keys``, hands samples back in ``dtype_in``.

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(2), "step": torch.zeros(2, dtype=torch.long)}, [2])
    >>> out = DTypeCastTransform(torch.float32, torch.float64)(td)
    >>> out["obs"].dtype, out["step"].dtype
    (torch.float64, torch.int64)
    """

    def __init__(
        self,
        dtype_in: torch.dtype,
        dtype_out: torch.dtype,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        for name, value in (("dtype_in", dtype_in), ("dtype_out", dtype_out)):
            if not isinstance(value, torch.dtype):
                raise TypeError(f"DTypeCastTransform: {name} must be a torch.dtype, got {value!r}.")
        if in_keys is None and out_keys is not None:
            raise ValueError("DTypeCastTransform: out_keys given without in_keys.")
        super().__init__(keys_arg(in_keys, "in_keys"),
                         None if out_keys is None else keys_arg(out_keys, "out_keys"),
                         keys_arg(in_keys_inv, "in_keys_inv"),
                         None if out_keys_inv is None else keys_arg(out_keys_inv, "out_keys_inv"))
        self.dtype_in = dtype_in
        self.dtype_out = dtype_out
        self._all_inv = in_keys is None and in_keys_inv is None

    @staticmethod
    def _cast_all(data: TensorDictBase, source: torch.dtype, target: torch.dtype) -> TensorDictBase:
        for key in list(data.keys(True, True)):
            value = data.get(key)
            if isinstance(value, torch.Tensor) and value.dtype == source:
                data.set(key, value.to(target))
        return data

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        if not self.in_keys:
            return self._cast_all(data, self.dtype_in, self.dtype_out)
        values = [self.read_entry(data, key) for key in self.in_keys]
        for out_key, value in zip(self.out_keys, values):
            data.set(out_key, value.to(self.dtype_out))
        return data

    def inv(self, data: TensorDictBase) -> TensorDictBase:
        if self._all_inv:
            return self._cast_all(require_tensordict(self, data).copy(), self.dtype_out,
                                  self.dtype_in)
        if not self.in_keys_inv:
            return data
        data = require_tensordict(self, data).copy()
        # (TorchRL's direction: out_keys_inv read, in_keys_inv written)
        values = [self.read_entry(data, key) for key in self.out_keys_inv]
        for in_key, value in zip(self.in_keys_inv, values):
            data.set(in_key, value.to(self.dtype_in))
        return data

    def __repr__(self) -> str:
        keys = self.in_keys or "all"
        return f"DTypeCastTransform({self.dtype_in} -> {self.dtype_out}, keys={keys})"


class DoubleToFloat(DTypeCastTransform):
    """Casts ``float64`` entries to ``float32`` on sample, back to ``float64`` on extend.

    :class:`DTypeCastTransform` with ``dtype_in=torch.float64, dtype_out=torch.float32``: with
    ``in_keys`` only those entries are cast, without them every ``float64`` entry is (and, on
    extend, every ``float32`` entry is cast back unless ``in_keys_inv`` says which).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.ones(2, dtype=torch.double),
    ...                  "other": torch.ones(2, dtype=torch.double)}, [2])
    >>> out = DoubleToFloat(in_keys=["obs"])(td)
    >>> out["obs"].dtype, out["other"].dtype
    (torch.float32, torch.float64)
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__(torch.float64, torch.float32, in_keys, out_keys, in_keys_inv,
                         out_keys_inv)


class DeviceCastTransform(Transform):
    """Moves data to ``device`` on sample, and back to ``orig_device`` on extend.

    Parameters
    ----------
    device : str or torch.device
        Where samples go.
    orig_device : str or torch.device, optional
        Where data goes on extend; without it the extend side does nothing.
    in_keys, out_keys : sequence of nested keys, optional
        Entries moved on sample (the whole TensorDict when not given).
    in_keys_inv, out_keys_inv : sequence of nested keys, optional
        Entries moved to ``orig_device`` on extend (the whole TensorDict when not given;
        ``out_keys_inv[i]`` read, ``in_keys_inv[i]`` written, as TorchRL's).

    Examples
    --------
    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(2)}, [2])
    >>> DeviceCastTransform("meta")(td)["obs"].device
    device(type='meta')
    """

    def __init__(
        self,
        device: str | torch.device,
        orig_device: str | torch.device | None = None,
        *,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__(keys_arg(in_keys, "in_keys"),
                         None if out_keys is None else keys_arg(out_keys, "out_keys"),
                         keys_arg(in_keys_inv, "in_keys_inv"),
                         None if out_keys_inv is None else keys_arg(out_keys_inv, "out_keys_inv"))
        self.device = torch.device(device)
        self.orig_device = torch.device(orig_device) if orig_device is not None else None

    def _move(self, data: TensorDictBase, device: torch.device, in_keys: list[NestedKey],
              out_keys: list[NestedKey]) -> TensorDictBase:
        if not in_keys:
            return data.to(device)
        values = [self.read_entry(data, key) for key in in_keys]
        if data.device is not None and data.device != device:
            # entries on several devices: a TensorDict with a device would move them back
            data.clear_device_()
        for out_key, value in zip(out_keys, values):
            data.set(out_key, value.to(device))
        return data

    def forward(self, data: TensorDictBase) -> TensorDictBase:
        require_tensordict(self, data)
        return self._move(data, self.device, self.in_keys, self.out_keys)

    def inv(self, data: TensorDictBase) -> TensorDictBase:
        if self.orig_device is None:
            return data
        data = require_tensordict(self, data)
        if self.in_keys_inv:
            data = data.copy()
        # (TorchRL's direction: out_keys_inv read, in_keys_inv written)
        return self._move(data, self.orig_device, self.out_keys_inv, self.in_keys_inv)

    def __repr__(self) -> str:
        return (f"DeviceCastTransform(device={self.device}, orig_device={self.orig_device}, "
                f"keys={self.in_keys or 'all'})")
