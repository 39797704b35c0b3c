"""The history's database: where it lives (SQLite in the data directory, or PostgreSQL), its migrations, and every
read and write of sessions and their transcripts.

One layer for both databases (SQLAlchemy Core); full-text search is SQLite's FTS5 or PostgreSQL's text search.
A newer version of the app upgrades an older database when it opens it (Alembic). Calls block: the recorder runs
writes on its own thread, the routes run reads in a thread.
"""

from __future__ import annotations

import fcntl
import json
import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.pool import StaticPool

from ..engines.types import Word
from ..live.transcript import Entry
from . import schema
from .liveness import AdvisoryLocks, FileLocks, Liveness, NoLocks

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
PREVIEW_CHARS = 120
TITLE_CHARS = 200
MAX_WORDS = 8
"""A search takes the first so many words typed."""


class StoreError(RuntimeError):
    """The database could not be opened or written."""


@dataclass(frozen=True)
class SessionInfo:
    """What is known of a session when it opens."""

    id: str
    source: str
    engine: str
    model: str
    language: str | None = None
    started_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class StoredSession:
    """A session of the history: its row, the start of its text and who spoke in it."""

    id: str
    title: str | None
    source: str
    state: str
    started_at: float
    ended_at: float | None
    engine: str
    model: str
    language: str | None
    duration: float
    preview: str
    speakers: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "object": "transcript", "title": self.title, "source": self.source,
                "state": self.state, "created_at": round(self.started_at, 3),
                "ended_at": None if self.ended_at is None else round(self.ended_at, 3),
                "duration": round(self.duration, 3), "engine": self.engine, "model": self.model,
                "language": self.language, "preview": self.preview, "speakers": list(self.speakers)}


@dataclass(frozen=True)
class Version:
    """A text a session had before a retranscription replaced it: number 1 is the live draft."""

    number: int
    made_at: float
    replaced_at: float
    engine: str
    model: str
    entries: tuple[Entry, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.number, "object": "transcript.version", "created_at": round(self.made_at, 3),
                "replaced_at": round(self.replaced_at, 3), "engine": self.engine, "model": self.model}


def url_for(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'history.sqlite3'}"


def _words(entry: Entry) -> str | None:
    if not entry.words:
        return None
    return json.dumps([[w.word, round(w.start, 3), round(w.end, 3)] for w in entry.words], ensure_ascii=False)


def _row(session_id: str, segment: int, part: int, e: Entry) -> dict[str, Any]:
    return {"session_id": session_id, "segment": segment, "part": part, "start_s": e.start, "end_s": e.end,
            "text": e.text, "kind": e.kind, "language": e.language, "speaker": e.speaker, "latency": e.latency,
            "words": _words(e)}


def _kept(row: Any) -> dict[str, Any]:
    """An entry's columns, as a version keeps them."""
    return {k: getattr(row, k) for k in ("segment", "part", "start_s", "end_s", "text", "kind", "language",
                                         "speaker", "latency", "words")}


def _entry(row: Any) -> Entry:
    words = tuple(Word(start, end, word) for word, start, end in json.loads(row.words)) if row.words else ()
    return Entry(row.segment, row.start_s, row.end_s, row.text, kind=row.kind, latency=row.latency,
                 language=row.language, words=words, speaker=row.speaker)


def _fts_query(q: str) -> str:
    """FTS5's query for words the user typed: every word, each quoted (no operators)."""
    return " ".join('"' + w.replace('"', '""') + '"' for w in q.split())


