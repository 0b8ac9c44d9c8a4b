#!/usr/bin/env python3
"""Derive idemctl's sync code from its async original, so it is written once.

Every piece of idemctl that exists for both sync and async callers is written once, for
asyncio (a store family's async half beside its sync one, ``*_async.py`` under
``idemctl/stores/``; the runner's under ``idemctl/aio/``; the HTTP middleware's attempt in
``idemctl/http/attempt_aio.py``), and this script writes its sync module (``FILES``).

It reads the original's syntax tree (``ast``), not its text: ``async def``/``async with``/
``async for`` become their plain forms, ``await x`` becomes ``x``, ``Awaitable[T]``
becomes ``T``, and the async names (``NAMES``, ``MODULES``: ``AsyncStore`` -> ``Store``,
``idemctl.aio.beat`` -> ``idemctl.runner.beat``, ...) are renamed in code, imports and
docstrings, as whole names, never inside a longer one. The few lines that must differ
between the two say so in the original with ``idemctl._unasync.is_async()``::

    if is_async():
        await asyncio.sleep(pause)  # what the async original runs
    else:
        time.sleep(pause)  # all the sync module holds

(``if is_async() and ...:`` likewise; and ``a if is_async() else b``, which becomes
``b``). There is no other exception, no rule for one file: the heartbeat's schedule (the
loop's timer, or the thread scheduler of ``idemctl.runner.schedule``) and the PostgreSQL
pool's loop binding are such lines. The tree is written back with ``ast.unparse`` and
formatted with ruff; comments do not survive (the sync module is read in its original, as
psycopg's are), docstrings do.

    scripts/unasync.py           write the sync modules
    scripts/unasync.py --check   exit 1, naming the files, when one differs from its original

Model: psycopg's ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FILES = {
    "idemctl/aio/attempt.py": "idemctl/runner/attempt.py",
    "idemctl/aio/holding.py": "idemctl/runner/holding.py",
    "idemctl/stores/postgres/unit_async.py": "idemctl/stores/postgres/unit.py",
    "idemctl/aio/outbox.py": "idemctl/outbox/writer.py",
    "idemctl/stores/postgres/steps_async.py": "idemctl/stores/postgres/steps.py",
    "idemctl/stores/postgres/drive_async.py": "idemctl/stores/postgres/drive.py",
    "idemctl/stores/redis/steps_async.py": "idemctl/stores/redis/steps.py",
    "idemctl/stores/redis/runner_async.py": "idemctl/stores/redis/runner.py",
    "idemctl/stores/front_async.py": "idemctl/stores/front.py",
    "idemctl/aio/decorator.py": "idemctl/runner/decorator.py",
    "idemctl/aio/beat.py": "idemctl/runner/beat.py",
    "idemctl/aio/heartbeat.py": "idemctl/runner/heartbeat.py",
    "idemctl/stores/postgres/pool_async.py": "idemctl/stores/postgres/pool.py",
    "idemctl/http/attempt_aio.py": "idemctl/http/attempt.py",
}
"""Each async original and the sync module written from it."""

MODULES = {
    "idemctl.aio": "idemctl.stores",
    "idemctl.aio.opening": "idemctl.stores",
    "idemctl.aio.attempt": "idemctl.runner.attempt",
    "idemctl.aio.holding": "idemctl.runner.holding",
    "idemctl.aio.context": "idemctl.runner.context",
    "idemctl.aio.beat": "idemctl.runner.beat",
    "idemctl.stores.front_async": "idemctl.stores.front",
    "idemctl.aio.heartbeat": "idemctl.runner.heartbeat",
    "idemctl.http.attempt_aio": "idemctl.http.attempt",
    "idemctl.aio.outbox": "idemctl.outbox.writer",
    "idemctl.stores.postgres.store_async": "idemctl.stores.postgres.store",
    "idemctl.stores.postgres.core_async": "idemctl.stores.postgres.core",
    "idemctl.stores.postgres.drive_async": "idemctl.stores.postgres.drive",
    "idemctl.stores.postgres.steps_async": "idemctl.stores.postgres.steps",
    "idemctl.stores.redis.core_async": "idemctl.stores.redis.core",
    "idemctl.stores.redis.connections_async": "idemctl.stores.redis.connections",
    "idemctl.stores.redis.runner_async": "idemctl.stores.redis.runner",
    "idemctl.stores.redis.steps_async": "idemctl.stores.redis.steps",
    "idemctl.stores.base_async": "idemctl.stores.base",
    "idemctl.stores.postgres.unit_async": "idemctl.stores.postgres.unit",
    "idemctl.stores.postgres.pool_async": "idemctl.stores.postgres.pool",
}
"""Modules renamed in imports (and in docstrings)."""

NAMES = {
    "AsyncClient": "Client",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncPool": "Pool",
    "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor",
    "AsyncFront": "Front",
    "AsyncDirect": "Connections",
    "AsyncIterator": "Iterator",
    "AsyncOutbox": "Outbox",
    "AsyncPipeline": "Pipeline",
    "AsyncPostgresCore": "PostgresCore",
    "AsyncPostgresSteps": "PostgresSteps",
    "AsyncPostgresStore": "PostgresStore",
    "AsyncRedisCore": "RedisCore",
    "AsyncRedisSteps": "RedisSteps",
    "AsyncScriptRunner": "ScriptRunner",
    "AsyncStore": "Store",
    "AsyncTransactionalStore": "TransactionalStore",
    "AsyncUnit": "Unit",
    "asynccontextmanager": "contextmanager",
    "drive_async": "drive",
    "wait_async": "wait",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
}
"""Names renamed wherever they stand: variables, attributes, arguments, definitions,
imported names, and whole words of docstrings."""

ESCAPE = "is_async"
ESCAPE_MODULE = "idemctl._unasync"

WORDS = {**MODULES, **NAMES}
WORD = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(WORDS, key=len)[::-1]) + r")\b")

AWAIT = re.compile(r"\bawait ")
ASYNC = re.compile(r"\basync (def|with|for) ")
"""In docstrings (their examples), as in code."""


def _docstring_words(text: str) -> str:
    return WORD.sub(lambda m: WORDS[m.group(1)], AWAIT.sub("", ASYNC.sub(r"\1 ", text)))


def _is_escape(test: ast.expr) -> bool:
    """``is_async()``, or ``is_async() and ...``: true in the original, false in its sync
    module."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return _is_escape(test.values[0])
    return (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == ESCAPE
        and not test.args
        and not test.keywords
    )


