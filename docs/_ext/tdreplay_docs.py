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
``.. tdreplay-peers::``
    The same for ``benchmarks/results/peers.json`` (``nox -s bench-peers``): the machine, the
    peers' versions, the table of tdreplay's speed over the best peer and over the floor,
    ``peers.png``, ``scaling.png`` and what a peer could not run.

Docstring and signature hooks
-----------------------------
- Private bases (``_PriorityUpdates``, ``_ImageTransform``, ...) are not shown in "Bases:";
  a private base is replaced by its own public bases.
- The methods a tensorclass gets from ``tensordict`` are not listed as members.
- A parameter described as ``As :class:`PrioritizedSampler`...`` is written out: each name
  of the entry gets the type and the description that the named class documents for it (what
  follows the reference, e.g. ``(eps defaults to 1e-8)``, is kept as a note); the keyword
  arguments that a ``**kwargs`` entry names are written out the same way.

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
PEERS = ROOT / "benchmarks" / "results" / "peers.json"
INSTRUCTIONS = ROOT / "benchmarks" / "results" / "instructions.json"
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


def is_room(cls: type) -> bool:
    """Whether ``cls`` is a part of its subclasses' API rather than an API of its own: a private
    class (``_Name``) or a class of a private module (a mixin such as
    ``tdreplay.samplers._priority_updates.PriorityUpdateMixin``)."""
    return cls.__name__.startswith("_") or any(
        part.startswith("_") for part in cls.__module__.split("."))


def room_members_option(cls: type) -> list[str]:
    """``:inherited-members:`` naming the public bases of ``cls``, when it has rooms: the members
    it gets from its rooms are then documented with it, those of its public bases stay with
    them (autodoc leaves out a member it reaches one of the named classes first)."""
    bases = [base for base in cls.__mro__[1:] if base is not object]
    if not any(is_room(base) for base in bases):
        return []
    public = [base.__name__ for base in bases if not is_room(base)]
    return [f"   :inherited-members: {', '.join([*public, 'object'])}"]


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
            if inspect.isclass(obj):
                lines += ["   :members:", *room_members_option(obj)]
            lines += [""]
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
                      "``benchmarks/plot_results.py`` from the same results: one panel per "
                      "unit, each saying whether higher or lower is better (log scale where "
                      "the values span more than two orders of magnitude).",
                      ""]
        else:
            lines += [".. note::", "", "   No plot (``benchmarks/results/latest.png``) beside "
                      "the results: run ``python benchmarks/plot_results.py``.", ""]
        groups: dict[str, list[dict]] = {}
        for row in results:
            groups.setdefault(str(row.get("script", "results")), []).append(row)
        for script, rows in groups.items():
            # a rubric, not a section: the table of contents lists pages, not script names
            lines += [f".. rubric:: Results of ``benchmarks/{script}.py``", ""]
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


def _ratio(value: float | None, by_cpu: float | None = None) -> str:
    """``2.15x (CPU time: 1.90x)``, or ``–`` when there is nothing to compare."""
    text = "–" if value is None else f"{value:.2f}x"
    return text + (f" (CPU time: {by_cpu:.2f}x)" if by_cpu is not None else "")


def _peer_figure(env, name: str, caption: str) -> list[str]:
    """A figure of ``benchmarks/results/<name>``, copied under the source directory."""
    plot = PEERS.with_name(name)
    if not plot.is_file():
        return [".. note::", "", f"   No ``benchmarks/results/{name}``: run ``nox -s "
                "bench-peers``.", ""]
    target = Path(env.srcdir) / "_generated" / f"peers-{name}"
    target.parent.mkdir(exist_ok=True)
    if not target.exists() or target.read_bytes() != plot.read_bytes():
        shutil.copyfile(plot, target)
    env.note_dependency(str(plot))
    return [f".. figure:: /_generated/peers-{name}", "   :width: 100%", "", f"   {caption}", ""]


def _results_or_note(directive: SphinxDirective, path: Path, missing: str,
                     session: str) -> dict | None:
    """The JSON of ``benchmarks/results/<path>`` (a dependency of the page), or ``None``
    after inserting a note that says it is missing and which nox session writes it."""
    directive.env.note_dependency(str(path))
    if path.is_file():
        return json.loads(path.read_text())
    lines = [".. note::", "", f"   {missing}: ``benchmarks/results/{path.name}`` does not exist "
             f"in this checkout. Run ``nox -s {session}``.", ""]
    directive.state_machine.insert_input(StringList(lines, source=str(path)), str(path))
    return None


