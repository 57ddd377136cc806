"""Development sessions for the tdreplay monorepo.

Run ``nox -l`` to list sessions.  The default run (``nox``) is every ``tests-<pkg>`` session,
``integration``, ``packaging`` and ``lint``; ``demo``, ``docs`` and the ``bench*`` sessions run only
when asked for.

Packages are discovered from ``packages/*/pyproject.toml``: a new package gets its
``tests-<short>`` session (``tdreplay-foo`` -> ``tests-foo``, the meta-package ``tdreplay`` ->
``tests-meta``) and its packaging check without any edit here.

Torch is never installed per session.  It is installed once (CPU wheel from pip's find-links)
into ``.nox/_torch-<version>`` and every virtualenv sees it through a ``.pth`` file written
before anything else is installed; a constraints file pins it so pip can never resolve another
torch (that would download gigabytes of CUDA wheels).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nox
from filelock import FileLock  # a dependency of nox itself
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent
PACKAGES_DIR = ROOT / "packages"
NOX_DIR = ROOT / ".nox"

TORCH_VERSION = "2.13.0"
TORCH_PIN = f"torch=={TORCH_VERSION}+cpu"
TORCH_DIR = NOX_DIR / f"_torch-{TORCH_VERSION}"
TORCH_MARKER = TORCH_DIR / ".tdreplay-complete"
TORCH_PTH = "_tdreplay_torch.pth"
CONSTRAINTS = NOX_DIR / "_constraints.txt"

TEST_TOOLS = ["pytest", "hypothesis", "pytest-timeout"]
RUFF = "ruff==0.17.6"
PYTEST_TIMEOUT = "300"
# Extras that are test/dev tooling, not features: left out when installing "for use" (demo, bench).
TOOLING_EXTRAS = {"test", "tests", "dev", "docs", "lint"}

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True


# --------------------------------------------------------------------------------------------
# Package discovery
# --------------------------------------------------------------------------------------------


@dataclass
class Package:
    dist: str  # canonical distribution name, e.g. "tdreplay-core"
    path: Path
    requires: list[Requirement]
    extras: dict[str, list[Requirement]] = field(default_factory=dict)

    @property
    def is_meta(self) -> bool:
        return self.dist == "tdreplay"

    @property
    def short(self) -> str:
        return "meta" if self.is_meta else self.dist.removeprefix("tdreplay-")

    @property
    def module(self) -> str:
        return "tdreplay.data" if self.is_meta else f"tdreplay.{self.short.replace('-', '_')}"

    @property
    def src(self) -> Path:
        """Source of the package's own modules: the directory of its module (``tdreplay/data``
        for the meta)."""
        return self.path / "src" / Path(*self.module.split("."))

    def feature_extras(self) -> list[str]:
        return sorted(e for e in self.extras if e not in TOOLING_EXTRAS)


def _load_packages() -> dict[str, Package]:
    found: dict[str, Package] = {}
    for pyproject in sorted(PACKAGES_DIR.glob("*/pyproject.toml")):
        with pyproject.open("rb") as f:
            project = tomllib.load(f).get("project", {})
        name = canonicalize_name(project["name"])
        optional = project.get("optional-dependencies", {}) or {}
        found[name] = Package(
            dist=name,
            path=pyproject.parent,
            requires=[Requirement(r) for r in project.get("dependencies", [])],
            extras={
                canonicalize_name(extra): [Requirement(r) for r in reqs]
                for extra, reqs in optional.items()
            },
        )
    return found


PACKAGES = _load_packages()


def _local_deps(reqs: list[Requirement]) -> dict[str, set[str]]:
    """Local siblings named in ``reqs`` -> the extras asked of them."""
    out: dict[str, set[str]] = {}
    for req in reqs:
        name = canonicalize_name(req.name)
        if name in PACKAGES:
            out.setdefault(name, set()).update(canonicalize_name(e) for e in req.extras)
    return out


def closure(pkg: Package, extras: list[str] | None = None) -> dict[str, set[str]]:
    """Local dependency closure of ``pkg`` (itself excluded) -> extras needed of each member."""
    result: dict[str, set[str]] = {}
    todo: list[tuple[Package, list[str]]] = [(pkg, list(extras or []))]
    while todo:
        current, current_extras = todo.pop()
        reqs = list(current.requires)
        for extra in current_extras:
            reqs += current.extras.get(extra, [])
        for name, wanted in _local_deps(reqs).items():
            if name == pkg.dist:
                continue
            known = result.get(name)
            if known is not None and wanted <= known:
                continue
            result[name] = (known or set()) | wanted
            todo.append((PACKAGES[name], sorted(result[name])))
    return result


def _install_args(members: dict[str, set[str]], editable: set[str]) -> list[str]:
    """pip arguments installing local packages ``members`` (name -> extras) from their paths.

    Each path is given without extras, and the third-party requirements of the wanted extras
    are listed next to it (extras naming local siblings are covered by ``closure``): pip 23.2,
    the one venv ships, fails to resolve an explicit local ``path[extra]`` against another
    package's plain ``==`` pin of the same project (it then looks that project up on an index).
    """
    paths: list[str] = []
    reqs: list[str] = []
    for name, extras in sorted(members.items()):
        pkg = PACKAGES[name]
        paths += ["-e", str(pkg.path)] if name in editable else [str(pkg.path)]
        for extra in sorted(extras):
            for req in pkg.extras.get(extra, []):
                if canonicalize_name(req.name) not in PACKAGES and str(req) not in reqs:
                    reqs.append(str(req))
    return [*reqs, *paths]


# --------------------------------------------------------------------------------------------
# Torch, shared by every virtualenv
# --------------------------------------------------------------------------------------------


def _ensure_torch(session: nox.Session) -> None:
    """Install the CPU torch once into TORCH_DIR (reused by every session and every CI run)."""
    NOX_DIR.mkdir(exist_ok=True)
    # Sessions may run in parallel (nox -j): one installs, the others wait for it.
    with FileLock(str(NOX_DIR / "_torch.lock")):
        if not CONSTRAINTS.exists() or CONSTRAINTS.read_text() != f"{TORCH_PIN}\n":
            CONSTRAINTS.write_text(f"{TORCH_PIN}\n")
        if not TORCH_MARKER.exists():
            _install_torch(session)


def _install_torch(session: nox.Session) -> None:
    if TORCH_DIR.exists():
        shutil.rmtree(TORCH_DIR)
    session.log(f"Installing {TORCH_PIN} once into {TORCH_DIR}")
    # Runs with the interpreter that runs nox (outside any venv); ``+cpu`` in the pin makes pip
    # use the local CPU wheel or fail, never download a CUDA build.
    session.run_always(
        sys.executable, "-m", "pip", "install", "--quiet", "--no-warn-script-location",
        "--target", str(TORCH_DIR), TORCH_PIN,
        external=True,
    )  # fmt: skip
    TORCH_MARKER.write_text(TORCH_PIN + "\n")


def _purelib(python: str | Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def _link_torch(python: str | Path) -> None:
    """Make the shared torch visible to the interpreter ``python`` (a virtualenv's)."""
    purelib = _purelib(python)
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / TORCH_PTH).write_text(f"{TORCH_DIR}\n")


