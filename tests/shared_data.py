"""Where the tests find the shared public traces (``../shared/data`` beside the repository).

``BALANCEROUTE_SHARED_DATA`` names the folder outright. Otherwise it is ``shared/data`` beside
the checkout; a linked git worktree (``git worktree add``, its ``.git`` a file naming the main
repository's ``.git/worktrees/NAME``) also looks beside the main checkout, so a test run in a
worktree reads the traces instead of skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = "BALANCEROUTE_SHARED_DATA"


def candidates(repo: Path = REPO) -> list[Path]:
    """The folders tried, in order."""
    if os.environ.get(ENV):
        return [Path(os.environ[ENV])]
    found = [repo.parent / "shared" / "data"]
    dot_git = repo / ".git"
    if dot_git.is_file():
        text = dot_git.read_text(encoding="utf-8").strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text.removeprefix("gitdir:").strip())
            if gitdir.parent.name == "worktrees":  # MAIN/.git/worktrees/NAME
                found.append(gitdir.parents[2].parent / "shared" / "data")
    return found


def shared_data_dir(repo: Path = REPO) -> Path:
    """The first candidate folder that exists (else the first, which a test then skips on)."""
    found = candidates(repo)
    return next((p for p in found if p.is_dir()), found[0])