class PeersDirective(SphinxDirective):
    """``.. tdreplay-peers::``: tdreplay against cpprb, TorchRL and the floor."""

    def run(self) -> list[nodes.Node]:
        payload = _results_or_note(self, PEERS, "No comparison yet", "bench-peers")
        if payload is None:
            return []
        m = payload.get("machine", {})
        lines = [f"Measured on {m.get('date')}: ``{m.get('cpu')}``, {m.get('cores')} cores, "
                 f"Python {m.get('python')}, PyTorch ``{m.get('torch')}``, load average "
                 f"{m.get('loadavg_before', ['?'])[0]} before the run and "
                 f"{m.get('loadavg_after', ['?'])[0]} after it"
                 + (" (``--quick``)" if m.get("quick") else "") + ". Peers:", ""]
        for peer, info in payload.get("peers", {}).items():
            extra = ", ".join(f"{k} ``{v}``" for k, v in info.items()
                              if k not in {"peer", "version", "seconds", "returncode", "error"})
            failed = " **(failed)**" if info.get("returncode") else ""
            lines.append(f"* {peer} ``{info.get('version')}`` ({extra}){failed}")
        lines += ["", "Speed-ups are tdreplay's rate over the best peer's (cpprb, TorchRL) and "
                  "over the floor's: above 1 tdreplay is faster. Rates are medians of three "
                  "timing windows by the wall clock; in brackets, the same ratio of the rates "
                  "by each process's CPU time, which other processes on the machine disturb "
                  "less.", ""]
        for title, scaling in (("Workloads on 1,000,000 slots", False),
                               ("Sampling against buffer size (33-byte rows)", True)):
            rows = [r for r in payload.get("ratios", []) if ("rows" in r) == scaling]
            if not rows:
                continue
            lines += [f".. rubric:: {title}", "", ".. list-table::", "   :header-rows: 1", "",
                      "   * - workload", "     - unit", "     - tdreplay", "     - best peer",
                      "     - tdreplay / best peer", "     - floor", "     - tdreplay / floor"]
            for r in rows:
                label = r["label"] + (f" ({r['rows']:,} rows)" if scaling else "")
                best = (f"{_fmt(r['best_peer_value'])} ({r['best_peer']})" if r["best_peer"]
                        else "–")
                floor = _fmt(r["floor"]) if r.get("floor") is not None else "–"
                lines += [f"   * - {label}", f"     - {r['unit']}", f"     - {_fmt(r['tdreplay'])}",
                          f"     - {best}",
                          f"     - {_ratio(r['vs_best_peer'], r.get('vs_best_peer_cpu'))}",
                          f"     - {floor}",
                          f"     - {_ratio(r['vs_floor'], r.get('vs_floor_cpu'))}"]
            lines.append("")
        lines += _peer_figure(self.env, "peers.png", "``benchmarks/results/peers.png``: one "
                              "panel per unit, each saying whether higher or lower is better.")
        lines += _peer_figure(self.env, "scaling.png", "``benchmarks/results/scaling.png``: "
                              "microseconds per call against the number of rows (lower is "
                              "better; a flat line does not grow with the buffer).")
        skips: dict[tuple[str, str], list[str]] = {}
        for s in payload.get("skipped", []):
            where = f" at {s['rows']:,} rows" if "rows" in s else ""
            skips.setdefault((s["peer"], s["skipped"]), []).append(f"``{s['name']}``{where}")
        if skips:
            lines += ["Not measured:", ""]
            lines += [f"* {peer}: {', '.join(names)}: {why}"
                      for (peer, why), names in skips.items()]
            lines.append("")
        self.state_machine.insert_input(StringList(lines, source=str(PEERS)), str(PEERS))
        return []


