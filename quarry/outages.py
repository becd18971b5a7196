"""A database outage as a service lives it: driver errors made one clear error, reported once, and a full
disk told to the service's health.

`Outage` turns the driver's connection errors into DatabaseUnavailable (quarry.errors) and logs a line
when an outage begins and one when the database answers again, however many calls fail between. A
full disk is named as such, with where the data lives, and is a health problem (the service reports
NOT_SERVING) until there is room again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import sqlalchemy as sa

from quarry.errors import DatabaseUnavailable, ErrorReason

__all__ = ["DISK_FULL_HOLD_SECONDS", "DISK_ROOM_BYTES", "DRIVER_UNAVAILABLE", "Outage"]

log = logging.getLogger("quarry.db")

# The database is down, restarting, locked or out of reach: worth a retry, which every Quarry
# mutation makes safe with its request_id.
DRIVER_UNAVAILABLE = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError)


# Free space on a SQLite database's filesystem that counts as room again after it was full.
DISK_ROOM_BYTES = 1 << 20
# How long a service whose PostgreSQL server ran out of space stays out of rotation before it tries again.
DISK_FULL_HOLD_SECONDS = 30.0


class Outage:
    """Turns a driver's connection errors into Unavailable, and reports an outage once: a line when it
    begins and one when the database answers again, however many calls fail meanwhile. A full disk is
    named as such, with where the data lives, and counts as a health problem until a write succeeds."""

    def __init__(self, url: sa.URL) -> None:
        sqlite = url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")
        self._where = (
            f"SQLite file {url.database}"
            if sqlite
            else (f"PostgreSQL at {url.host or 'localhost'}:{url.port or 5432}/{url.database or ''}")
        )
        # Where free space tells that a full disk has room again (SQLite's directory; PostgreSQL's is not ours).
        self._directory = os.path.dirname(os.path.abspath(str(url.database))) if sqlite else None
        self.since: float | None = None  # time.monotonic() of the first failure of this outage
        self.disk_full = ""  # what the database said when it ran out of space; "" once a write succeeds
        self._full_at = 0.0  # time.monotonic() of the last write a full disk refused

    def failed(self, error: BaseException) -> BaseException:
        """What the caller of a unit of work that failed with `error` gets."""
        if not isinstance(error, DRIVER_UNAVAILABLE):
            return error
        cause = str(getattr(error, "orig", None) or error).strip().splitlines()[0][:300]
        if _is_disk_full(error):
            if not self.disk_full:
                log.error("the %s ran out of disk space: %s", self._where, cause)
            self.disk_full = cause
            self._full_at = time.monotonic()
            unavailable = DatabaseUnavailable(
                f"the database ({self._where}) ran out of disk space: {cause}; free space, then retry",
                reason=ErrorReason.DATABASE_DISK_FULL,
            )
        else:
            if self.since is None:
                log.warning("the %s is unavailable: %s; retrying until it answers", self._where, cause)
            unavailable = DatabaseUnavailable(
                "the database is unavailable; retry", reason=ErrorReason.DATABASE_UNAVAILABLE
            )
        if self.since is None:
            self.since = time.monotonic()
        unavailable.__cause__ = error
        return unavailable

    def succeeded(self) -> bool:
        """A call succeeded; True when that ends an outage."""
        if self.since is None:
            return False
        log.warning("the %s answers again, after %.1f s", self._where, time.monotonic() - self.since)
        self.since = None
        self.disk_full = ""
        return True

    def problem(self) -> str | None:
        """Why the service should not take traffic now, if it should not. A full disk is one until there is
        room again: seen on SQLite's filesystem, or, as PostgreSQL's cannot be seen from here, assumed after
        DISK_FULL_HOLD_SECONDS, when traffic comes back to try (NOT_SERVING would keep every write away, and
        only a write that succeeds shows the disk has room)."""
        if not self.disk_full:
            return None
        if self._directory is not None:
            with contextlib.suppress(OSError):
                free = os.statvfs(self._directory)
                if free.f_bavail * free.f_frsize >= DISK_ROOM_BYTES:
                    return None
        elif time.monotonic() - self._full_at >= DISK_FULL_HOLD_SECONDS:
            return None
        return f"the database ({self._where}) ran out of disk space: {self.disk_full}"


def _is_disk_full(error: BaseException) -> bool:
    original = getattr(error, "orig", None)
    text = str(original or error).lower()
    return (
        getattr(original, "sqlstate", None) == "53100"  # PostgreSQL's disk_full
        or "database or disk is full" in text  # SQLite's SQLITE_FULL
        or "no space left on device" in text
    )
