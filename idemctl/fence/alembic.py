"""The fence's columns in an Alembic migration (``idemctl.fence.sql``'s ``idemctl_key`` and
``idemctl_token``), for the tables your fenced writes go to:

    from idemctl.fence.alembic import add_fence_columns, drop_fence_columns

    def upgrade() -> None:
        add_fence_columns("charges")

    def downgrade() -> None:
        drop_fence_columns("charges")
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Text

from idemctl.fence.sql import KEY_COLUMN, TOKEN_COLUMN

__all__ = ["add_fence_columns", "drop_fence_columns"]


def add_fence_columns(table: str, *, schema: str | None = None) -> None:
    """``op.add_column`` of the two columns to ``table`` (nullable: the rows there already
    carry no fence, and any fenced write accepts them)."""
    from alembic import op

    op.add_column(table, Column(KEY_COLUMN, Text(), nullable=True), schema=schema)
    op.add_column(table, Column(TOKEN_COLUMN, BigInteger(), nullable=True), schema=schema)


def drop_fence_columns(table: str, *, schema: str | None = None) -> None:
    """``op.drop_column`` of the two columns (SQLite: inside ``op.batch_alter_table``'s
    copy, as Alembic does for any dropped column there)."""
    from alembic import op

    for column in (TOKEN_COLUMN, KEY_COLUMN):
        op.drop_column(table, column, schema=schema)
