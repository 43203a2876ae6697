"""The column vocabulary of per-request files, one name per idea: the simulator's and the A/B
harness's ``requests.parquet`` (:mod:`balanceroute.router.lab.records`), the emulator's request
log, the gateway's completion log and ``bench``'s ``requests.parquet``.

- ``worker``: the worker (data-parallel rank) a request ran on;
- ``admit_iteration``: the iteration at which it was admitted;
- ``queue_delay_s``: seconds from its arrival to its admission (or forwarding).

Files written before this vocabulary say ``rank``, ``admit_iter`` and ``queue_s``;
:func:`canonical_columns` reads them under the names above.
"""

from __future__ import annotations

from typing import Any

WORKER = "worker"
ADMIT_ITERATION = "admit_iteration"
QUEUE_DELAY_S = "queue_delay_s"

# Earlier names of the same columns.
OLD_NAMES = {"rank": WORKER, "admit_iter": ADMIT_ITERATION, "queue_s": QUEUE_DELAY_S}


def canonical_columns(frame: Any) -> Any:
    """``frame`` (a pandas DataFrame) with its columns under the names above (old names renamed
    when the new one is absent)."""
    renames = {
        old: new
        for old, new in OLD_NAMES.items()
        if old in frame.columns and new not in frame.columns
    }
    return frame.rename(columns=renames) if renames else frame
