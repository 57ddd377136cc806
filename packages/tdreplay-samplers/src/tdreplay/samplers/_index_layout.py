"""The layout of a :class:`~tdreplay.samplers._trajectory_index.TrajectoryIndex`'s tables:
column and counter positions, the index's modes and the dtype of its slot table (shared by
the index, its compiled kernels and its checkpoints, :mod:`._index_state`)."""

from __future__ import annotations

from typing import Any

import numpy as np

# record columns
LANE, START, LEN, NEXT, DPOS = range(5)
# lane columns
HEAD, TAIL, LAST_ID, LAST_DONE = range(4)
# counters
N_LIVE, N_HIGH, N_FREE = range(3)

#: one lane per environment (a storage of several dims, or collector trajectory ids)
MODE_LANES = 0
#: every storage row a trajectory of its own
MODE_ISOLATED = 1

EMPTY_I64 = np.empty(0, dtype=np.int64)


def slot_dtype(n_slots: int) -> type[np.signedinteger[Any]]:
    """Dtype of the record of each slot: int32 while the record ids fit (one record per slot at
    most), half the memory of int64 per step of a prioritized slice sampler."""
    return np.int32 if n_slots < np.iinfo(np.int32).max else np.int64
