"""What both transactional test apps (tx_app.py, tx_wsgi_app.py) write: nothing here reads
the environment at import, so the suite's import checks can look these modules up."""

from __future__ import annotations

import os

from psycopg import sql


def insert() -> sql.Composed:
    """The one row a payment writes: (key, amount), into ``$PAYMENTS``."""
    return sql.SQL("INSERT INTO {} (key, amount) VALUES (%s, %s)").format(
        sql.Identifier(os.environ["PAYMENTS"])
    )
