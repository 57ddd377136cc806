"""``ConsumingSampler``: items used up after being sampled ``max_sample_count`` times.

It lives in :mod:`tdreplay.core` (a buffer built with ``consume_after_n_samples=`` makes one,
and core imports no sibling); this module serves the same class under its
``tdreplay.samplers`` name.

Examples
--------
>>> import tdreplay.core
>>> ConsumingSampler is tdreplay.core.ConsumingSampler
True
"""

from __future__ import annotations

from tdreplay.core import ConsumingSampler

__all__ = ["ConsumingSampler"]