class Store:
    def __init__(self, url: str, instance: str | None = None) -> None:
        self.url = url
        self.instance = instance or uuid.uuid4().hex
        self.dialect = sa.make_url(url).get_backend_name()
        if self.dialect not in ("sqlite", "postgresql"):
            raise StoreError(f"unsupported database {self.dialect!r}: use sqlite:/// or postgresql://")
        try:
            self.engine = self._engine(url)
            self._migrate()
            self.liveness = self._liveness()
            self.liveness.hold(self.instance)
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"cannot open the history database: {exc.__class__.__name__}: {exc}") from exc

    @property
    def in_memory(self) -> bool:
        return self.dialect == "sqlite" and sa.make_url(self.url).database in (None, "", ":memory:")

    def _engine(self, url: str) -> sa.Engine:
        parsed = sa.make_url(url)
        if self.dialect == "postgresql":
            if parsed.drivername == "postgresql":
                parsed = parsed.set(drivername="postgresql+psycopg")
            return sa.create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": 5})
        if self.in_memory:
            engine = sa.create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            self._file().parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine(parsed, connect_args={"timeout": 30, "check_same_thread": False})

        @sa.event.listens_for(engine, "connect")
        def pragmas(dbapi_connection: Any, _: Any) -> None:
            cursor = dbapi_connection.cursor()
            if not self.in_memory:
                # WAL: readers never wait for the writer; a commit is in the file before the call returns, so a
                # killed process loses nothing committed (NORMAL syncs at checkpoints: a power cut may lose the last)
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine

    def _migrate(self) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        if self.dialect == "sqlite" and not self.in_memory:  # apps starting together on one file: one at a time
            with open(self._file().with_suffix(".migrating"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._upgrade(config)
            return
        self._upgrade(config)

    def _file(self) -> Path:
        return Path(sa.make_url(self.url).database or "")

    def _upgrade(self, config: Config) -> None:
        with self.engine.begin() as connection:
            if self.dialect == "postgresql":  # instances starting together: one migrates, the others wait
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(7700417)"))
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def _liveness(self) -> Liveness:
        if self.dialect == "postgresql":
            return AdvisoryLocks(self.engine)
        if self.in_memory:
            return NoLocks()
        return FileLocks(self._file().with_suffix(".instances"))

    def close(self) -> None:
        self.liveness.release()
        self.engine.dispose()

    # -- writes
    def begin(self, info: SessionInfo) -> None:
        row = {"id": info.id, "source": info.source, "state": "live", "instance": self.instance,
               "started_at": info.started_at, "engine": info.engine, "model": info.model, "language": info.language}
        with self.engine.begin() as c:
            exists = c.execute(sa.select(schema.sessions.c.id).where(schema.sessions.c.id == info.id)).first()
            if exists:
                c.execute(schema.sessions.update().where(schema.sessions.c.id == info.id)
                          .values(state="live", instance=self.instance, ended_at=None))
            else:
                c.execute(schema.sessions.insert().values(**row))

    def put(self, session_id: str, segment: int, entries: Sequence[Entry]) -> None:
        """A segment's entries, replacing what the segment had."""
        t = schema.entries
        with self.engine.begin() as c:
            c.execute(t.delete().where(t.c.session_id == session_id, t.c.segment == segment))
            if entries:
                c.execute(t.insert(), [_row(session_id, segment, i, e) for i, e in enumerate(entries)])

    def save(self, info: SessionInfo, entries: Sequence[Entry], duration: float, title: str | None = None) -> None:
        """A finished transcription as an ended session, in one transaction."""
        with self.engine.begin() as c:
            c.execute(schema.sessions.insert().values(
                id=info.id, title=title, source=info.source, state="ended", instance=self.instance,
                started_at=info.started_at, ended_at=info.started_at + duration, engine=info.engine,
                model=info.model, language=info.language))
            if entries:
                c.execute(schema.entries.insert(), [_row(info.id, e.segment, i, e) for i, e in enumerate(entries)])

    def clear(self, session_id: str) -> None:
        with self.engine.begin() as c:
            c.execute(schema.entries.delete().where(schema.entries.c.session_id == session_id))

    def end(self, session_id: str, state: str = "ended") -> None:
        s = schema.sessions
        with self.engine.begin() as c:
            c.execute(s.update().where(s.c.id == session_id, s.c.state == "live").values(state=state,
                                                                                        ended_at=time.time()))

    def recover(self) -> int:
        """Mark the live sessions of instances that are gone as interrupted; how many were."""
        s = schema.sessions
        self.liveness.renew()
        with self.engine.connect() as c:
            instances = [r[0] for r in c.execute(sa.select(s.c.instance).where(s.c.state == "live").distinct())]
        dead = [i for i in instances if i != self.instance and self.liveness.gone(i)]
        if not dead:
            return 0
        with self.engine.begin() as c:
            last = (sa.select(sa.func.max(schema.entries.c.end_s)).where(schema.entries.c.session_id == s.c.id)
                    .scalar_subquery())
            done = c.execute(s.update().where(s.c.state == "live", s.c.instance.in_(dead))
                             .values(state="interrupted", ended_at=s.c.started_at + sa.func.coalesce(last, 0.0)))
        return done.rowcount

    def replace(self, session_id: str, entries: Sequence[Entry], engine: str, model: str) -> int | None:
        """A session's text replaced by `entries` (made by `engine` running `model`), the text it had kept as a
        version: that version's number, or None where the session is unknown or live."""
        s, t, v = schema.sessions, schema.entries, schema.versions
        now = time.time()
        with self.engine.begin() as c:
            row = c.execute(sa.select(s).where(s.c.id == session_id)).first()
            if row is None or row.state == "live":
                return None
            old = c.execute(sa.select(t).where(t.c.session_id == session_id).order_by(t.c.segment, t.c.part)).all()
            number = 1 + (c.execute(sa.select(sa.func.max(v.c.number)).where(v.c.session_id == session_id))
                          .scalar() or 0)
            c.execute(v.insert().values(session_id=session_id, number=number, made_at=row.made_at or row.started_at,
                                        replaced_at=now, engine=row.engine, model=row.model,
                                        entries=json.dumps([_kept(r) for r in old], ensure_ascii=False)))
            c.execute(t.delete().where(t.c.session_id == session_id))
            if entries:
                c.execute(t.insert(), [_row(session_id, e.segment, i, e) for i, e in enumerate(entries)])
            c.execute(s.update().where(s.c.id == session_id).values(engine=engine, model=model, made_at=now))
        return number

    def versions(self, session_id: str) -> list[Version]:
        """The texts a session had before, oldest first."""
        v = schema.versions
        with self.engine.connect() as c:
            rows = c.execute(sa.select(v).where(v.c.session_id == session_id).order_by(v.c.number)).all()
        return [Version(r.number, r.made_at, r.replaced_at, r.engine, r.model,
                        tuple(_entry(SimpleNamespace(**e)) for e in json.loads(r.entries))) for r in rows]

    def rename_speaker(self, session_id: str, speaker: str, name: str) -> bool:
        t = schema.entries
        with self.engine.begin() as c:
            done = c.execute(t.update().where(t.c.session_id == session_id, t.c.speaker == speaker)
                             .values(speaker=name))
        return done.rowcount > 0

    def retitle(self, session_id: str, title: str) -> bool:
        """A session's title, its spaces collapsed and cut to `TITLE_CHARS` (empty: none); whether it exists."""
        title = " ".join(title.split())[:TITLE_CHARS]
        s = schema.sessions
        with self.engine.begin() as c:
            done = c.execute(s.update().where(s.c.id == session_id).values(title=title or None))
        return done.rowcount > 0

    def delete(self, session_id: str) -> bool:
        """Delete a session that is not live (still written to), with its transcript; whether one was."""
        s = schema.sessions
        with self.engine.begin() as c:
            ended = sa.select(s.c.id).where(s.c.id == session_id, s.c.state != "live")
            c.execute(schema.entries.delete().where(schema.entries.c.session_id.in_(ended)))
            c.execute(schema.versions.delete().where(schema.versions.c.session_id.in_(ended)))
            done = c.execute(s.delete().where(s.c.id == session_id, s.c.state != "live"))
        return done.rowcount > 0

    def purge(self, before: float) -> list[str]:
        """Delete the sessions (not live) that started before `before` (epoch seconds); their ids."""
        s = schema.sessions
        with self.engine.begin() as c:
            old = [r[0] for r in c.execute(sa.select(s.c.id).where(s.c.started_at < before, s.c.state != "live"))]
            for i in range(0, len(old), 500):
                c.execute(schema.entries.delete().where(schema.entries.c.session_id.in_(old[i:i + 500])))
                c.execute(schema.versions.delete().where(schema.versions.c.session_id.in_(old[i:i + 500])))
                c.execute(s.delete().where(s.c.id.in_(old[i:i + 500])))
        return old

    def secret(self) -> bytes:
        """The secret of the transcripts' tokens, made once and kept (instances sharing the database share it)."""
        t = schema.settings
        with self.engine.begin() as c:
            value = c.execute(sa.select(t.c.value).where(t.c.key == "token_secret")).scalar()
            if value is None:
                value = secrets.token_hex(32)
                if self.dialect == "postgresql":
                    from sqlalchemy.dialects.postgresql import insert
                else:
                    from sqlalchemy.dialects.sqlite import insert
                c.execute(insert(t).values(key="token_secret", value=value).on_conflict_do_nothing())
                value = c.execute(sa.select(t.c.value).where(t.c.key == "token_secret")).scalar_one()
        return bytes.fromhex(value)

    # -- reads
    def _matching(self, word: str) -> Any:
        """The ids of sessions with an entry that has `word`."""
        t = schema.entries
        if self.dialect == "sqlite":
            hits = sa.select(sa.literal_column("rowid")).select_from(sa.table("entries_fts")).where(
                sa.text("entries_fts MATCH :q").bindparams(sa.bindparam("q", _fts_query(word), unique=True)))
            return sa.select(t.c.session_id).where(t.c.id.in_(hits))
        return sa.select(t.c.session_id).where(
            sa.func.to_tsvector(sa.literal_column("'simple'"), t.c.text).op("@@")(
                sa.func.plainto_tsquery(sa.literal_column("'simple'"), word)))

    def sessions(self, q: str | None = None, limit: int = 50, before: float | None = None) -> list[StoredSession]:
        """Sessions newest first, started before `before`, those whose text has every word of `q` where given (each
        word anywhere in the session)."""
        s, t = schema.sessions, schema.entries
        first = (sa.select(t.c.text).where(t.c.session_id == s.c.id, t.c.kind == "final", t.c.text != "")
                 .order_by(t.c.segment, t.c.part).limit(1).scalar_subquery())
        last = sa.select(sa.func.max(t.c.end_s)).where(t.c.session_id == s.c.id).scalar_subquery()
        query = sa.select(s, first.label("preview"), last.label("last")).order_by(s.c.started_at.desc(),
                                                                                   s.c.id).limit(limit)
        for word in (q or "").split()[:MAX_WORDS]:
            query = query.where(s.c.id.in_(self._matching(word)))
        if before is not None:
            query = query.where(s.c.started_at < before)
        with self.engine.connect() as c:
            rows = c.execute(query).all()
            ids = [r.id for r in rows]
            speakers: dict[str, list[str]] = {}
            if ids:
                for sid, speaker in c.execute(sa.select(t.c.session_id, t.c.speaker)
                                              .where(t.c.session_id.in_(ids), t.c.speaker.is_not(None))
                                              .group_by(t.c.session_id, t.c.speaker)
                                              .order_by(t.c.session_id, sa.func.min(t.c.segment))):
                    speakers.setdefault(sid, []).append(speaker)
        return [self._summary(r, speakers.get(r.id, [])) for r in rows]

    @staticmethod
    def _summary(row: Any, speakers: Sequence[str]) -> StoredSession:
        preview = row.preview or ""
        if len(preview) > PREVIEW_CHARS:
            preview = preview[:PREVIEW_CHARS].rsplit(" ", 1)[0] + "…"
        duration = (row.ended_at - row.started_at) if row.ended_at is not None else (row.last or 0.0)
        return StoredSession(row.id, row.title, row.source, row.state, row.started_at, row.ended_at, row.engine,
                             row.model, row.language, max(0.0, duration), preview, tuple(speakers))

    def session(self, session_id: str) -> tuple[StoredSession, tuple[Entry, ...]] | None:
        """A session and its transcript's entries, or None."""
        s, t = schema.sessions, schema.entries
        with self.engine.connect() as c:
            row = c.execute(sa.select(s).where(s.c.id == session_id)).first()
            if row is None:
                return None
            rows = c.execute(sa.select(t).where(t.c.session_id == session_id).order_by(t.c.segment, t.c.part)).all()
        entries = tuple(_entry(r) for r in rows)
        texts = [e.text for e in entries if e.kind == "final" and e.text]
        speakers = list(dict.fromkeys(e.speaker for e in entries if e.speaker))
        summary = self._summary(SimpleNamespace(**row._mapping, preview=texts[0] if texts else "",
                                                last=max((e.end for e in entries), default=0.0)), speakers)
        return summary, entries
