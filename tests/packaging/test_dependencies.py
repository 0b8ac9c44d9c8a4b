"""Every package idemctl imports is declared by the install that needs it.

typer 0.26 stopped installing click, and ``idemctl --version`` broke for every fresh install
while the suite, whose dev extras pulled click in through other packages, passed. Two checks
keep that from happening again:

- statically: each import in idemctl/ comes from a distribution that pyproject.toml names
  directly, in the base dependencies or in an extra that the module's row of NEEDS allows,
  not from whatever else happened to install it. Imports under ``if TYPE_CHECKING:`` are
  exempt, and so are optional ones: in a ``try`` whose ImportError handler falls back
  instead of raising (pydantic in idemctl.faststream, hiredis);
- in real venvs (slow): the wheel with nothing but the base install, then with one extra
  more. Every module imports, or fails only for want of a package that one of its own
  extras, not installed there, declares.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "idemctl"

NEEDS: dict[str, set[str]] = {
    "idemctl.stores.postgres.store_async": {"postgres"},
    "idemctl.stores.postgres.core_async": {"postgres"},
    "idemctl.stores.postgres.drive_async": {"postgres"},
    "idemctl.stores.postgres.steps_async": {"postgres"},
    "idemctl.stores.redis.store_async": {"redis"},
    "idemctl.stores.redis.core_async": {"redis"},
    "idemctl.stores.redis.connections_async": {"redis"},
    "idemctl.stores.redis.runner_async": {"redis"},
    "idemctl.stores.redis.steps_async": {"redis"},
    "idemctl.stores.postgres.unit_async": {"postgres"},
    "idemctl.audit": {"kafka"},
    "idemctl.console": {"console"},
    "idemctl.consume": {"kafka"},
    "idemctl.consume.traced": {"otel"},
    "idemctl.faststream": {"faststream"},
    "idemctl.fence.dynamodb": {"dynamodb"},  # imported where the write is made
    "idemctl.fence.redis": {"redis"},
    "idemctl.fence.sqlalchemy": {"sqlalchemy"},
    "idemctl.fence.alembic": {"sqlalchemy"},
    "idemctl.harness": {"kafka"},
    "idemctl.http.django": {"django"},
    "idemctl.http.fastapi": {"fastapi"},
    "idemctl.outbox": {"kafka"},
    "idemctl.outbox.relay": {"kafka", "otel"},
    "idemctl.outbox.wakeup": {"postgres"},  # LISTEN on the store's own server
    "idemctl.powertools.dynamodb": {"dynamodb"},
    "idemctl.powertools.keys": {"dynamodb", "redis"},
    "idemctl.powertools.redis": {"redis"},
    "idemctl.stores.dynamodb": {"dynamodb"},
    "idemctl.stores.postgres": {"postgres"},
    "idemctl.stores.redis": {"redis"},
    "idemctl.tasks.arq": {"arq"},
    "idemctl.tasks.celery": {"celery"},
    "idemctl.tasks.dramatiq": {"dramatiq"},
    "idemctl.tasks.rq": {"rq"},
    "idemctl.tasks.taskiq": {"taskiq"},
    "idemctl.tracing": {"otel"},
}
"""Module (or package) -> the extras whose packages it may import; the longest matching
name wins, and a module no row names may import only what the base install declares."""

INSTALLS = [
    None,
    "redis",
    "postgres",
    "dynamodb",
    "kafka",
    "otel",
    "faststream",
    "console",
    "django",
    "fastapi",
    "sqlalchemy",
    "celery",
    "dramatiq",
    "rq",
    "taskiq",
    "arq",
]
"""The installs the slow test makes a venv of: the base alone, then each extra whose
packages idemctl imports (demo adds a broker binary; all, bench, test and dev add no import
of idemctl's own)."""


def needs(module: str) -> set[str]:
    matches = [n for n in NEEDS if module == n or module.startswith(n + ".")]
    return NEEDS[max(matches, key=len)] if matches else set()


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield module_name(path), path


# What pyproject.toml declares ----------------------------------------------------------


@functools.cache
def pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def declared(extra: str | None) -> set[str]:
    """The distributions the base install (None), or the base with ``extra``, names
    directly: an extra's own list, and the lists of the extras it names (``idemctl[kafka]``)."""
    project = pyproject()
    lines = list(project["dependencies"])  # type: ignore[call-overload]
    if extra is not None:
        lines += project["optional-dependencies"][extra]  # type: ignore[index]
    names = set()
    for line in lines:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "idemctl":
            names |= set().union(*(declared(e) for e in requirement.extras))
        else:
            names.add(canonicalize_name(requirement.name))
    return names


def extras_in(extra: str | None) -> set[str]:
    """``extra`` and the extras it names (demo: demo and kafka)."""
    if extra is None:
        return set()
    found = {extra}
    for line in pyproject()["optional-dependencies"][extra]:  # type: ignore[index]
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "idemctl":
            found |= set().union(*(extras_in(e) for e in requirement.extras))
    return found


def allowed(module: str) -> set[str]:
    return declared(None).union(*(declared(e) for e in needs(module)))


# What the code imports -----------------------------------------------------------------


def imports(path: Path) -> Iterator[tuple[str, int]]:
    """(module, line) of each import that runs and is not optional."""

    def is_type_checking(test: ast.expr) -> bool:
        return getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"

    def falls_back(handler: ast.ExceptHandler) -> bool:
        caught = handler.type
        names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        about_imports = any(
            getattr(n, "id", None) in ("ImportError", "ModuleNotFoundError") for n in names
        )
        return about_imports and not any(isinstance(n, ast.Raise) for n in ast.walk(handler))

    def visit(node: ast.AST, optional: bool) -> Iterator[tuple[str, int]]:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                yield from visit(child, optional)
            return
        if isinstance(node, ast.Try):
            guarded = optional or any(falls_back(h) for h in node.handlers)
            for child in node.body:
                yield from visit(child, guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                yield from visit(child, optional)
            return
        if not optional and isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        if not optional and isinstance(node, ast.ImportFrom) and node.level == 0:
            assert node.module is not None
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield (submodule if _is_module(submodule) else node.module), node.lineno
        for child in ast.iter_child_nodes(node):
            yield from visit(child, optional)

    yield from visit(ast.parse(path.read_text(encoding="utf-8")), False)


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


LOCAL = {"__future__", "idemctl", "tests", "examples"} | {
    p.stem for p in (REPO / "examples").glob("*.py")
}
"""Names that are not distributions: the package, the tests, the examples (the docs tests
import them)."""


def third_party(name: str) -> bool:
    top = name.split(".", maxsplit=1)[0]
    return top not in sys.stdlib_module_names and top not in LOCAL


@functools.cache
def _top_level() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def _files_of(distribution: str) -> frozenset[Path]:
    """The installed files of ``distribution`` (for names several distributions share,
    such as the opentelemetry namespace: only theirs are looked at, not every file of
    every distribution in the venv)."""
    dist = importlib.metadata.distribution(distribution)
    return frozenset(Path(str(dist.locate_file(file))).resolve() for file in dist.files or [])


ELSEWHERE = {"arq": "arq"}
"""Modules of distributions that cannot be installed beside the test extra, and those
distributions: arq requires redis-py below 6 (scripts/test-arq tests it in a venv of its
own)."""


def distribution_of(name: str) -> str | None:
    """The installed distribution that provides module ``name``, or None."""
    top = name.split(".", maxsplit=1)[0]
    if top in ELSEWHERE and top not in _top_level():
        return ELSEWHERE[top]
    candidates = sorted(set(_top_level().get(top, [])))
    if len(candidates) == 1:
        return canonicalize_name(candidates[0])
    spec = importlib.util.find_spec(name) if candidates else None
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    owner = next((c for c in candidates if origin in _files_of(c)), None)
    return None if owner is None else canonicalize_name(owner)


def undeclared(files: list[tuple[Path, set[str]]]) -> tuple[int, list[str]]:
    """How many third-party imports ``files`` (each with the distributions it may import
    from) make, and each one from a distribution not among its own."""
    wrong, checked = [], 0
    extras = list(pyproject()["optional-dependencies"])  # type: ignore[call-overload]
    for path, allowed_here in files:
        for name, line in dict.fromkeys(imports(path)):
            if not third_party(name):
                continue
            checked += 1
            where = f"{path.relative_to(REPO)}:{line} imports {name}"
            dist = distribution_of(name)
            if dist is None:
                wrong.append(f"{where}, which no installed distribution provides")
            elif dist not in allowed_here:
                by = sorted(e for e in extras if dist in declared(e))
                why = f"only the extras {by} declare it" if by else "no extra declares it"
                wrong.append(f"{where} from {dist}, not allowed here: {why}")
    return checked, wrong


def test_every_import_is_declared_by_the_install_that_needs_it() -> None:
    checked, wrong = undeclared([(path, allowed(module)) for module, path in modules()])
    assert checked > 50  # the walk found the imports: typer, rich, redis, psycopg, boto3, ...
    assert wrong == []


def test_every_test_import_is_declared_by_the_test_extra() -> None:
    """The tests run on ``pip install '.[test]'`` alone, at the lowest versions too."""
    checked, wrong = undeclared(
        [
            (path, declared("test") | (declared("arq") if path.name == "test_arq.py" else set()))
            for path in sorted((REPO / "tests").rglob("*.py"))
        ]
    )
    assert checked > 100
    assert wrong == []


def test_needs_names_real_modules_and_extras() -> None:
    names = {module for module, _ in modules()}
    extras = set(pyproject()["optional-dependencies"])  # type: ignore[arg-type]
    for module, wanted in NEEDS.items():
        assert any(n == module or n.startswith(module + ".") for n in names), module
        assert wanted <= extras, (module, wanted)


def test_the_check_sees_an_undeclared_import(tmp_path: Path) -> None:
    """click, as the CLI imported it before: installed here (flask needs it), declared nowhere."""
    source = tmp_path / "cli.py"
    source.write_text("import typer\nimport click\nif True:\n    from click import echo\n")
    found = [(name, line) for name, line in imports(source) if third_party(name)]
    assert found == [("typer", 1), ("click", 2), ("click", 4)]
    assert distribution_of("click") == "click"
    assert "click" not in allowed("idemctl.cli.common")
    assert "typer" in allowed("idemctl.cli.common")


def test_imports_under_type_checking_or_with_a_fallback_are_exempt(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import boto3\n"
        "try:\n    import pydantic\nexcept ModuleNotFoundError:\n    pydantic = None\n"
        "try:\n    import aiokafka\nexcept ModuleNotFoundError as exc:\n"
        "    raise SystemExit(1) from exc\n"
    )
    assert [name for name, _ in imports(source) if third_party(name)] == ["aiokafka"]


# The installs themselves ---------------------------------------------------------------


def uv(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "uv", *args, "--quiet"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("extra", INSTALLS, ids=[e or "base" for e in INSTALLS])
def test_each_install_imports_every_module_it_declares(
    extra: str | None, wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    uv("venv", "--python", sys.executable, str(venv))
    wanted = "idemctl" if extra is None else f"idemctl[{extra}]"
    uv("pip", "install", "--python", python, f"{wanted} @ {wheel.as_uri()}")
    done = subprocess.run(
        [python, str(Path(__file__).with_name("import_all.py"))],
        cwd=tmp_path,  # not the checkout: the installed wheel is what is imported
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    outcomes: dict[str, dict[str, str] | None] = json.loads(done.stdout)
    assert set(outcomes) == {module for module, _ in modules()} - {"idemctl.__main__"}

    installed = extras_in(extra)
    wrong = []
    for module, outcome in outcomes.items():
        if outcome is None:
            continue
        if "error" in outcome:
            wrong.append(f"{module}: {outcome['error']}")
            continue
        missing = outcome["missing"]
        dist = distribution_of(missing)
        elsewhere = needs(module) - installed
        if dist is None or dist not in set().union(*(declared(e) for e in elsewhere)):
            wrong.append(
                f"{module} needs {missing} ({dist}), which none of its extras that this "
                f"install lacks ({sorted(elsewhere)}) declares"
            )
    assert wrong == []
    # The venv holds only this install: without redis-py (the redis extra's, or that of a
    # queue on Redis: rq, arq), the Redis store cannot load.
    redis_store = outcomes["idemctl.stores.redis"]
    brought = installed & {"redis", "rq", "arq"}
    assert redis_store == (None if brought else {"missing": "redis"})