class InstructionsDirective(SphinxDirective):
    """``.. tdreplay-instructions::``: instructions per call of tdreplay, its peers and the
    floor (``benchmarks/instructions.py``)."""

    def run(self) -> list[nodes.Node]:
        payload = _results_or_note(self, INSTRUCTIONS, "No counts yet", "bench-instructions")
        if payload is None:
            return []
        m = payload.get("machine", {})
        results = payload.get("results", [])
        peers = [p for p in ("tdreplay", "cpprb", "floor", "floor_td")
                 if any(r["peer"] == p and "instructions" in r for r in results)]
        capacity = next((r["capacity"] for r in results if "capacity" in r), None)
        lines = [f"Counted on {m.get('date')} (``{m.get('valgrind')}``, Python "
                 f"{m.get('python')}), buffers of {capacity:,} slots. Thousands of instructions "
                 "per call outside libc's bulk copies (lower is better); in brackets, with "
                 "them.", "", ".. list-table::", "   :header-rows: 1", "",
                 "   * - workload", *(f"     - {p}" for p in peers),
                 "     - tdreplay over the floor", "     - tdreplay over floor_td"]
        by_key = {(r["peer"], r["name"]): r for r in results}
        for entry in payload.get("overhead", []):
            name = entry["name"]
            lines.append(f"   * - ``{name}``")
            for peer in peers:
                row = by_key.get((peer, name), {})
                lines.append(f"     - {row['outside_bulk_copy'] / 1e3:,.1f} "
                             f"({row['instructions'] / 1e3:,.1f})" if "instructions" in row
                             else "     - –")
            for over in (entry.get("over_floor"), entry.get("over_floor_td")):
                lines.append(f"     - {over / 1e3:,.1f}" if over is not None else "     - –")
        lines.append("")
        self.state_machine.insert_input(StringList(lines, source=str(INSTRUCTIONS)),
                                        str(INSTRUCTIONS))
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


def skip_tensordict_members(app, what, name, obj, skip, options) -> bool | None:
    """Leave out the methods that ``tensordict``'s tensorclass puts on a class (``from_csv``,
    ``load``, ``lazy_stack``, ...; e.g. on :class:`tdreplay.core.Trajectory`): they are
    tensordict's, documented by tensordict, and their docstrings are not numpy-style."""
    if what == "class" and (getattr(obj, "__module__", None) or "").split(".")[0] == "tensordict":
        return True
    return None


# ------------------------------------------------------------------------------------------
# Public bases only
# ------------------------------------------------------------------------------------------


def public_bases(app, name, obj, options, bases: list) -> None:
    """Show public bases only: a private base (``_Name``) is replaced by its public bases."""
    out: list = []

    def add(base) -> None:
        if getattr(base, "__name__", "").startswith("_"):
            for parent in base.__bases__:
                if parent is not object:
                    add(parent)
        elif base not in out:
            out.append(base)

    for base in bases:
        add(base)
    bases[:] = out or [object]


# ------------------------------------------------------------------------------------------
# "As :class:`X`" parameters written out
# ------------------------------------------------------------------------------------------

PARAMETER_SECTIONS = {"parameters", "parameter", "params", "other parameters",
                      "keyword arguments"}
AS_CLASS = re.compile(r"^As\s+:(?:py:)?class:`~?([\w.]+)`")


def _is_header(lines: list[str], i: int) -> bool:
    return (i + 1 < len(lines) and lines[i].strip() != "" and not lines[i].startswith(" ")
            and set(lines[i + 1].strip()) == {"-"} and len(lines[i + 1].strip()) >= 3)


def parameter_entries(lines: list[str]) -> list[tuple[int, int, list[str], str, list[str]]]:
    """``(start, end, names, type, description lines)`` of every entry of the parameter
    sections of numpy-style docstring ``lines`` (``end`` exclusive, description dedented)."""
    entries = []
    i, section = 0, None
    while i < len(lines):
        if _is_header(lines, i):
            section = lines[i].strip().lower()
            i += 2
            continue
        line = lines[i]
        if section in PARAMETER_SECTIONS and line and not line.startswith(" "):
            if not FIELD_LINE.match(line):
                section = None  # prose after the section
                i += 1
                continue
            head, _, kind = line.partition(" : ")
            names = [n.strip() for n in head.rstrip(" ,:").split(",") if n.strip()]
            j = i + 1
            # a list of names wrapped over two lines ("a, b," / "c")
            while line.rstrip().endswith(",") and j < len(lines) and lines[j] \
                    and not lines[j].startswith(" ") and FIELD_LINE.match(lines[j]):
                more, _, kind = lines[j].partition(" : ")
                names += [n.strip() for n in more.rstrip(" ,:").split(",") if n.strip()]
                line = lines[j]
                j += 1
            desc_start = j
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                if not lines[j].strip() and (j + 1 >= len(lines)
                                             or not lines[j + 1].startswith(" ")):
                    break
                j += 1
            desc = [d[4:] if d.startswith("    ") else d.strip() for d in lines[desc_start:j]]
            entries.append((i, j, names, kind.strip(), desc))
            i = j
            continue
        i += 1
    return entries


