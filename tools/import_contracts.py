"""Write the import-linter contracts of the monorepo, derived from the packages themselves.

Run by ``nox -s lint`` (``python tools/import_contracts.py OUT.ini`` then ``lint-imports
--config OUT.ini``). The contracts are generated, so they cannot drift from what the packages
declare:

- **declared dependencies**: a component imports no sibling that its ``pyproject.toml`` does
  not list in ``dependencies`` (core therefore imports no sibling at all); an optional extra
  does not count, the packaging session imports every module without extras;
- **private modules stay private**: no package imports a module of another package whose
  dotted path has a part starting with ``_`` (``tdreplay.core._stateful``,
  ``tdreplay.samplers.segment_trees._numba``), directly; importing the public face of a
  package that uses its private modules itself is fine;
- **no import cycles** between the modules of one package (an ``acyclic_siblings`` contract
  per package and per subpackage).

Private *names* imported from a public module (``from tdreplay.core.x import _y``) and
private attributes read on other objects are ruff's job (``SLF001``, ``PLC2701``; see
``ruff.toml``).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "packages"


def _module_of(dist: str) -> str:
    return "tdreplay.data" if dist == "tdreplay" else "tdreplay." + dist.removeprefix(
        "tdreplay-").replace("-", "_")


def components() -> dict[str, tuple[str, set[str]]]:
    """distribution -> (its module, the modules of the siblings it declares)."""
    projects = {}
    for pyproject in sorted(PACKAGES.glob("*/pyproject.toml")):
        with pyproject.open("rb") as f:
            project = tomllib.load(f)["project"]
        projects[canonicalize_name(project["name"])] = project
    out = {}
    for dist, project in projects.items():
        deps = {canonicalize_name(Requirement(r).name) for r in project.get("dependencies", [])}
        out[dist] = (_module_of(dist), {_module_of(d) for d in deps if d in projects})
    return out


def modules_of(module: str) -> list[str]:
    """Every module of a component's source tree, dotted."""
    dist = "tdreplay" if module == "tdreplay.data" else "tdreplay-" + module.split(".")[1]
    src = PACKAGES / dist / "src"
    found = []
    for f in sorted((src / Path(*module.split("."))).rglob("*.py")):
        parts = f.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append(".".join(parts))
    return found


def subpackages_of(module: str) -> list[str]:
    """The component and each of its subpackages (directories with an ``__init__.py``)."""
    if module == "tdreplay.data":
        return []
    dist = "tdreplay-" + module.split(".")[1]
    src = PACKAGES / dist / "src"
    return sorted(".".join(init.parent.relative_to(src).parts)
                  for init in (src / Path(*module.split("."))).rglob("__init__.py"))


def contracts() -> str:
    comps = components()
    all_modules = {module for module, _ in comps.values()}
    # the meta-package (the facade tdreplay.data and TorchRL's module paths under it) may
    # import every component: no contract of its own
    roots = sorted(m for m in all_modules if m != "tdreplay.data")
    lines = ["[importlinter]", "root_packages =", *(f"    {m}" for m in roots),
             "exclude_type_checking_imports = True", ""]
    n = 0
    for dist, (module, declared) in sorted(comps.items()):
        if dist == "tdreplay":
            continue  # the meta-package re-exports every component
        undeclared = sorted(set(roots) - declared - {module})
        n += 1
        lines += [f"[importlinter:contract:{n}]",
                  f"name = {dist} imports only the siblings it declares",
                  "type = forbidden", f"source_modules = {module}", "forbidden_modules =",
                  *(f"    {m}" for m in undeclared), ""]
    for dist, (module, _) in sorted(comps.items()):
        if dist == "tdreplay":
            continue
        private = sorted(m for other, _ in comps.values() if other != module
                         for m in modules_of(other)
                         if any(part.startswith("_") for part in m.split(".")))
        if not private:
            continue
        n += 1
        lines += [f"[importlinter:contract:{n}]",
                  f"name = {dist} imports no private module of another package",
                  "type = forbidden", f"source_modules = {module}", "forbidden_modules =",
                  *(f"    {m}" for m in private), "allow_indirect_imports = True", ""]
    for module, _ in sorted(comps.values()):
        for package in subpackages_of(module):
            n += 1
            lines += [f"[importlinter:contract:{n}]",
                      f"name = no import cycle among the modules of {package}",
                      "type = acyclic_siblings", f"ancestors = {package}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    text = contracts()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        print(text)
