"""The history: every live session and its transcript in a database (SQLite in the data directory, or PostgreSQL
for several instances), written as it goes and kept across restarts and crashes.

`open_store` picks the database from the settings; `Recorder` writes live sessions into it; `Store` reads and
changes what is kept.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..config import Settings
from .audio import AudioKeeper
from .database import SessionInfo, Store, StoredSession, StoreError, Version, url_for
from .recorder import Recorder

log = logging.getLogger(__name__)

SPACE_DATA = Path("/data")
"""Where a Hugging Face Space's persistent storage is mounted, when it has some."""


def data_dir(settings: Settings) -> Path | None:
    """The data directory: `--data-dir`; on a Space, its persistent storage or none; else the user's data folder."""
    if settings.data_dir:
        return Path(settings.data_dir).expanduser()
    if settings.space_id:
        writable = SPACE_DATA.is_dir() and os.access(SPACE_DATA, os.W_OK)
        return SPACE_DATA / "realtime-transcription" if writable else None
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "realtime-transcription"


def open_store(settings: Settings) -> Store | None:
    """The history's database as the settings say, or None where nothing is to be kept (`--no-history`, or a Space
    without persistent storage)."""
    if not settings.history:
        return None
    if settings.database_url:
        return Store(settings.database_url)
    folder = data_dir(settings)
    if folder is None:
        log.warning("no persistent storage on this Space: transcripts are kept in memory only")
        return None
    return Store(url_for(folder))


__all__ = ["AudioKeeper", "Recorder", "SessionInfo", "Store", "StoreError", "StoredSession", "Version", "data_dir",
           "open_store"]
