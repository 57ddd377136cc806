"""Sphinx extension of the tdreplay docs.

Directives
----------
``.. tdreplay-package:: <distribution>``
    The install line of a distribution under ``packages/`` and the API of its module: every
    name of its ``__all__`` that the package defines is documented with autodoc (under the
    public name, e.g. ``tdreplay.storages.LazyTensorStorage``); names it re-exports from
    another component are listed with a link to where they are documented. Options:
    ``:first:`` names documented first (the rest follow in ``__all__`` order),
    ``:submodules:`` (their docstrings) and ``:submodules-with-members:`` add public submodules.
``.. tdreplay-facade::``
    The table of every name ``tdreplay.data`` re-exports, with the component defining it, and
    the public names of the components that it does not re-export.
``.. tdreplay-benchmarks::``
    The machine, the table and the plot of ``benchmarks/results/latest.json`` (written by
    ``python benchmarks/run_all.py``, the ``bench`` nox session), or a note saying that there
    are no results yet.

Checks
------
Every guide example must run when the docs build. A Python code block of a guide that is not
a ``doctest`` / ``testcode`` block (which the doctest builder runs) is reported as a warning,
which fails the ``-W`` build, unless it carries ``:class: not-executed`` (snippets that need
a GPU, the network or a cluster, each with a note saying why it is not run).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import shutil
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES_DIR = ROOT / "packages"
RESULTS = ROOT / "benchmarks" / "results" / "latest.json"
PLOT = ROOT / "benchmarks" / "results" / "latest.png"
GUIDES_DIR = "guides/"
PYTHON_LANGUAGES = {"python", "python3", "py", "pycon", "default", "ipython"}


# ------------------------------------------------------------------------------------------
# Packages
# ------------------------------------------------------------------------------------------


def distributions() -> dict[str, dict]:
    """``{distribution: [project] table}`` of every package under ``packages/``."""
    found = {}
    for pyproject in sorted(PACKAGES_DIR.glob("*/pyproject.toml")):
        with pyproject.open("rb") as f:
            project = tomllib.load(f)["project"]
        found[project["name"]] = project
    return found


def module_of(dist: str) -> str:
    return "tdreplay.data" if dist == "tdreplay" else "tdreplay." + dist.removeprefix(
        "tdreplay-").replace("-", "_")


def public_home(obj: object) -> str | None:
    """The component module (``tdreplay.<name>``) that defines ``obj``."""
    module = getattr(obj, "__module__", None) or ""
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "tdreplay" and parts[1] != "data":
        return ".".join(parts[:2])
    return None


def role_for(obj: object) -> str:
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "func"
    return "data"


AUTODOC_DIRECTIVES = {"class": "autoclass", "func": "autofunction", "data": "autodata"}


def autodoc_directive(obj: object) -> str:
    return AUTODOC_DIRECTIVES[role_for(obj)]


TOOLING_EXTRAS = {"test", "tests", "dev", "docs", "lint"}


class PackageDirective(SphinxDirective):
    """``.. tdreplay-package:: tdreplay-storages``: install line and API of a component."""

    required_arguments = 1
    option_spec = {"first": directives.unchanged,
                   "submodules": directives.unchanged,
                   "submodules-with-members": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        dist = self.arguments[0]
        projects = distributions()
        if dist not in projects:
            raise self.error(f"no package {dist!r} under {PACKAGES_DIR} (have {sorted(projects)})")
        project = projects[dist]
        name = module_of(dist)
        module = importlib.import_module(name)
        self.env.note_dependency(str(PACKAGES_DIR / dist / "pyproject.toml"))
        self.env.note_dependency(module.__file__)

        lines = [".. code-block:: bash",
                 "   :class: not-executed", "", f"   pip install {dist}"]
        optional = project.get("optional-dependencies", {})
        extras = sorted(e for e in optional if e not in TOOLING_EXTRAS)
        for extra in extras:
            reqs = ", ".join(optional[extra])
            lines.append(f"   pip install '{dist}[{extra}]'   # {reqs}")
        deps = ", ".join(f"``{d}``" for d in project.get("dependencies", []))
        lines += ["", f"Imported as ``{name}``. Depends on {deps}.", ""]

        own, reexported = [], []
        for attr in module.__all__:
            obj = getattr(module, attr)
            home = public_home(obj)
            (own if home == name or home is None else reexported).append((attr, obj, home))
        if reexported:
            links = ", ".join(f":{role_for(obj)}:`{attr} <{home}.{attr}>` (``{home}``)"
                              for attr, obj, home in reexported)
            lines += [f"Also re-exported here, for convenience: {links}.", ""]
        first = (self.options.get("first") or "").split()
        unknown = set(first) - {attr for attr, _, _ in own}
        if unknown:
            raise self.error(f":first: names {sorted(unknown)} that {name} does not define")
        own.sort(key=lambda item: (first.index(item[0]) if item[0] in first else len(first)))
        for attr, obj, _ in own:
            lines += [f".. {autodoc_directive(obj)}:: {name}.{attr}"]
            lines += ["   :members:", ""] if inspect.isclass(obj) else [""]
        with_members = (self.options.get("submodules-with-members") or "").split()
        for submodule in (self.options.get("submodules") or "").split() + with_members:
            title = f"``{submodule}``"
            lines += [title, "-" * len(title), "", f".. automodule:: {submodule}"]
            lines += ["   :members:", ""] if submodule in with_members else [""]
        self.state_machine.insert_input(StringList(lines, source=f"<{dist} API>"), f"<{dist} API>")
        return []


class FacadeDirective(SphinxDirective):
    """``.. tdreplay-facade::``: what ``tdreplay.data`` re-exports, and what it does not."""

    def run(self) -> list[nodes.Node]:
        facade = importlib.import_module("tdreplay.data")
        self.env.note_dependency(facade.__file__)
        rows = []
        exported = set()
        for attr in sorted(facade.__all__, key=str.lower):
            obj = getattr(facade, attr)
            home = public_home(obj)
            exported.add(id(obj))
            ref = f":{role_for(obj)}:`{attr} <{home}.{attr}>`" if home else f"``{attr}``"
            rows.append((ref, f"``{home}``" if home else ""))
        missing = []
        for dist in distributions():
            if dist == "tdreplay":
                continue
            name = module_of(dist)
            try:
                module = importlib.import_module(name)
            except ImportError as err:  # pragma: no cover - a component that does not import
                logger.warning(f"cannot import {name}: {err}", location=self.get_location())
                continue
            for attr in module.__all__:
                obj = getattr(module, attr)
                if id(obj) not in exported and public_home(obj) == name:
                    missing.append(f":{role_for(obj)}:`{attr} <{name}.{attr}>` (``{name}``)")
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 50 50", "",
                 "   * - name in ``tdreplay.data``", "     - defined in"]
        for ref, home in rows:
            lines += [f"   * - {ref}", f"     - {home}"]
        lines.append("")
        if missing:
            lines += ["Public names of the components that ``tdreplay.data`` does not re-export "
                      "(import them from their component): " + ", ".join(missing) + ".", ""]
        else:
            lines += ["Every public name of every component is re-exported by "
                      "``tdreplay.data``.", ""]
        self.state_machine.insert_input(StringList(lines, source="<facade>"), "<facade>")
        return []


# ------------------------------------------------------------------------------------------
# Benchmarks
# ------------------------------------------------------------------------------------------


def _fmt(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.2f}"
    return f"{value:.3g}"


class BenchmarksDirective(SphinxDirective):
    """``.. tdreplay-benchmarks::``: machine, table and plot of the latest results."""

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(RESULTS))
        if not RESULTS.is_file():
            lines = [".. note::", "",
                     "   No benchmark results yet: ``benchmarks/results/latest.json`` does not "
                     "exist in this checkout. Run ``nox -s bench`` (or "
                     "``python benchmarks/run_all.py``) and build the docs again.", ""]
            self.state_machine.insert_input(StringList(lines, source="<bench>"), "<bench>")
            return []
        payload = json.loads(RESULTS.read_text())
        machine = payload.get("machine", {})
        results = payload.get("results", [])
        lines = ["Measured on:", ""]
        labels = {"cpu": "CPU", "cores": "CPU cores", "cuda": "GPU", "python": "Python",
                  "torch": "PyTorch", "date": "date"}
        for key, value in machine.items():
            lines.append(f"* {labels.get(key, key)}: ``{value if value is not None else 'none'}``")
        lines.append("")
        if PLOT.is_file():
            # Sphinx copies images it finds under the source directory; bring the plot there.
            target = Path(self.env.srcdir) / "_generated" / "benchmarks.png"
            target.parent.mkdir(exist_ok=True)
            if not target.exists() or target.read_bytes() != PLOT.read_bytes():
                shutil.copyfile(PLOT, target)
            self.env.note_dependency(str(PLOT))
            lines += [".. figure:: /_generated/benchmarks.png", "   :width: 100%", "",
                      "   ``benchmarks/results/latest.png``, drawn by "
                      "``benchmarks/plot_results.py`` from the same results (log scale: each bar "
                      "is relative to its own unit).",
                      ""]
        else:
            lines += [".. note::", "", "   No plot (``benchmarks/results/latest.png``) beside "
                      "the results: run ``python benchmarks/plot_results.py``.", ""]
        groups: dict[str, list[dict]] = {}
        for row in results:
            groups.setdefault(str(row.get("script", "results")), []).append(row)
        for script, rows in groups.items():
            title = f"``{script}.py``"
            lines += [title, "~" * len(title), ""]
            dates = sorted({str(row["date"]) for row in rows if "date" in row})
            if dates:
                lines += [f"Measured on {', '.join(dates)}.", ""]
            lines += [".. list-table::", "   :header-rows: 1",
                      "   :widths: 45 15 15 25", "",
                      "   * - benchmark", "     - value", "     - unit", "     - details"]
            for row in rows:
                extra = ", ".join(f"{k}={v}" for k, v in row.items()
                                  if k not in {"name", "value", "unit", "script", "date"})
                lines += [f"   * - ``{row['name']}``", f"     - {_fmt(float(row['value']))}",
                          f"     - {row['unit']}", f"     - {extra}"]
            lines.append("")
        if not results:
            lines += ["The results file holds no results.", ""]
        self.state_machine.insert_input(StringList(lines, source=str(RESULTS)), str(RESULTS))
        return []


# ------------------------------------------------------------------------------------------
# Every guide example runs
# ------------------------------------------------------------------------------------------


def check_examples_run(app, doctree: nodes.document) -> None:
    """Warn about Python code blocks of a guide that the doctest builder would not run."""
    docname = app.env.docname
    if not docname.startswith(GUIDES_DIR):
        return
    for block in doctree.findall(lambda n: isinstance(n, (nodes.literal_block,
                                                          nodes.doctest_block))):
        if block.get("testnodetype"):  # doctest / testcode / testoutput: run by the builder
            continue
        if "not-executed" in block.get("classes", []):
            continue
        language = block.get("language", "default")
        if language in PYTHON_LANGUAGES or block.rawsource.lstrip().startswith(">>>"):
            logger.warning(
                "this Python example is not executed by the docs build: use a doctest or "
                "testcode directive, or mark a snippet that cannot run here with "
                "':class: not-executed' and say why", location=block)


def class_attrgetter(cls: type, name: str, *default: object) -> object:
    """Get a class attribute for autodoc without running class-level property getters.

    A property of the class itself (e.g. ``MinariExperienceReplay.available_datasets``, which
    asks a server) would run when autodoc lists the members: it is documented as a property
    from its getter instead, so building the docs never reaches the network.
    """
    for klass in inspect.getmro(cls) if isinstance(cls, type) else ():
        raw = klass.__dict__.get(name)
        if raw is not None:
            if (hasattr(raw, "__get__") and callable(getattr(raw, "fget", None))
                    and not isinstance(raw, property)):
                return property(raw.fget, doc=raw.__doc__)
            break
    return getattr(cls, name, *default)


# ------------------------------------------------------------------------------------------
# Numpy-style docstrings: prose after a field section
# ------------------------------------------------------------------------------------------

FIELD_SECTIONS = {"parameters", "parameter", "params", "keyword arguments", "other parameters",
                  "attributes", "raises", "returns", "yields", "warns"}
# "name", "a, b, c" or "name : type" (numpy style puts spaces around the colon; "Note: ..."
# is prose)
FIELD_LINE = re.compile(r"^\*{0,2}\w+(\s*,\s*\*{0,2}\w+)*\s*,?(\s+:(\s.*)?)?$")


def separate_prose(app, what, name, obj, options, lines: list[str]) -> None:
    """Give prose that follows a field section of a docstring a ``Notes`` heading.

    In numpy style a section runs to the next heading, so napoleon reads a paragraph written
    after the ``Parameters`` entries as more parameters. Such a paragraph (an unindented line
    after a blank line that is not ``name : type``) gets a ``Notes`` heading of its own, and
    a parameter list wrapped over two lines (``a, b,`` / ``c``) is joined. The docstrings are
    unchanged; only what napoleon reads is.
    """
    out: list[str] = []
    section = None
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and nxt.strip() and set(nxt.strip()) == {"-"} and not line.startswith(" "):
            section = line.strip().lower()
            out += [line, nxt]
            i += 2
            continue
        if section in FIELD_SECTIONS and line and not line.startswith(" "):
            if FIELD_LINE.match(line):
                if line.rstrip().endswith(",") and nxt and not nxt.startswith(" ") \
                        and FIELD_LINE.match(nxt):
                    lines[i + 1] = line.rstrip() + " " + nxt.strip()
                    i += 1
                    continue
            elif not out or not out[-1].strip():
                out += ["Notes", "-----"]
                section = "notes"
        out.append(line)
        i += 1
    lines[:] = out


def drop_type_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    """A constant (``FORMAT_VERSION``, ``HOOK_DESTINATIONS``) has no docstring of its own:
    do not show its type's (``int``'s, ``tuple``'s) in its place."""
    if what in ("data", "attribute") and lines and not isinstance(obj, type) \
            and not callable(obj) and getattr(obj, "__doc__", None) == type(obj).__doc__:
        lines[:] = []


def setup(app):
    app.setup_extension("sphinx.ext.napoleon")
    app.connect("autodoc-process-docstring", drop_type_docstring, priority=300)
    # before napoleon (priority 500) turns the sections into reST
    app.connect("autodoc-process-docstring", separate_prose, priority=400)
    app.add_autodoc_attrgetter(type, class_attrgetter)
    app.add_directive("tdreplay-package", PackageDirective)
    app.add_directive("tdreplay-facade", FacadeDirective)
    app.add_directive("tdreplay-benchmarks", BenchmarksDirective)
    app.connect("doctree-read", check_examples_run)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