def _resolve(ref: str, context: object) -> object | None:
    """The object a ``:class:`` reference names, seen from the module of ``context``."""
    module = importlib.import_module(getattr(context, "__module__", None) or "builtins")
    if "." not in ref and hasattr(module, ref):
        return getattr(module, ref)
    mod_name, _, attr = ref.rpartition(".")
    for candidate in (mod_name, f"{module.__name__.rpartition('.')[0]}.{mod_name}"):
        try:
            return getattr(importlib.import_module(candidate), attr)
        except (ImportError, AttributeError, ValueError):
            continue
    return None


def documented_parameters(cls: object) -> dict[str, tuple[str, list[str]]]:
    """``{name: (type, description lines)}`` of the parameters ``cls`` documents (its own
    "As ..." entries written out first)."""
    lines = (inspect.getdoc(cls) or "").splitlines()
    expand_as_class(None, "class", "", cls, None, lines)
    found = {}
    for _start, _end, names, kind, desc in parameter_entries(lines):
        for name in names:
            found.setdefault(name.lstrip("*"), (kind, desc))
    return found


def _written_out(name: str, kind: str, desc: list[str], note: str) -> list[str]:
    out = [f"{name} : {kind}" if kind else name]
    out += [f"    {d}" if d else "" for d in desc]
    if note:
        out.append(f"    {note}")
    return out


def expand_as_class(app, what, name, obj, options, lines: list[str]) -> None:
    """Write out the parameters described as ``As :class:`X`...``: each gets X's type and
    description (what follows the reference stays, as a note)."""
    entries = parameter_entries(lines)
    for start, end, names, kind, desc in reversed(entries):
        text = " ".join(d.strip() for d in desc)
        match = AS_CLASS.match(text)
        if not match:
            continue
        target = _resolve(match.group(1), obj)
        if target is None or target is obj:
            continue
        source = documented_parameters(target)
        remainder = text[match.end():].strip()
        note = remainder.lstrip(".,;: ").strip()
        if note.startswith("(") and note.endswith(")") or note.startswith("(") \
                and note.endswith(")."):
            note = note.rstrip(".")[1:-1].strip()
        if note:
            note = note[0].upper() + note[1:]
            note = note if note.endswith(".") else note + "."
        mentioned = set(re.findall(r"``(\w+)``", remainder))
        excepted = set(re.findall(r"``(\w+)``", remainder.partition("except")[2]))
        ref = f":class:`~{target.__module__}.{target.__qualname__}`"
        new: list[str] = []
        kept: list[str] = []
        for param in names:
            if param.startswith("**"):
                for kw in [kw for kw in source if kw in mentioned - excepted]:
                    new += _written_out(kw, *source[kw], "")
                kept.append(param)
                continue
            if param not in source:
                kept.append(param)
                continue
            src_kind, src_desc = source[param]
            mine = note if note and (not mentioned or param in mentioned) else ""
            new += _written_out(param, kind or src_kind, src_desc,
                                (mine + f" (As {ref}.)").strip() if mine else f"As {ref}.")
        if kept:
            if kept == names and not any(k.startswith("**") for k in kept):
                continue  # nothing could be written out: leave the entry as it is
            rest = [f"    {d}" if d else "" for d in desc]
            if any(k.startswith("**") for k in kept):
                rest = [f"    Passed on to {ref}{remainder and ' ' + remainder}"]
            new += [", ".join(kept) + (f" : {kind}" if kind else "")] + rest
        lines[start:end] = new


def setup(app):
    app.setup_extension("sphinx.ext.napoleon")
    app.connect("autodoc-process-docstring", drop_type_docstring, priority=300)
    # before napoleon (priority 500) turns the sections into reST
    app.connect("autodoc-process-docstring", separate_prose, priority=400)
    app.connect("autodoc-process-docstring", expand_as_class, priority=450)
    app.connect("autodoc-process-bases", public_bases)
    app.connect("autodoc-skip-member", skip_tensordict_members)
    app.add_autodoc_attrgetter(type, class_attrgetter)
    app.add_directive("tdreplay-package", PackageDirective)
    app.add_directive("tdreplay-facade", FacadeDirective)
    app.add_directive("tdreplay-benchmarks", BenchmarksDirective)
    app.add_directive("tdreplay-peers", PeersDirective)
    app.add_directive("tdreplay-instructions", InstructionsDirective)
    app.connect("doctree-read", check_examples_run)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
