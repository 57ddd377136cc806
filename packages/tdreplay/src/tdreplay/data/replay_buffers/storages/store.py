"""TorchRL's ``torchrl.data.replay_buffers.storages.store``:
its names that tdreplay has, from :mod:`tdreplay.data`.

The same objects as :mod:`tdreplay.data` serves, resolved on first use (see
:mod:`tdreplay.data.torchrl_paths`).

Examples
--------
>>> import tdreplay.data
>>> from tdreplay.data.replay_buffers.storages.store import StoreStorage
>>> StoreStorage is tdreplay.data.StoreStorage
True
"""

from __future__ import annotations

from typing import Any

from tdreplay.data.torchrl_paths import lazy_dir, lazy_getattr, served

__all__ = served(__name__)


def __getattr__(name: str) -> Any:
    return lazy_getattr(__name__, name)


def __dir__() -> list[str]:
    return lazy_dir(__name__)