CHECK_TORCH = (
    "import torch, sys; v = torch.__version__; "
    f"sys.exit(0 if v == '{TORCH_VERSION}+cpu' else "
    f"'wrong torch imported: ' + v + ' from ' + torch.__file__ + ', expected {TORCH_VERSION}+cpu')"
)


# Every Ray instance a session starts (tests, docs, demo, benchmarks) stays on this machine:
# its node address is 127.0.0.1 and it sends no usage report.
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def _setup_venv(session: nox.Session) -> None:
    """First thing in every session: shared torch visible before anything is installed."""
    session.env.update(LOCAL_RAY_ENV)
    _ensure_torch(session)
    _link_torch(Path(session.bin) / "python")
    session.run("python", "-c", CHECK_TORCH, silent=True)


# ``--no-compile``: modules are byte-compiled lazily on first import instead of all at install
# time (halves the install time of numpy/numba/hypothesis on this 2-core machine).
PIP_INSTALL = ("--quiet", "--no-compile", "-c", str(CONSTRAINTS))
# Build backend of every package, installed in each venv so that local packages build without
# pip's isolated build environments (one per package, each installing hatchling: slow).
BUILD_DEPS = ("hatchling>=1.24", "editables")


def _pip_install(session: nox.Session, *args: str) -> None:
    """Install into the session's venv: torch pinned; local packages built without isolation."""
    session.install(*PIP_INSTALL, *BUILD_DEPS)
    session.install(*PIP_INSTALL, "--no-build-isolation", *args)
    session.run("python", "-c", CHECK_TORCH, silent=True)


