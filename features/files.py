"""Writing result files atomically: a temporary file in the destination folder, renamed over the
destination only once complete, so a crash, a full disk or an error never leaves a half-written
or stray file behind, and what the user already had stays as it was."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from balanceroute.features.errors import UserError


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``, on any error it
    is removed. An OS error (no space, read-only folder, no permission) becomes a UserError
    naming ``path``."""
    target = Path(path)
    if target.is_dir():
        raise UserError(f"cannot write '{target}': it is a directory")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as exc:
        raise UserError(f"cannot write '{target}': {exc.strerror or exc}") from None
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    except OSError as exc:
        raise UserError(f"cannot write '{target}': {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def output_folder(path: str | Path) -> Path:
    """``path`` as a folder to write results in, checked before any work starts: a UserError
    naming it if it is a file or its nearest existing folder is not writable. Nothing is
    created here (the atomic writes create the folder with the first result), so a command
    that fails later leaves nothing behind."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UserError(f"cannot write in '{target}': it is a file, not a folder")
    existing = next((p for p in (target, *target.absolute().parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write in '{target}': '{existing}' is not a writable folder")
    return target


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, flushed to disk before the rename."""
    with atomic_output(path) as tmp, tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_bytes(path, text.encode())


def write_parquet(path: str | Path, table: Any) -> Path:
    """Write a pyarrow Table or a pandas DataFrame (without its index) to ``path`` as Parquet,
    whole or not at all, flushed to disk before the rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    return write_bytes(path, buf.getvalue().to_pybytes())


def write_png(path: str | Path, fig: Any) -> Path:
    """Lay out a matplotlib figure, write it to ``path`` as PNG atomically, and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return Path(path)


def jsonable(obj: Any) -> Any:
    """numpy scalars and arrays as Python values; anything else as its string."""
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def write_json(path: str | Path, payload: Any) -> Path:
    """Write ``payload`` as indented JSON (numpy values allowed) to ``path`` atomically."""
    return write_text(path, json.dumps(payload, indent=2, default=jsonable) + "\n")
