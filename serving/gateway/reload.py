"""``POST /admin/reload``: every arm's model renewed through the one model lifecycle.

Each arm whose estimator has a model URI is loaded afresh (its alias re-resolved; a registry
model in a child process, so MLflow never enters the gateway), health-checked, taught the
recent completions the fan-out kept and swapped in between two decisions; a failure keeps the
old model. Arms without a model URI are ``unchanged``.
"""

from __future__ import annotations

from typing import Any

from balanceroute.serving.gateway.arms import Arm
from balanceroute.serving.lifecycle.recent import RecentCompletions
from balanceroute.serving.lifecycle.renew import ReloadOutcome, reference_uri, renew

RELOAD_FAILED = 502  # the model source gave nothing servable; the old model keeps serving


async def reload_arms(arms: list[Arm], recent: RecentCompletions) -> list[ReloadOutcome]:
    """Renew every arm's model, one after the other (on the event loop: swaps between decisions)."""
    out = []
    for arm in arms:
        uri = arm.model_uri
        if uri is None:
            out.append(ReloadOutcome(arm=arm.label, previous_version=None, version=None,
                                     changed=False))  # fmt: skip
            continue
        assert arm.spec.estimator is not None
        out.append(
            await renew(
                arm.label,
                reference_uri(uri),
                arm.version,
                force=True,  # the gateway's reload always loads afresh, as it always did
                recent=recent,
                install=lambda resolved, est, arm=arm: arm.swap(est, resolved.version),
                kind=arm.spec.estimator.kind,
            )
        )
    return out


def result_row(o: ReloadOutcome) -> dict[str, Any]:
    """One arm in the answer: ``status`` and ``detail`` as before, and the outcome's fields."""
    if o.error:
        detail = o.error
    elif o.version is None:
        detail = "no model URI"
    else:
        detail = f"version {o.version}"
    return {"arm": o.arm, "status": o.status, "detail": detail, **o.model_dump(exclude={"arm"})}
