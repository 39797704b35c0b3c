"""Versions: the text a session had before a retranscription replaced it (the live draft, an earlier pass).

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "versions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(128), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("made_at", sa.Float, nullable=False),
        sa.Column("replaced_at", sa.Float, nullable=False),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("entries", sa.Text, nullable=False),
        sa.UniqueConstraint("session_id", "number", name="versions_number"),
    )
    op.add_column("sessions", sa.Column("made_at", sa.Float))


def downgrade() -> None:
    op.drop_column("sessions", "made_at")
    op.drop_table("versions")
