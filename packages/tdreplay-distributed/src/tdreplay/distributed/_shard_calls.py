"""``ShardCalls``: a sharded buffer's calls to its shards, sent at once, dead shards set aside.

Every call goes to all the shards concerned before any answer is awaited, so the round trips
overlap. A shard whose actor is dead (or restarted by Ray without its data) is set aside:
reads and writes go on with the live shards, with a
:class:`~tdreplay.distributed.errors.ShardsUnavailableWarning`, until it is respawned. A shard
that is only *temporarily* unavailable (Ray is restarting its actor, ``max_restarts``, or it
is unreachable) is skipped the same way for :data:`RETRY_UNAVAILABLE` seconds, then asked
again: once it answers it is used as before (an actor restarted from its ``checkpoint_path``
serves that checkpoint).

Every answer of a call that may change a shard's sampling weights (writes, priority updates,
``empty``, draws) carries the shard's mass ``(sum, min, len, max priority)`` after the call
(:data:`~._server.Mass`); the client keeps the latest of each shard. The largest max priority
is the global max, which writes carry to the shard they go to (new items get the max priority
of the whole buffer, as in one buffer). The masses let :meth:`ShardCalls.sample` draw a batch
in **one** round of calls, with no round trip to read the masses first:

1. from the masses known, each live shard is asked for a number of items a little above its
   expected share (``n q_k`` plus three standard deviations plus 2; a shard known empty gets
   0, a shard never heard of an equal share); every live shard gets a call, with a count of
   0 if need be, so that every answer brings the shard's mass *at the draw*;
2. the shard of each position of the batch is then drawn from those fresh masses (a
   multinomial, as one buffer holding every shard's items would), and shard ``k`` contributes
   the first ``n_k`` of the items it drew. Its draws are independent, so its first ``n_k``
   items are ``n_k`` draws from it: the batch has exactly the distribution of one buffer at
   the moment of the draws, however old the masses of step 1 were. Where a shard drew fewer
   than ``n_k`` (rare with known masses: its count exceeded three standard deviations; or its
   share grew since, e.g. another collector wrote to it) a second round draws the difference
   from those shards.

Samplers whose draws are not independent (without replacement: an item drawn and dropped
would be lost for its epoch) are asked for exactly the counts drawn from the masses known,
read first in a round of their own when unknown: the split is then as of this client's last
answer from each shard (its own writes and updates included; another client's writes since
are seen from the next sample on).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from tdreplay.core.utils import leading_dim, restore_attributes, take_rows

from ._ray import Deadline, wait_all
from ._server import Mass
from ._sharding import Piece, ask_counts, draw_shards, known_total, merge_samples
from ._wire import unpack
from .client import ActorClient
from .errors import (
    BufferActorDiedError,
    RemoteBufferError,
    RemoteCallTimeoutError,
    ShardsUnavailableWarning,
)

__all__ = ["ShardCalls"]

Call = tuple[int, str, tuple[Any, ...]]

#: seconds a shard that answered "temporarily unavailable" is skipped before it is asked again
RETRY_UNAVAILABLE = 1.0

#: tries of one sample while shards die or become unavailable under it (per shard)
_DRAW_TRIES_PER_SHARD = 4

#: rounds of top-up draws a batch waits for from shards that drew fewer items than it takes
#: (without replacement, a new epoch's items the batch holds already are set aside: more)
_TOP_UP_ROUNDS = 8
_DISTINCT_TOP_UP_ROUNDS = 64


def _items(data: Any, asked: int) -> int:
    """How many items a shard's answer holds (``asked``, unless its sampler handed out fewer:
    the last batch of an epoch without replacement)."""
    try:
        return min(asked, leading_dim(data))
    except (TypeError, ValueError):
        return asked

def _without_taken(data: Any, info: dict[str, Any], drawn: int, pieces: list[Piece],
                   shard: int) -> tuple[Any, dict[str, Any], int]:
    """A shard's top-up draw (``drawn`` items of a new epoch without replacement) less the
    items the batch already took from that shard (its earlier ``pieces``): ``(data, info,
    items left)``. A draw whose ``info["index"]`` does not name one slot per item is kept."""
    index = info.get("index")
    if not isinstance(index, torch.Tensor) or index.shape != (drawn,):
        return data, info, drawn
    taken = [piece[2]["index"][:piece[6]] for piece in pieces if piece[0] == shard]
    if not taken:
        return data, info, drawn
    fresh = (~torch.isin(index, torch.cat(taken))).nonzero().reshape(-1)
    if fresh.numel() == drawn:
        return data, info, drawn
    info = {key: value.index_select(0, fresh) if isinstance(value, torch.Tensor)
            and value.ndim and value.shape[0] == drawn else value
            for key, value in info.items()}
    return take_rows(data, fresh), info, int(fresh.numel())


class ShardCalls:
    """The clients of a sharded buffer's shards, and what their answers told."""

    def __init__(self, clients: list[ActorClient]) -> None:
        self.clients = clients
        #: shards found dead (until respawned)
        self.dead: set[int] = set()
        #: shards found temporarily unavailable: the time (``time.monotonic``) until which
        #: they are skipped; they are asked again after it, and used once they answer
        self.unavailable: dict[int, float] = {}
        #: largest max priority any shard reported (``None``: not prioritized, or not known)
        self.max_priority: float | None = None
        #: each shard's latest :data:`~._server.Mass` (``None``: not heard of yet)
        self.masses: list[Mass | None] = [None] * len(clients)
        #: shards whose storage is known to be laid out (see :meth:`layout_for`)
        self.laid_out: set[int] = set()
        self._rng_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_rng_lock"]
        state["unavailable"] = {}  # (times of this process's clock: the copy asks again)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_attributes(self, {"unavailable": {}, **state})
        self._rng_lock = threading.Lock()

    def forget_masses(self) -> None:
        """Drop the masses known (the shards were restored, replaced or reconnected), and
        which shards are laid out (a shard restored from a checkpoint may not be)."""
        self.masses = [None] * len(self.clients)
        self.laid_out = set()

    def check_open(self, what: str) -> None:
        """:class:`BufferActorDiedError` saying so once the buffer was closed (its shards'
        actors are gone for good: no shard is set aside, nothing is warned)."""
        if self.clients and all(client.closed for client in self.clients):
            raise BufferActorDiedError(
                f"{what} failed: the sharded buffer was closed (close() killed its "
                f"{len(self.clients)} shards' actors for good; a closed buffer cannot be "
                "respawned).", actor="all shards")

    def layout_for(self, shard: int, timeout: float | None) -> tuple[int, Any]:
        """``(shard to write to, template)`` for a write bound for ``shard``.

        A lazy storage lays itself out at its first write, and each shard has its own: a
        batch for a shard not known to be laid out first lays it out like a shard that is
        (``template``: no rows of that shard's storage; see ``BufferServer._lay_out_like``).
        The live shards are asked at once which are laid out (one round, until every shard
        written to is known laid out: then writes cost nothing more). ``template`` is
        ``None`` when ``shard`` is laid out (its storage checks the batch). When no shard
        is, the write goes to the lowest live shard, whose actor serializes the first
        writes: two writers racing to the first writes of two empty shards cannot lay them
        out unlike each other (the second writer finds the lowest shard laid out, or writes
        there too and its storage checks it).
        """
        if shard in self.laid_out:
            return shard, None
        live = self.live()
        answers = dict(self.tolerant([(k, "layout_template", ()) for k in live],
                                     "extend (reading the shards' layouts)", timeout))
        self.laid_out.update(k for k, (laid_out, _) in answers.items() if laid_out)
        if shard in self.laid_out:
            return shard, None
        ready = sorted(k for k in answers if answers[k][0])
        if ready:  # (a storage of no TensorDicts has no template: nothing to check)
            return shard, answers[ready[0]][1]
        return self.live()[0], None

    def note_mass(self, shard: int, mass: Mass | None) -> None:
        """Keep shard ``shard``'s mass ``(sum, min, len, max priority)`` from an answer
        (``None``: its sampler does not tell it)."""
        self.masses[shard] = None if mass is None else (
            float(mass[0]), float(mass[1]), int(mass[2]), mass[3])
        if mass is not None:
            self.note_max(mass[3])
            if int(mass[2]) > 0:  # it holds items: its storage is laid out
                self.laid_out.add(shard)

    def note_max(self, value: float | None) -> None:
        """Keep ``value`` if it is a larger max priority than seen so far."""
        if value is not None and (self.max_priority is None or value > self.max_priority):
            self.max_priority = float(value)

    def skipped(self) -> set[int]:
        """Shards calls leave out now: the dead ones, and those found unavailable less than
        :data:`RETRY_UNAVAILABLE` seconds ago."""
        now = time.monotonic()
        return self.dead | {k for k, until in self.unavailable.items() if until > now}

    def live(self) -> list[int]:
        """Shards calls go to now (:meth:`skipped` aside); :class:`BufferActorDiedError` when
        every shard is dead, :class:`RemoteBufferError` when the others are unavailable."""
        self.check_open("the call")
        skipped = self.skipped()
        live = [k for k in range(len(self.clients)) if k not in skipped]
        if live:
            return live
        if len(self.dead) == len(self.clients):
            raise BufferActorDiedError(
                f"every shard of the buffer is dead ({sorted(self.dead)}). If the buffer was "
                "closed (close() is for good), it is gone; else the client that created it "
                "rebuilds them with respawn(path) from their last checkpoint (other clients "
                "then call reconnect()).", actor="all shards")
        raise RemoteBufferError(
            f"no shard of the buffer can answer now: shards {sorted(self.dead)} are dead and "
            f"{sorted(skipped - self.dead)} temporarily unavailable (restarting or "
            "unreachable); the call may be retried.", actor="all shards")

    def set_aside(self, shard: int, err: RemoteBufferError) -> None:
        """Leave ``shard`` out after it failed with ``err``: for good (until respawned) when
        its actor is dead (:meth:`mark_dead`), for :data:`RETRY_UNAVAILABLE` seconds when it
        is temporarily unavailable (:meth:`mark_unavailable`)."""
        if isinstance(err, BufferActorDiedError):
            self.mark_dead(shard, err)
        else:
            self.mark_unavailable(shard, err)

    def mark_dead(self, shard: int, err: BaseException) -> None:
        """Set ``shard`` aside until it is respawned, with a warning."""
        self.unavailable.pop(shard, None)
        if shard not in self.dead:
            self.dead.add(shard)
            warnings.warn(ShardsUnavailableWarning(
                f"shard {shard} is unavailable ({err}); the buffer goes on with shards "
                f"{[k for k in range(len(self.clients)) if k not in self.dead]}: samples come "
                "from them only, and its items are not sampled until respawn(path) restores "
                "it."), stacklevel=4)

    def mark_unavailable(self, shard: int, err: BaseException) -> None:
        """Skip ``shard`` for :data:`RETRY_UNAVAILABLE` seconds (warned once until it answers
        again): Ray is restarting its actor, or it is unreachable."""
        first = shard not in self.unavailable
        self.unavailable[shard] = time.monotonic() + RETRY_UNAVAILABLE
        if first:
            warnings.warn(ShardsUnavailableWarning(
                f"shard {shard} is temporarily unavailable ({err}); the buffer goes on "
                "without it and asks it again: its items are sampled again once it answers."),
                stacklevel=4)

    def note_answer(self, shard: int) -> None:
        """``shard`` answered: it is no longer skipped as unavailable."""
        self.unavailable.pop(shard, None)

    def confirm_live(self, what: str, timeout: float | None) -> None:
        """Raise as :meth:`live` does unless some shard answers now (a cheap ``length``): a
        call whose own shards were all found dead does not tell whether the others live."""
        self.tolerant([(k, "length", ()) for k in self.live()], what, timeout)

    def strict(self, calls: Sequence[Call], what: str, timeout: float | None) -> list[Any]:
        """Results of ``calls`` (``(shard, method, args)``) in order; any error raises."""
        self.check_open(what)
        refs = [(self.clients[k].submit(method, *args), self.clients[k].label)
                for k, method, args in calls]
        return wait_all(refs, what=what, timeout=timeout)

    def tolerant(self, calls: Sequence[Call], what: str, timeout: float | None, *,
                 need_one: bool = True) -> list[tuple[int, Any]]:
        """``(shard, result)`` of the calls whose shard answered; a shard that is dead or
        unavailable is set aside (see :meth:`set_aside`). Timeouts and the buffers' own errors
        raise, and so does a closed buffer (:meth:`check_open`); so does a call none of whose
        shards answered when no shard is left (:meth:`live`), unless ``need_one`` is false."""
        self.check_open(what)
        submitted = [(k, self.clients[k].submit(method, *args))  # raises once closed
                     for k, method, args in calls]
        deadline = Deadline(timeout)
        results = []
        for k, ref in submitted:
            try:
                results.append((k, self.clients[k].wait(ref, what,
                                                        timeout=deadline.remaining())))
            except RemoteCallTimeoutError:
                raise
            except RemoteBufferError as err:
                self.set_aside(k, err)
            else:
                self.note_answer(k)
        if calls and not results and need_one:
            self.live()  # raises when no shard is left
        return results

    def sample(self, batch_size: int, generator: torch.Generator | None, offsets: torch.Tensor,
               timeout: float | None) -> tuple[Any, dict[str, Any]]:
        """A batch drawn over the live shards as one buffer would, in one round of calls (see
        the module docstring). ``info["dead_shards"]`` lists the dead shards left out, if
        any, ``info["unavailable_shards"]`` those left out as temporarily unavailable."""
        for _ in range(_DRAW_TRIES_PER_SHARD * len(self.clients) + 2):
            drawn = self._draw(batch_size, generator, timeout)
            if drawn is not None:
                break
        else:
            raise RemoteBufferError(
                f"sample: the shards kept dying, emptying or becoming unavailable under "
                f"{_DRAW_TRIES_PER_SHARD * len(self.clients) + 2} tries; the call may be "
                "retried.", actor="all shards")
        which, pieces, minimum = drawn
        data, info = merge_samples(which, pieces, minimum, offsets)
        if self.dead:
            info["dead_shards"] = tuple(sorted(self.dead))
        unavailable = self.skipped() - self.dead
        if unavailable:
            info["unavailable_shards"] = tuple(sorted(unavailable))
        return data, info

    def ask_masses(self, shards: Sequence[int], what: str, timeout: float | None) -> None:
        """Ask ``shards`` for their sampling masses and keep them (a shard that does not
        answer is left out, as :meth:`tolerant` leaves it)."""
        for k, mass in self.tolerant([(k, "sampling_mass", ()) for k in shards], what, timeout):
            self.note_mass(k, mass)

    def _answers(self, calls: list[Call], timeout: float | None) -> dict[int, Any] | None:
        """Unpacked answers of ``sample_part`` calls by shard, their masses kept; ``None`` if
        a shard died meanwhile (the caller draws again from the others)."""
        answers = {k: unpack(r) for k, r in self.tolerant(calls, "sample", timeout)}
        for k, (_, _, mass, _) in answers.items():
            self.note_mass(k, mass)
        return answers if len(answers) == len(calls) else None

    def _draw(self, batch_size: int, generator: torch.Generator | None, timeout: float | None
              ) -> tuple[torch.Tensor, list[Piece], float] | None:
        """``(which, pieces, global min)`` of one try, ``None`` when the shards changed under
        it (a shard died or was emptied meanwhile): the next try uses what was learnt."""
        live = self.live()
        independent = all(self.clients[k].info.get("independent_draws") for k in live)
        # (without replacement: no item twice in a batch, as one buffer draws it)
        distinct = all(self.clients[k].info.get("finite_epochs") for k in live)
        if not independent and not known_total(self.masses, live) > 0:
            self.ask_masses(live, "sample", timeout)
            live = self.live()
        which = None
        with self._rng_lock:  # worker threads of a prefetch draw at once
            if independent:
                asked = ask_counts(batch_size, [self.masses[k] for k in live])
            else:
                which = draw_shards(batch_size, self.masses, live, generator, distinct)
                asked = [int((which == k).sum()) for k in live]
        answers = self._answers([(k, "sample_part", (n,)) for k, n in zip(live, asked)], timeout)
        if answers is None:
            return None
        if which is None:
            with self._rng_lock:
                which = draw_shards(batch_size, self.masses, live, generator)
        counts = torch.bincount(which, minlength=len(self.clients)).tolist()
        minimum = min(answers[k][2][1] for k in live)
        pieces: list[Piece] = []
        missing: dict[int, int] = {}  # shard -> items the batch still takes from it
        for k, n in zip(live, asked):
            kept = 0
            if counts[k] and n:
                data, info, mass, beta = answers[k]
                if data is None:  # emptied since its mass was known
                    return None
                drawn = _items(data, n)  # (fewer: an epoch without replacement ended)
                kept = min(drawn, counts[k])
                pieces.append((k, data, info, mass[1], beta, drawn, kept))
            if counts[k] > kept:
                missing[k] = counts[k] - kept
        rounds = _DISTINCT_TOP_UP_ROUNDS if distinct else _TOP_UP_ROUNDS
        for _ in range(rounds):  # shards that drew fewer items than the batch takes
            if not missing:
                break
            more = self._answers([(k, "sample_part", (n,)) for k, n in missing.items()],
                                 timeout)
            if more is None or any(more[k][0] is None for k in more):
                return None
            for k, (data, info, mass, beta) in more.items():
                minimum = min(minimum, mass[1])
                drawn = _items(data, missing[k])
                if distinct:  # a new epoch of the shard: not the items the batch holds
                    data, info, drawn = _without_taken(data, info, drawn, pieces, k)
                kept = min(drawn, missing[k])
                if kept:
                    pieces.append((k, data, info, mass[1], beta, drawn, kept))
                missing[k] -= kept
                if not missing[k]:
                    del missing[k]
        if missing:
            raise RuntimeError(f"shards {sorted(missing)} drew no items for "
                               f"{rounds} rounds while their masses say they hold some.")
        return which, pieces, minimum
