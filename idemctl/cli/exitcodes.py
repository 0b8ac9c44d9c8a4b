"""The exit codes as ``idemctl --help`` and the manual show them (``idemctl.exitcodes`` holds
the table and which error gives which)."""

from __future__ import annotations

from idemctl.exitcodes import MEANINGS, ExitCode, exit_code_for

__all__ = ["MEANINGS", "ExitCode", "exit_code_for", "exit_code_table"]


def exit_code_table(markdown: bool = False, width: int | None = None) -> str:
    """The table as a markdown list, or as lines (each wrapped to ``width`` if given)."""
    if markdown:
        return "\n".join(f"- **{int(code)}** {MEANINGS[code]}" for code in ExitCode)
    if width is None:
        return "\n".join(f"{int(code):>3}  {MEANINGS[code]}" for code in ExitCode)
    from textwrap import fill

    return "\n".join(
        fill(
            MEANINGS[code],
            width,
            initial_indent=f"{int(code):>3}  ",
            subsequent_indent=" " * 5,
            break_on_hyphens=False,
        )
        for code in ExitCode
    )
