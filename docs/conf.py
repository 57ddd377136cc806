"""Sphinx configuration of the tdreplay documentation (built by ``nox -s docs``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# Nothing is downloaded while the docs build: Hugging Face's client (Minari's remote backend)
# fails at once instead of retrying a network that is not there.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(DOCS / "_ext"))

project = "tdreplay"
author = "tdreplay developers"
copyright = "tdreplay developers"
release = version = "0.1"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "tdreplay_docs",
]

exclude_patterns = ["_build", "_generated/*.inc.rst", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []
html_static_path = ["_static"]
html_theme = "furo"
html_title = "tdreplay"

# Docstrings are numpy-style; module docstrings use a few headings of their own.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
# "Attributes" as fields: attributes that are also documented members are not described twice
napoleon_use_ivar = True
napoleon_custom_sections = ["Design", "Index spaces", "TED compaction"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_default_options = {"show-inheritance": True}
autoclass_content = "class"

# Only the examples of the guides (testcode / doctest directives) run in the doctest builder;
# the ``>>>`` examples of the docstrings shown in the API reference are run by each package's
# own test session (pytest --doctest-modules), where they have their module's globals.
doctest_test_doctest_blocks = ""
doctest_global_setup = """
import torch
from tensordict import TensorDict
torch.manual_seed(0)
"""
