"""The history: sessions, entries (with full-text search) and settings.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("title", sa.String(200)),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("instance", sa.String(32), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("language", sa.String(16)),
    )
    op.create_index("sessions_started", "sessions", ["started_at"])
    op.create_index("sessions_state", "sessions", ["state"])
    op.create_table(
        "entries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(128), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("segment", sa.Integer, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("start_s", sa.Float, nullable=False),
        sa.Column("end_s", sa.Float, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("language", sa.String(16)),
        sa.Column("speaker", sa.String(64)),
        sa.Column("latency", sa.Float),
        sa.Column("words", sa.Text),
        sa.UniqueConstraint("session_id", "segment", "part", name="entries_position"),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    if op.get_bind().dialect.name == "sqlite":
        # an external-content FTS5 index of the entries' text, kept by triggers
        op.execute("CREATE VIRTUAL TABLE entries_fts USING fts5(text, content='entries', content_rowid='id')")
        op.execute("CREATE TRIGGER entries_fts_insert AFTER INSERT ON entries BEGIN "
                   "INSERT INTO entries_fts(rowid, text) VALUES (new.id, new.text); END")
        op.execute("CREATE TRIGGER entries_fts_delete AFTER DELETE ON entries BEGIN "
                   "INSERT INTO entries_fts(entries_fts, rowid, text) VALUES ('delete', old.id, old.text); END")
        op.execute("CREATE TRIGGER entries_fts_update AFTER UPDATE OF text ON entries BEGIN "
                   "INSERT INTO entries_fts(entries_fts, rowid, text) VALUES ('delete', old.id, old.text); "
                   "INSERT INTO entries_fts(rowid, text) VALUES (new.id, new.text); END")
    else:
        op.execute("CREATE INDEX entries_fts ON entries USING gin (to_tsvector('simple', text))")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TABLE entries_fts")
    op.drop_table("settings")
    op.drop_table("entries")
    op.drop_table("sessions")