class Unasync(ast.NodeTransformer):
    """The sync form of an async module's tree (``original`` names its file)."""

    def __init__(self, original: str) -> None:
        self.original = original

    # The escape -------------------------------------------------------------------------------

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
        if _is_escape(node.test):
            return [s for child in node.orelse for s in self._statements(child)]
        self.generic_visit(node)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        if _is_escape(node.test):
            return self.visit(node.orelse)  # type: ignore[no-any-return]
        self.generic_visit(node)
        return node

    def _statements(self, node: ast.stmt) -> list[ast.stmt]:
        done = self.visit(node)
        if done is None:
            return []
        return done if isinstance(done, list) else [done]

    # async and await --------------------------------------------------------------------------

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        plain = ast.FunctionDef(**{f: getattr(node, f) for f in node._fields})
        return self.visit_FunctionDef(ast.copy_location(plain, node))

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.AST:
        plain = ast.With(**{f: getattr(node, f) for f in node._fields})
        return self.generic_visit(ast.copy_location(plain, node))

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        plain = ast.For(**{f: getattr(node, f) for f in node._fields})
        return self.generic_visit(ast.copy_location(plain, node))

    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)  # type: ignore[no-any-return]

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        node.is_async = 0
        return self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "Awaitable":
            return self.visit(node.slice)  # type: ignore[no-any-return]
        return self.generic_visit(node)

    # Names ------------------------------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = NAMES.get(node.id, node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        node.attr = NAMES.get(node.attr, node.attr)
        return self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = NAMES.get(node.arg, node.arg)
        return self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> ast.AST:
        if node.arg is not None:
            node.arg = NAMES.get(node.arg, node.arg)
        return self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = NAMES.get(node.name, node.name)
        return self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = NAMES.get(node.name, node.name)
        return self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            node.value.value = _docstring_words(node.value.value)  # a docstring
            return node
        return self.generic_visit(node)

    def visit_Module(self, node: ast.Module) -> ast.AST:
        self.generic_visit(node)
        self._origin(node.body)
        return node

    def visit_Import(self, node: ast.Import) -> ast.AST:
        for alias in node.names:
            alias.name = MODULES.get(alias.name, alias.name)
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        if node.module == ESCAPE_MODULE:
            return None
        if node.module is not None:
            node.module = MODULES.get(node.module, node.module)
        for alias in node.names:
            alias.name = NAMES.get(alias.name, alias.name)
            if alias.asname is not None:
                alias.asname = NAMES.get(alias.asname, alias.asname)
        return node

    def _origin(self, body: list[ast.stmt]) -> None:
        """The module's docstring says what it is written from, not what it is the original of
        (its words renamed already, by ``visit_Expr``)."""
        match body:
            case [ast.Expr(value=ast.Constant(value=str(text)) as doc), *_] if (
                self.original in FILES
            ):
                doc.value = text.replace(
                    f"This module is the original of ``{_module(FILES[self.original])}`` "
                    "(scripts/unasync.py).",
                    f"Written by scripts/unasync.py from ``{_module(self.original)}``.",
                )


