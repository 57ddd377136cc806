"""Says what to install when ``tdreplay.data`` is imported without the meta-package.

tdreplay-core's wheel installs this top-level module and ``tdreplay_data_hint.pth``, which
imports it at interpreter start. It is deliberately tiny (it imports nothing of tdreplay,
torch or tensordict): it appends a finder to the end of ``sys.meta_path`` that every other
finder comes before, so it answers only when ``tdreplay.data`` is not installed, and then raises
the ``ModuleNotFoundError`` Python would, with the ``pip install`` line in its message.

Examples
--------
>>> import importlib.machinery, sys
>>> finder = DataHintFinder()
>>> finder.find_spec("tdreplay.core", None) is None  # any other module: not its business
True
>>> try:
...     finder.find_spec("tdreplay.data", None)
... except ModuleNotFoundError as err:
...     print(err.name, "pip install tdreplay" in str(err))
tdreplay.data True
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MESSAGE = (
    "No module named 'tdreplay.data': it is the meta-package's facade, and only tdreplay "
    "components are installed here. Install it with: pip install tdreplay (or import from the "
    "components themselves: tdreplay.core, tdreplay.storages, tdreplay.samplers, ...)."
)


class DataHintFinder:
    """A last-resort meta-path finder for ``tdreplay.data`` (see the module docstring)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> Any:
        if fullname == "tdreplay.data":
            raise ModuleNotFoundError(MESSAGE, name=fullname)
        return None


def install() -> None:
    """Append one :class:`DataHintFinder` to ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, DataHintFinder) for f in sys.meta_path):
        sys.meta_path.append(DataHintFinder())


install()
