"""Sharing a :class:`~tdreplay.ensembles.ReplayBufferEnsemble` between processes: the ensemble
and its buffers together (``shared=`` / :meth:`EnsembleSharingMixin.share`)."""

from __future__ import annotations

from typing import TypeVar

from tdreplay.core import ReplayBuffer
from tdreplay.core.buffer_sharing import SharingMixin

EnsembleT = TypeVar("EnsembleT", bound="EnsembleSharingMixin")


class EnsembleSharingMixin(SharingMixin):
    """``share`` of :class:`~tdreplay.ensembles.ReplayBufferEnsemble` (mixed in before
    :class:`~tdreplay.core.ReplayBuffer`): it shares the member buffers as well."""

    _rbs: tuple[ReplayBuffer, ...]  #: the member buffers

    def share(self: EnsembleT, shared: bool = True) -> EnsembleT:
        """Mark the ensemble as used by several processes, and with ``shared=True`` each of its
        buffers too; ``shared=False`` unmarks only the ensemble (its buffers may be shared on
        their own). Returns the ensemble.

        The ensemble may go to another process only if every buffer's storage, sampler and
        writer may (the component ensembles are shareable only if all their members are):
        otherwise :class:`~tdreplay.core.NotShareableError` names the part (the buffer's
        position and the part's class) and gives the part's own message. ``share`` refuses so
        a sampler or writer that cannot be shared, and a prefetching ensemble or buffer (then
        nothing is marked); the storages are checked when the ensemble goes to another process.

        Examples
        --------
        >>> from tdreplay.core import ListStorage, ReplayBuffer
        >>> from tdreplay.ensembles import ReplayBufferEnsemble
        >>> rb = ReplayBufferEnsemble(ReplayBuffer(storage=ListStorage(4)),
        ...                           ReplayBuffer(storage=ListStorage(4)), shared=True)
        >>> rb.shared, rb[0].shared, rb[1].shared
        (True, True, True)
        >>> rb.check_shareable()  # what sending it to another process runs  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdreplay.core.process_sharing.NotShareableError: ...: its member 0 (ListStorage) cannot. ...
        """
        was_shared = self.shared
        buffers_were_shared = [rb.shared for rb in self._rbs]
        try:
            super().share(shared)  # refuses an unshareable sampler or writer, naming its buffer
            if shared:
                for rb in self._rbs:
                    if not rb.shared:
                        rb.share(True)
        except BaseException:
            self.shared = was_shared
            for rb, was in zip(self._rbs, buffers_were_shared):
                rb.shared = was
            raise
        return self
