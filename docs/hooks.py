"""mkdocs hooks: pages written from the code at build time, so they cannot drift from it.

- ``reference/cli.md``: the marker ``<!-- idemctl --help -->`` becomes every command's
  help, written by typer's own Markdown generator from the app ``idemctl --help`` shows.
- ``reference/schemas.md``: the marker ``<!-- schemas -->`` becomes each file of
  ``schemas/``, as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cli_reference() -> str:
    import typer
    from typer.cli import get_docs_for_click

    from idemctl.cli import app
    from idemctl.cli.exitcodes import exit_code_table
    from idemctl.cli.lazy import load_all

    load_all()
    command = typer.main.get_command(app)
    with typer.Context(command, info_name="idemctl") as ctx:
        text = get_docs_for_click(obj=command, ctx=ctx, name="idemctl", title="idemctl")
    # --help's plain table of exit codes, as a list on the page
    text = text.replace(command.epilog, "**Exit codes**\n\n" + exit_code_table(markdown=True))
    # One page, its own title above: typer's headings go one level down.
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())


def schemas_reference() -> str:
    parts = ["## What `--json` prints\n"]
    for path in sorted((ROOT / "schemas").glob("*.schema.json")):
        schema = json.loads(path.read_text())
        text = json.dumps(schema, indent=2)
        parts.append(
            f"### `{path.name}`\n\n{schema.get('title', '')}\n\n" + folded(path.name, "json", text)
        )
    parts.append("## What `idemctl init` creates\n")
    for name, language in (
        ("sqlite.sql", "sql"),
        ("postgres.sql", "sql"),
        ("dynamodb.json", "json"),
    ):
        text = (ROOT / "schemas" / name).read_text()
        parts.append(f"### `{name}`\n\n" + folded(name, language, text))
    return "\n".join(parts)


def folded(name: str, language: str, text: str) -> str:
    """``text`` in a block that opens on a click."""
    body = "\n".join("    " + line if line else "" for line in text.rstrip().splitlines())
    return f'??? note "{name}"\n\n    ```{language}\n{body}\n    ```\n'


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == "reference/cli.md":
        return markdown.replace("<!-- idemctl --help -->", cli_reference())
    if page.file.src_uri == "reference/schemas.md":
        return markdown.replace("<!-- schemas -->", schemas_reference())
    return markdown