def _install_all(session: nox.Session, *extra: str, with_tooling: bool) -> None:
    """Every package (meta included), editable, with its feature extras (and test extras).

    ``extra``: more requirements of the session (demo, docs, plot dependencies), installed by
    the same pip call.
    """
    members = {
        name: set(pkg.extras if with_tooling else pkg.feature_extras())
        for name, pkg in PACKAGES.items()
    }
    args = _install_args(members, editable=set(PACKAGES))
    _pip_install(session, *(TEST_TOOLS if with_tooling else []), *extra, *args)


def _pytest(session: nox.Session, *paths: str | Path, junit: str) -> None:
    reports = NOX_DIR / "_reports"
    reports.mkdir(parents=True, exist_ok=True)
    (reports / f"{junit}.xml").unlink(missing_ok=True)
    session.run(
        "python", "-m", "pytest",
        "-p", "no:cacheprovider",
        "--import-mode=importlib",
        "-o", "consider_namespace_packages=true",
        "--doctest-continue-on-failure",
        f"--timeout={PYTEST_TIMEOUT}",
        f"--rootdir={ROOT}",
        f"--junitxml={reports / f'{junit}.xml'}",
        *map(str, paths),
        *session.posargs,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------------------------


def _make_tests_session(pkg: Package):
    local = closure(pkg, list(pkg.extras))

    def tests(session: nox.Session) -> None:
        _setup_venv(session)
        # The package (editable) with all its extras, its local closure (built as wheels), and
        # nothing else local: importing an undeclared sibling fails.
        members = {**local, pkg.dist: set(pkg.extras)}
        _pip_install(session, *TEST_TOOLS, *_install_args(members, editable={pkg.dist}))
        if pkg.is_meta:
            session.run("python", str(ROOT / "tools" / "check_pins.py"))
        # Doctests of the package's own modules (imported as tdreplay.<name>.<mod>), then tests/.
        targets = [pkg.src, pkg.path / "tests"]
        _pytest(session, "--doctest-modules", *targets, junit=f"tests-{pkg.short}")

    tests.__doc__ = (
        f"Tests and doctests of {pkg.dist}, alone with its declared dependencies "
        f"(local: {', '.join(sorted(local)) or 'none'})."
    )
    return tests


for _pkg in PACKAGES.values():
    nox.session(
        _make_tests_session(_pkg), name=f"tests-{_pkg.short}", tags=["tests"], allow_parallel=True
    )


@nox.session(allow_parallel=True)
def integration(session: nox.Session) -> None:
    """Cross-package tests in integration_tests/, with every package installed."""
    _setup_venv(session)
    # integration_tests/test_demo.py runs a short demo
    _install_all(session, *DEMO_DEPS, with_tooling=True)
    _pytest(session, ROOT / "integration_tests", junit="integration")


# TorchRL's replay-buffer test suite with only its imports switched to tdreplay (a
# specification to measure against, kept beside the repository; see its README.md).
CONFORMANCE_DIR = ROOT.parent / "shared" / "conformance" / "torchrl-rb"
# Not under .nox/_reports: tools/ci_summary.py totals every report there, and the conformance
# failures (TorchRL features tdreplay lacks) are not failures of the default run.
CONFORMANCE_REPORT = NOX_DIR / "_conformance" / "conformance.xml"


@nox.session(default=False)
def conformance(session: nox.Session) -> None:
    """TorchRL's replay-buffer tests against tdreplay (every package installed); prints the
    counts and the failures grouped by cause. Not in the default run, and exits 0 when tests
    fail: it measures, it does not gate."""
    if not CONFORMANCE_DIR.is_dir():
        session.skip(f"no conformance suite at {CONFORMANCE_DIR} (TorchRL's replay-buffer "
                     "tests with the imports switched to tdreplay): nothing to run")
    _setup_venv(session)
    _install_all(session, with_tooling=True)
    CONFORMANCE_REPORT.parent.mkdir(parents=True, exist_ok=True)
    CONFORMANCE_REPORT.unlink(missing_ok=True)
    # pytest's default import mode (prepend): the suite imports its helpers (_rb_common, ...)
    # as top-level modules; the folder is named on the command line (its conftest.py collects
    # it only then).
    session.run(
        "python", "-m", "pytest", os.path.relpath(CONFORMANCE_DIR, ROOT),
        "-q", "-p", "no:cacheprovider", "--timeout=120", "-rfE",
        f"--junitxml={CONFORMANCE_REPORT}", *session.posargs,
        success_codes=[0, 1],
    )  # fmt: skip
    session.run("python", str(ROOT / "tools" / "conformance_summary.py"),
                str(CONFORMANCE_REPORT))


WHEEL_DIR = NOX_DIR / "_wheels"
VENVS_DIR = NOX_DIR / "_packaging-venvs"

IMPORT_ALL = r"""
import importlib, pkgutil, sys
name = sys.argv[1]
mod = importlib.import_module(name)
imported = [name]
if hasattr(mod, "__path__"):
    def onerror(sub):
        raise
    for info in pkgutil.walk_packages(mod.__path__, prefix=name + ".", onerror=onerror):
        importlib.import_module(info.name)
        imported.append(info.name)
for n in imported:
    f = getattr(sys.modules[n], "__file__", "") or ""
    if "site-packages" not in f:
        sys.exit(f"{n} was imported from {f}, not from the installed wheel")
import torch
assert torch.__version__ == sys.argv[2], torch.__version__
print(f"imported {len(imported)} module(s) of {name}: ok")
"""


CORE_DATA_HINT = r"""
try:
    import tdreplay.data
except ModuleNotFoundError as err:
    assert err.name == "tdreplay.data" and "pip install tdreplay" in str(err), err
    print(f"import tdreplay.data with tdreplay-core alone: {err}")
else:
    raise SystemExit("tdreplay.data imported without the meta-package")
"""

# Run in the meta-package's venv (its wheel installed without extras): neither Ray nor Minari
# nor h5py came with it, the core names work, and a name of an optional component raises the
# ImportError that names its pip install line.
META_NO_EXTRAS = r"""
import importlib.metadata as md, importlib.util, pathlib, sys, sysconfig
heavy = [d for d in ("ray", "minari", "h5py", "tdreplay-distributed", "tdreplay-datasets")
         if importlib.util.find_spec(d.replace("-", ".")) or d in
         {m.metadata["Name"].lower() for m in md.distributions()}]
assert not heavy, f"pip install tdreplay (no extras) installed {heavy}"
import torch
from tensordict import TensorDict
import tdreplay.data as data
from tdreplay.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, Trainer  # noqa
rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(10),
                                       batch_size=4)
rb.extend(TensorDict({"obs": torch.randn(10, 2)}, [10]))
assert rb.sample()["obs"].shape == (4, 2)
assert "RayReplayBuffer" not in data.__all__ and "ReplayBuffer" in data.__all__
for name, extra, dist in [("RayReplayBuffer", "distributed", "tdreplay-distributed"),
                          ("MinariExperienceReplay", "datasets", "tdreplay-datasets")]:
    try:
        exec(f"from tdreplay.data import {name}")
    except ImportError as err:
        msg = str(err)
        assert dist in msg and f'pip install "tdreplay[{extra}]"' in msg, msg
        print(f"from tdreplay.data import {name}: {type(err).__name__}: {msg}")
    else:
        sys.exit(f"{name} imported without tdreplay[{extra}]")
site = pathlib.Path(sysconfig.get_paths()["purelib"])
size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file() and not f.is_symlink())
count = sum(1 for _ in md.distributions())
print(f"pip install tdreplay (no extras): {count} distributions, {size / 2**20:.0f} MiB "
      "(torch, shared, not counted); no ray, minari or h5py")
"""


@nox.session(allow_parallel=True)
def packaging(session: nox.Session) -> None:
    """Build every wheel; install each alone (with its local closure) and import everything."""
    _setup_venv(session)
    session.install(*PIP_INSTALL, *BUILD_DEPS)
    session.run("python", str(ROOT / "tools" / "check_pins.py"))

    shutil.rmtree(WHEEL_DIR, ignore_errors=True)
    WHEEL_DIR.mkdir(parents=True)
    session.run(
        "python", "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--wheel-dir", str(WHEEL_DIR), *(str(p.path) for p in PACKAGES.values()),
    )  # fmt: skip

    wheels: dict[str, Path] = {}
    for whl in WHEEL_DIR.glob("*.whl"):
        wheels[canonicalize_name(whl.name.split("-")[0])] = whl
    missing = set(PACKAGES) - set(wheels)
    if missing:
        session.error(f"no wheel was built for {sorted(missing)}")

    problems = []
    for name, whl in sorted(wheels.items()):
        with zipfile.ZipFile(whl) as zf:
            names = zf.namelist()
        if "tdreplay/__init__.py" in names:
            problems.append(f"{whl.name} ships tdreplay/__init__.py (the namespace is PEP 420)")
        if PACKAGES[name].is_meta:
            # the facade package only: tdreplay/data/ (its own modules, TorchRL's paths)
            code = [n for n in names if ".dist-info/" not in n]
            stray = [n for n in code if not n.startswith("tdreplay/data/")]
            if stray or "tdreplay/data/__init__.py" not in code:
                problems.append(f"{whl.name} must ship only the package tdreplay/data/, "
                                f"ships {code}")
    if problems:
        session.error("\n".join(problems))

    shutil.rmtree(VENVS_DIR, ignore_errors=True)
    VENVS_DIR.mkdir(parents=True)
    pip = [str(Path(session.bin) / "python"), "-m", "pip"]
    for name, pkg in sorted(PACKAGES.items()):
        venv = VENVS_DIR / pkg.short
        session.log(f"[{pkg.dist}] fresh venv with its wheel and its local closure only")
        session.run(sys.executable, "-m", "venv", "--without-pip", str(venv), external=True)
        python = venv / "bin" / "python"
        _link_torch(python)
        # Install with the session's pip (``--python``); the local closure is given as wheel
        # files so pip never looks a sibling up on an index, PyPI dependencies come from PyPI.
        local = [str(wheels[dep]) for dep in sorted(closure(pkg))]
        session.run(
            *pip, "--python", str(python), "install", *PIP_INSTALL,
            "--find-links", str(WHEEL_DIR), str(wheels[name]), *local,
        )  # fmt: skip
        with session.chdir(venv):  # nothing from the repo on sys.path
            session.run(
                str(python), "-I", "-c", IMPORT_ALL, pkg.module, f"{TORCH_VERSION}+cpu",
                external=True,
            )  # fmt: skip
            if pkg.dist == "tdreplay-core":
                # without the meta-package, ``import tdreplay.data`` says what to install
                session.run(str(python), "-c", CORE_DATA_HINT, external=True)
            if pkg.is_meta:
                # ``pip install tdreplay`` without extras: light, and says what it lacks
                session.run(str(python), "-I", "-c", META_NO_EXTRAS, external=True)
    session.log(f"packaging: {len(wheels)} wheels built, installed alone and imported")


LINT_TOOLS = [RUFF, "mypy==2.4.1", "import-linter==2.16"]
# What the type checker and the import graph need of the third-party world: the packages' own
# type information (torch is the shared one; ray, minari, h5py, numba have no types to check
# against and are left out, see mypy.ini).
LINT_DEPS = ["tensordict>=0.15,<0.16", "numpy>=1.26", "packaging"]


@nox.session(allow_parallel=True)
def lint(session: nox.Session) -> None:
    """ruff (with the private-access rules), the import contracts and mypy on every src/.

    - ``ruff check .`` (ruff.toml; ``SLF001``/``PLC2701`` forbid reading another object's
      private attributes and importing private names in packages' ``src/``);
    - ``lint-imports``: contracts generated by ``tools/import_contracts.py`` from the packages
      (declared dependencies only, no private module of another package, no import cycles);
    - ``mypy`` over every package's ``src/`` (mypy.ini; strict on core's public API).
    """
    _setup_venv(session)
    _pip_install(session, *LINT_TOOLS, *LINT_DEPS)
    session.run("ruff", "check", str(ROOT), *session.posargs)
    sources = sorted(str(pkg.path / "src") for pkg in PACKAGES.values())
    contracts = NOX_DIR / "_importlinter.ini"
    session.run("python", str(ROOT / "tools" / "import_contracts.py"), str(contracts))
    session.run("lint-imports", "--config", str(contracts),
                env={"PYTHONPATH": os.pathsep.join(sources)})
    session.run("mypy", "--config-file", str(ROOT / "mypy.ini"),
                *(arg for pkg in PACKAGES.values() for arg in ("-p", pkg.module)),
                env={"MYPYPATH": os.pathsep.join(sources)})


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """benchmarks/run_all.py, every package installed (arguments after -- forwarded)."""
    _setup_venv(session)
    _install_all(session, "matplotlib>=3.7", with_tooling=False)  # run_all.py draws the plot
    session.run("python", str(ROOT / "benchmarks" / "run_all.py"), *session.posargs)


# The peers of ``bench-peers``, each in a virtualenv of its own (they need another tensordict
# than tdreplay's), all seeing the shared CPU torch and installed under its constraint.
# torchrl 0.14.1 installs and imports against torch 2.13.0+cpu, but its C++ extension (the
# segment trees of its prioritized sampler) was built for another torch and does not load:
# its prioritized workloads are reported as skipped, with the reason.
PEER_REQUIREMENTS = {
    "cpprb": ["cpprb==11.0.0", "tensordict>=0.15,<0.16"],  # tensordict: benchmarks/_common.py
    "torchrl": ["torchrl==0.14.1"],
}
PEER_VENVS = NOX_DIR / "_peer-venvs"


@nox.session(name="bench-peers", default=False)
def bench_peers(session: nox.Session) -> None:
    """tdreplay, cpprb, TorchRL and bare torch on the same workloads: benchmarks/peers_run.py.

    Writes benchmarks/results/peers.json (ratios included), peers.png and scaling.png.
    Arguments after -- go to peers_run.py (``--quick``: smaller buffers in the scaling runs).
    """
    _setup_venv(session)
    _install_all(session, "matplotlib>=3.7", with_tooling=False)
    pythons = _peer_pythons(session, PEER_REQUIREMENTS)
    session.run("python", str(ROOT / "benchmarks" / "peers_run.py"), *pythons, *session.posargs)


def _peer_pythons(session: nox.Session, requirements_of: dict[str, list[str]]) -> list[str]:
    """``["--python", "PEER=PATH", ...]``: each peer's virtualenv (made, or brought up to
    date), sharing the session's CPU torch."""
    pip = [str(Path(session.bin) / "python"), "-m", "pip"]
    pythons = []
    for peer, requirements in requirements_of.items():
        venv = PEER_VENVS / peer
        python = venv / "bin" / "python"
        if not python.exists():
            session.run(sys.executable, "-m", "venv", "--without-pip", str(venv), external=True)
        _link_torch(python)  # before anything is installed: pip sees torch, never fetches one
        session.run(*pip, "--python", str(python), "install", *PIP_INSTALL, *requirements)
        session.run(str(python), "-c", CHECK_TORCH, external=True)
        pythons += ["--python", f"{peer}={python}"]
    return pythons


@nox.session(name="bench-instructions", default=False)
def bench_instructions(session: nox.Session) -> None:
    """Instructions per call of tdreplay, cpprb and the floor, counted by valgrind:
    benchmarks/instructions.py (needs valgrind: apt-get install valgrind).

    Writes benchmarks/results/instructions.json. Arguments after -- go to the script
    (``--only sample_256``, ``--capacity N``, ``--keep DIR`` for callgrind's profiles).
    """
    if shutil.which("valgrind") is None:
        session.error("valgrind is not installed (Debian: apt-get install valgrind).")
    _setup_venv(session)
    _install_all(session, with_tooling=False)
    pythons = _peer_pythons(session, {"cpprb": PEER_REQUIREMENTS["cpprb"]})
    session.run("python", str(ROOT / "benchmarks" / "instructions.py"), *pythons,
                *session.posargs)


# What examples/demo.py needs besides the packages: the CartPole environment, the plot and
# the progress bar.
DEMO_DEPS = ["gymnasium>=1.0", "matplotlib>=3.7", "tqdm>=4.60"]


@nox.session(default=False)
def demo(session: nox.Session) -> None:
    """The main job: examples/demo.py, every package installed (arguments after -- forwarded)."""
    _setup_venv(session)
    _install_all(session, *DEMO_DEPS, with_tooling=False)
    session.run("python", str(ROOT / "examples" / "demo.py"), *session.posargs)


# What the documentation build needs besides the packages (all themes and extensions come from
# PyPI at install time; nothing is downloaded while the docs build).
DOCS_DEPS = ["sphinx>=8.1,<10", "furo>=2024.8.6"]
DOCS_DIR = ROOT / "docs"
DOCS_BUILD = DOCS_DIR / "_build"


@nox.session(default=False)
def docs(session: nox.Session) -> None:
    """Sphinx docs into docs/_build/html: guide examples run (doctest), warnings are errors."""
    _setup_venv(session)
    _install_all(session, *DOCS_DEPS, with_tooling=False)
    # -E: a fresh environment every time, so pages built from data files (the benchmark
    # results) never come from a stale cache.
    common = ["-W", "--keep-going", "-E", "-d", str(DOCS_BUILD / "doctrees"), *session.posargs]
    # The doctest builder runs every example of the guides and fails the session if any is
    # broken (all are reported); only then is the HTML built.
    for builder in ("doctest", "html"):
        session.run(
            "python", "-m", "sphinx", "-b", builder, *common, str(DOCS_DIR),
            str(DOCS_BUILD / builder),
        )  # fmt: skip
    session.log(f"HTML: {DOCS_BUILD / 'html' / 'index.html'}")


DIST_DIR = ROOT / "dist"


@nox.session(default=False)
def release(session: nox.Session) -> None:
    """Every wheel and sdist into dist/, after the version checks (tools/check_pins.py).

    Refuses (before building anything) when the meta-package does not pin every component at
    its version, or when a package's range on a sibling does not admit the sibling's version
    (a version bump that its dependents' ranges no longer admit). Not in the default run.
    """
    session.install("--quiet", "--no-compile", *BUILD_DEPS, "build>=1.2", "packaging>=23")
    session.run("python", str(ROOT / "tools" / "check_pins.py"))
    shutil.rmtree(DIST_DIR, ignore_errors=True)
    DIST_DIR.mkdir()
    for pkg in PACKAGES.values():
        session.run(
            "python", "-m", "build", "--no-isolation", "--sdist", "--wheel",
            "--outdir", str(DIST_DIR), str(pkg.path),
        )  # fmt: skip
    built = sorted(p.name for p in DIST_DIR.iterdir())
    wheels = [n for n in built if n.endswith(".whl")]
    sdists = [n for n in built if n.endswith(".tar.gz")]
    if len(wheels) != len(PACKAGES) or len(sdists) != len(PACKAGES):
        session.error(f"expected {len(PACKAGES)} wheels and sdists in {DIST_DIR}, got {built}")
    session.log(f"release: {len(wheels)} wheels and {len(sdists)} sdists in {DIST_DIR}: "
                + ", ".join(built))


# The default run; the slowest session first, so that it overlaps the others under --parallel.
nox.options.sessions = [
    "packaging",
    *(f"tests-{p.short}" for p in PACKAGES.values()),
    "integration",
    "lint",
]


def _selects_sessions(argv: list[str]) -> bool:
    """Whether the command line picks sessions itself (``-s``, ``-k``, ``-t``, ``-e``, ...)."""
    flags = ("-s", "-e", "-k", "-t", "-p", "-l", "--session", "--keywords", "--tags", "--python")
    return bool(os.environ.get("NOXSESSION")) or any(
        arg.startswith(flags) and not arg.startswith("--parallel") for arg in argv[1:]
    )


# The default run (plain ``nox``, as in CI) runs two sessions at a time: their installs wait on
# the network and the disk, so this cuts its wall time by about a third on 2 cores.  A session
# picked by name (``nox -s demo``, ``nox -s tests-core``) runs alone with live output.
# ``nox -j 1`` forces a sequential run.
if not _selects_sessions(sys.argv):
    nox.options.parallel = 2