class _Unparser(ast._Unparser):  # type: ignore[name-defined,misc]
    """``ast.unparse``, except that a string the original wrote over several lines (an
    implicit concatenation, a triple-quoted text) is written as the original wrote it, and
    a string standing as a statement (an attribute's docstring) as a docstring: otherwise
    it would come out as one long line."""

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            self._write_docstring(node.value)
        else:
            super().visit_Expr(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not self._as_written(node):
            super().visit_Constant(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if not self._as_written(node):
            super().visit_JoinedStr(node)

    def _as_written(self, node: ast.expr) -> bool:
        written = getattr(node, WRITTEN, None)
        if written is None:
            return False
        parsed = ast.parse(f"({written})", mode="eval").body
        if ast.dump(parsed) != ast.dump(node):  # renamed inside since: write it anew
            return False
        self.write(f"({written})")
        return True


WRITTEN = "_unasync_written"


def _keep_as_written(tree: ast.AST, text: str) -> None:
    """Mark the strings written over several lines with their text (for ``_Unparser``)."""
    statements = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant | ast.JoinedStr)
            and (isinstance(node, ast.JoinedStr) or isinstance(node.value, str))
            and node.lineno != node.end_lineno
            and id(node) not in statements
        ):
            setattr(node, WRITTEN, ast.get_source_segment(text, node))


def unasync(text: str, original: str) -> str:
    """The sync module for the async ``text`` (from file ``original``), unformatted."""
    tree = ast.parse(text, filename=original)
    _keep_as_written(tree, text)
    tree = Unasync(original).visit(tree)
    for node in ast.walk(tree):  # a block that held only async-only lines
        if getattr(node, "body", None) == [] and not isinstance(node, ast.Module):
            node.body = [ast.Pass()]  # type: ignore[attr-defined]
    tree = ast.fix_missing_locations(tree)
    header = (
        f"# Written by scripts/unasync.py from {original}.\n"
        "# Do not edit: change that file and run the script (scripts/test checks the two agree).\n"
    )
    return header + _Unparser().visit(tree) + "\n"


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def formatted(text: str, path: str) -> str:
    """``text`` as ruff leaves it: imports sorted, the unused ones gone, no parentheses
    around a lone argument, formatted."""
    ruff = [sys.executable, "-m", "ruff"]
    fixed = subprocess.run(  # noqa: S603 (ruff, on our own source)
        [*ruff, "check", "--fix-only", "--select", "I,F401,UP034", "--stdin-filename", path, "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return subprocess.run(  # noqa: S603
        [*ruff, "format", "--stdin-filename", path, "-"],
        input=fixed,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail on drift, write nothing")
    args = parser.parse_args()
    drifted = []
    for original, derived in FILES.items():
        text = formatted(unasync((ROOT / original).read_text(), original), derived)
        target = ROOT / derived
        if args.check:
            if not target.exists() or target.read_text() != text:
                drifted.append(derived)
        elif not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {derived}")
    for derived in drifted:
        original = next(o for o, d in FILES.items() if d == derived)
        print(
            f"{derived} differs from what {original} gives: change {original}, not the "
            "sync copy, and run scripts/unasync.py",
            file=sys.stderr,
        )
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
