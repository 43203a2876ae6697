"""Errors caused by what a user gave us: the CLI prints them in one line and exits with code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or configuration; the message alone must tell the user what to fix."""

    exit_code = 2


class TraceError(UserError, ValueError):
    """A trace file that cannot be read as requests: names the file, row and field at fault."""

    def __init__(
        self,
        message: str,
        *,
        path: object | None = None,
        row: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = None if path is None else str(path)
        self.row = row
        self.field = field
        where = []
        if self.path is not None:
            where.append(self.path)
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ": ".join([", ".join(where)]) if where else ""
        super().__init__(f"{prefix}: {message}" if prefix else message)


class DroppedRowsWarning(UserWarning):
    """A reader left out rows on purpose (e.g. failed requests); the message says how many."""
