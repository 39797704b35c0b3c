"""The history's tables (SQLAlchemy Core): sessions, their transcript entries and the app's own settings.

The migrations (realtime/store/migrations) create and change them; this module is what the code reads and writes.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

sessions = sa.Table(
    "sessions", metadata,
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
    sa.Column("made_at", sa.Float),
)
"""One row per live session (page, WebRTC client or Realtime API connection). `state`: live, ended or interrupted
(its process ended without closing it). `engine` and `model` made its text, at `made_at` when a retranscription did
(else as it went)."""

entries = sa.Table(
    "entries", metadata,
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
"""A session's transcript: each closed segment's final (or error), in parts where the speaker changes inside it.
`words` is JSON ([[word, start, end], ...]) where the session asked for word times."""

settings = sa.Table(
    "settings", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
"""What instances sharing the database share: the secret of the transcripts' tokens."""

versions = sa.Table(
    "versions", metadata,
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
"""The texts a session had before a retranscription replaced them, numbered from 1 (the live draft): who made each,
when, and its entries as JSON (a list of the entries' columns)."""
