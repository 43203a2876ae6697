"""The sizes every layer agrees on: the lookahead horizon and the bounds of a decode group.

One definition each, imported wherever a default or a limit is needed (CLI flags, the HTTP
schemas, the simulator, the estimators), so a change here changes every entry at once.
"""

from __future__ import annotations

DEFAULT_HORIZON = 80  # H: lookahead iterations of BR-H and the estimators (the paper's value)
MAX_HORIZON = 1024  # projections and curves are (requests x (H + 1)) arrays
MAX_WORKERS = 4096  # workers (ranks) of one synchronization group
MAX_SLOTS = 65_536  # slots (running requests) of one worker
