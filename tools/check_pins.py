#!/usr/bin/env python3
"""Check that the meta-package ``tdreplay`` pins every component at exactly its version.

Every distribution under ``packages/`` other than ``tdreplay`` itself must appear in
``packages/tdreplay/pyproject.toml``'s ``[project] dependencies`` as ``<name>==<version>``, where
``<version>`` is the ``__version__`` that the component declares in the file named by its
``[tool.hatch.version] path``.  Exits 1 with one line per problem, 0 when all pins match.

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


def check(root: Path) -> list[str]:
    """Return a list of problems (empty when every pin is right)."""
    packages: dict[str, Path] = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        packages[_canonical(_load(pyproject)["project"]["name"])] = pyproject.parent
    if META not in packages:
        return [f"no meta-package '{META}' under {root / 'packages'}"]

    problems: list[str] = []
    pins: dict[str, str] = {}
    for raw in _load(packages[META] / "pyproject.toml")["project"].get("dependencies", []):
        match = _REQ_RE.match(raw)
        if not match:
            problems.append(f"{META}: cannot parse dependency {raw!r}")
            continue
        name, _extras, spec, _marker = match.groups()
        name = _canonical(name)
        if name not in packages:
            continue  # a third-party dependency of the meta-package: not ours to pin
        pins[name] = spec.replace(" ", "")

    for name, path in sorted(packages.items()):
        if name == META:
            continue
        try:
            version = declared_version(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        spec = pins.get(name)
        if spec is None:
            problems.append(
                f'{name}: not pinned by {META} (add "{name}=={version}" to '
                f"packages/tdreplay/pyproject.toml dependencies)"
            )
        elif not spec.startswith("==") or "," in spec:
            problems.append(f"{name}: {META} requires {name}{spec!s}, must be exactly =={version}")
        elif spec[2:] != version:
            problems.append(
                f"{name}: {META} pins {name}=={spec[2:]} but the package declares "
                f"__version__ = {version!r}"
            )
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    if problems:
        print("tdreplay meta-package pins are wrong:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"check_pins: every component is pinned by {META} at its declared version")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
