"""What an ensemble saves of its member buffers besides their storages, samplers and writers.

The component ensembles save the members' storages, samplers (with their generators) and
writers. A member buffer's transforms may hold state too (``VecNorm``'s running statistics,
``ObservationNorm``'s ``loc`` / ``scale``), and so may the parts registered on it with
``register_stateful`` (a ``LinearScheduler`` annealing its sampler's ``beta``):
:class:`MemberBufferStates` is the stateful part
(:mod:`tdreplay.core.stateful_parts`) a :class:`~tdreplay.ensembles.ReplayBufferEnsemble`
registers under :data:`MEMBER_BUFFERS`, so its ``state_dict`` / ``dumps`` save that state and
``load_state_dict`` / ``loads`` check it with everything else before restoring it. Each
member's entry is saved and checked as the buffer itself does it
(:mod:`tdreplay.core.transform_state`, :class:`~tdreplay.core.stateful_parts.StatefulParts`),
under the keys of the buffer's own ``state_dict``.

Not saved: batches a member buffer drew ahead for its own ``sample`` (``prefetch``); a restored
member draws afresh. The ensemble's own prefetched batches are saved as a buffer's are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tdreplay.core import ReplayBuffer
from tdreplay.core.stateful_parts import StatefulParts
from tdreplay.core.transform_state import check_transform_state, transform_state

#: the name the ensemble registers :class:`MemberBufferStates` under
MEMBER_BUFFERS = "member_buffers"
#: the keys of a member's transforms' state and registered parts' states, as in a buffer's
#: own ``state_dict``
TRANSFORM, PARTS = "_transform", "_stateful"


class MemberBufferStates:
    """The state of the member buffers that their components do not hold: their transforms'
    and their registered parts'.

    The state is ``{"0": {"_transform": ..., "_stateful": ...}, "1": ...}``, one entry per
    member, holding what that buffer's ``state_dict`` holds under ``"_transform"`` (``None``
    when its transforms have no state) and ``"_stateful"`` (only when parts are registered on
    it). :meth:`check_state_dict` refuses (``ValueError`` naming the buffer) a state with
    other members, or that a member's transforms or parts refuse (a registered part whose
    state is missing included, as the buffer itself refuses it), changing nothing.

    Examples
    --------
    >>> from tdreplay.core import Compose, ListStorage, ReplayBuffer, Transform
    >>> class Count(Transform):
    ...     has_state = True
    ...     n = 0
    ...     def state_dict(self): return {"n": self.n}
    ...     def check_state_dict(self, state): int(state["n"])
    ...     def load_state_dict(self, state): self.n = state["n"]
    >>> counted = ReplayBuffer(storage=ListStorage(4), transform=Count())
    >>> parts = MemberBufferStates([counted, ReplayBuffer(storage=ListStorage(4))])
    >>> state = parts.state_dict()
    >>> state
    {'0': {'_transform': {'0:Count': {'n': 0}}}, '1': {'_transform': None}}
    >>> counted.transform[0].n = 5
    >>> parts.load_state_dict(state)
    >>> counted.transform[0].n
    0
    >>> parts.check_state_dict({"0": state["0"]})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the member buffers' states must have one entry per buffer, keys ['0', '1']; ...
    """

    #: ensemble checkpoints written before the members' transforms were saved hold no such
    #: state: they load, the members' transforms keep theirs (see tdreplay.core.stateful_parts)
    missing_ok = True

    def __init__(self, buffers: Sequence[ReplayBuffer]) -> None:
        self._buffers = tuple(buffers)

    def state_dict(self) -> dict[str, Any]:
        """``{"<i>": {"_transform": state of buffer i's transforms, "_stateful": ...}}``."""
        out: dict[str, Any] = {}
        for i, rb in enumerate(self._buffers):
            entry = out[str(i)] = {TRANSFORM: transform_state(rb.transform)}
            if rb.stateful_parts:
                entry[PARTS] = rb.stateful_parts.state_dict()
        return out

    def check_state_dict(self, state_dict: Any) -> None:
        """``ValueError`` naming the buffer unless every member can load its entry."""
        self._restorers(state_dict)

    def load_state_dict(self, state_dict: Any) -> None:
        """Check every member's entry, then restore them all."""
        for restore in self._restorers(state_dict):
            restore()

    def _restorers(self, state_dict: Any) -> list[Callable[[], None]]:
        """Check ``state_dict``; the functions restoring each member's entry."""
        expected = [str(i) for i in range(len(self._buffers))]
        if not isinstance(state_dict, dict) or set(state_dict) != set(expected):
            got = sorted(map(str, state_dict)) if isinstance(state_dict, dict) \
                else type(state_dict).__name__
            raise ValueError(f"the member buffers' states must have one entry per buffer, keys "
                             f"{expected}; got {got}.")
        restorers = []
        for key, rb in zip(expected, self._buffers):
            entry = state_dict[key]
            try:
                if not isinstance(entry, dict):
                    raise ValueError(f"expected a dict, got {type(entry).__name__}.")
                restorers.append(check_transform_state(rb.transform, entry.get(TRANSFORM)))
                restorers.append(_check_parts(rb.stateful_parts, entry.get(PARTS, {})))
            except ValueError as err:
                raise ValueError(f"buffer {key}: {err}") from err
        return restorers


def _check_parts(parts: StatefulParts, state: Any) -> Callable[[], None]:
    """Check ``state`` for a member's registered ``parts``; the function restoring it."""
    if not parts:
        return lambda: None
    parts.check_state_dict(state)
    return lambda: parts.load_state_dict(state)
