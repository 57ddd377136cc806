#!/usr/bin/env python3
"""Check the version constraints between the packages under ``packages/``.

Two checks, both run by ``python tools/check_pins.py`` (in ``tests-meta``, ``packaging`` and
``release``):

Pins of the meta-package
    Every distribution under ``packages/`` other than ``tdreplay`` itself must be pinned by
    ``packages/tdreplay/pyproject.toml`` as ``<name>==<version>``, in ``[project]
    dependencies`` or in an extra (``[project.optional-dependencies]``, e.g. ``distributed``),
    where ``<version>`` is the ``__version__`` that the component declares in the file named by
    its ``[tool.hatch.version] path``. Every pin of a component, wherever it is, must be that
    exact version, and an ``all`` extra must hold every component that is only in extras.
Ranges between siblings
    Every requirement of a package on a sibling (dependencies and every extra, test extras
    included) must admit the sibling's current version: bumping ``tdreplay-core`` to 0.2.0
    while ``tdreplay-writers`` requires ``tdreplay-core>=0.1,<0.2`` is refused, naming both.

Exits 1 with one line per problem, 0 when everything matches.

Usage: ``python tools/check_pins.py [REPO_ROOT]``
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

META = "tdreplay"
_VERSION_RE = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", re.M)
_REQ_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _load(pyproject: Path) -> dict:
    with pyproject.open("rb") as f:
        return tomllib.load(f)


def declared_version(package_dir: Path) -> str:
    """The ``__version__`` a package declares (static ``version`` or hatch's version file)."""
    data = _load(package_dir / "pyproject.toml")
    static = data.get("project", {}).get("version")
    if static:
        return static
    rel = data.get("tool", {}).get("hatch", {}).get("version", {}).get("path")
    if not rel:
        raise ValueError(f"{package_dir.name}: no static version and no [tool.hatch.version] path")
    try:
        text = (package_dir / rel).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{package_dir.name}: cannot read its version file {rel} ({exc})") from exc
    match = _VERSION_RE.search(text)
    if not match:
        raise ValueError(f"{package_dir.name}: no __version__ = '...' in {rel}")
    return match.group(1)


def packages(root: Path) -> dict[str, Path]:
    """``{canonical distribution name: package directory}`` of every ``packages/*``."""
    found: dict[str, Path] = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        found[_canonical(_load(pyproject)["project"]["name"])] = pyproject.parent
    return found


def _requirements(project: dict) -> list[tuple[str | None, str]]:
    """``(extra or None, raw requirement)`` for the dependencies and every extra."""
    reqs: list[tuple[str | None, str]] = [(None, r) for r in project.get("dependencies", [])]
    for extra, raws in (project.get("optional-dependencies") or {}).items():
        reqs += [(extra, r) for r in raws]
    return reqs


def _where(extra: str | None) -> str:
    return "dependencies" if extra is None else f"extra [{extra}]"


def check(root: Path) -> list[str]:
    """Problems with the meta-package's pins (an empty list when every pin is right)."""
    found = packages(root)
    if META not in found:
        return [f"no meta-package '{META}' under {root / 'packages'}"]

    problems: list[str] = []
    pins: dict[str, list[tuple[str | None, str]]] = {}  # component -> [(extra, spec)]
    for extra, raw in _requirements(_load(found[META] / "pyproject.toml")["project"]):
        match = _REQ_RE.match(raw)
        if not match:
            problems.append(f"{META}: cannot parse requirement {raw!r} ({_where(extra)})")
            continue
        name, _extras, spec, _marker = match.groups()
        name = _canonical(name)
        if name not in found:
            continue  # a third-party dependency of the meta-package: not ours to pin
        pins.setdefault(name, []).append((extra, spec.replace(" ", "")))

    optional: set[str] = set()  # components that only an extra installs
    for name, path in sorted(found.items()):
        if name == META:
            continue
        try:
            version = declared_version(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if name not in pins:
            problems.append(
                f'{name}: not pinned by {META} (add "{name}=={version}" to '
                f"packages/tdreplay/pyproject.toml dependencies or to an extra)"
            )
            continue
        if all(extra is not None for extra, _ in pins[name]):
            optional.add(name)
        for extra, spec in pins[name]:
            if not spec.startswith("==") or "," in spec:
                problems.append(f"{name}: {META} requires {name}{spec!s} ({_where(extra)}), "
                                f"must be exactly =={version}")
            elif spec[2:] != version:
                problems.append(
                    f"{name}: {META} pins {name}=={spec[2:]} ({_where(extra)}) but the package "
                    f"declares __version__ = {version!r}"
                )
    extras = _load(found[META] / "pyproject.toml")["project"].get("optional-dependencies") or {}
    if "all" in extras:
        in_all = {_canonical(m.group(1)) for m in map(_REQ_RE.match, extras["all"]) if m}
        for name in sorted(optional - in_all):
            problems.append(f"{name}: in an extra of {META} but not in its [all] extra")
    return problems


def check_ranges(root: Path) -> list[str]:
    """Problems with the requirements of packages on their siblings.

    Every requirement of a package on a sibling (dependencies, every extra) must admit the
    sibling's declared version; a version bump that a dependent's range no longer admits is
    reported naming both packages, the range and the new version.
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    found = packages(root)
    versions: dict[str, str] = {}
    problems: list[str] = []
    for name, path in sorted(found.items()):
        try:
            versions[name] = declared_version(path)
        except ValueError as exc:
            problems.append(str(exc))
    for name, path in sorted(found.items()):
        for extra, raw in _requirements(_load(path / "pyproject.toml")["project"]):
            try:
                req = Requirement(raw)
            except InvalidRequirement as exc:
                problems.append(f"{name}: cannot parse requirement {raw!r} ({exc})")
                continue
            dep = canonicalize_name(req.name)
            if dep == name or dep not in versions:
                continue  # third-party, or the package's own extras
            if not req.specifier.contains(versions[dep], prereleases=True):
                problems.append(
                    f"{dep} {versions[dep]} is not admitted by {name}, which requires "
                    f"{dep}{req.specifier} ({_where(extra)} of "
                    f"packages/{path.name}/pyproject.toml): widen that range (and release "
                    f"{name} too) or keep {dep} at a version it admits"
                )
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    failed = False
    for title, problems in [("tdreplay meta-package pins are wrong:", check(root)),
                            ("requirements between packages do not admit their versions:",
                             check_ranges(root))]:
        if problems:
            failed = True
            print(title, file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
    if failed:
        return 1
    print(f"check_pins: every component is pinned by {META} at its declared version "
          f"(dependencies and extras), and every requirement between packages admits the "
          f"version it names")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
