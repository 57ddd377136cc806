"""Test setup of the meta-package: ``tdreplay.data`` is imported before pytest collects it.

``tdreplay.data`` is a package (the facade and TorchRL's module paths under it). pytest's
``--import-mode=importlib`` looks a package's ``__init__.py`` up with the package's own folder
as the search path, where it is not found, and then asks the last-resort finder of
tdreplay-core (``_tdreplay_data_hint``), which raises "install tdreplay". Imported here by the
ordinary import system, the module is in ``sys.modules`` and pytest uses it.
"""

import tdreplay.data  # noqa: F401
