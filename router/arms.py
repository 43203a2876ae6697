"""A/B arm strings: ``router[:estimator[@model-uri]][{option=value;...}]``.

Examples: ``count-jsq``, ``brh:oracle``, ``brh:gbdt@models:/completion-predictor@champion``,
``br0{s_greedy=0}``, ``brh:oracle{gamma=0.98;beta=43}``. Arms are separated by commas outside
braces; the arm string as given is its key in every result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from balanceroute.features.errors import UserError
from balanceroute.router.balance_route import BalanceRouteConfig, takes_estimator, takes_options


@dataclass(frozen=True)
class Arm:
    """One arm of an A/B replay."""

    label: str
    router: str
    estimator: str | None = None
    model_uri: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def needs_training(self) -> bool:
        return self.estimator not in (None, "none", "oracle", "noisy-oracle") and (
            self.model_uri is None
        )


def split_arms(text: str) -> list[str]:
    """Split on commas that are not inside ``{...}``."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [a for a in out if a]


def _value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw.strip()


def parse_arm(text: str) -> Arm:
    """Parse one arm string; errors list the known routers and estimators."""
    from balanceroute.predict.registry import estimator_names
    from balanceroute.router.policy import policy_names

    body, options = text, {}
    if "{" in text:
        if not text.endswith("}"):
            raise UserError(f"arm '{text}': options must close with '}}'")
        body, raw = text[:-1].split("{", 1)
        for item in filter(None, (s.strip() for s in raw.split(";"))):
            if "=" not in item:
                raise UserError(f"arm '{text}': option '{item}' is not name=value")
            k, v = item.split("=", 1)
            options[k.strip()] = _value(v)
    router, _, rest = body.partition(":")
    estimator, _, uri = rest.partition("@")
    known_routers = policy_names()
    known_est = estimator_names()
    if router not in known_routers:
        raise UserError(
            f"arm '{text}': unknown router '{router}'; known routers: {', '.join(known_routers)}"
            f"; known estimators: {', '.join(known_est)}"
        )
    if estimator and not takes_estimator(router):
        raise UserError(
            f"arm '{text}': only brh and brh-paper take an estimator (router:estimator)"
        )
    if estimator and estimator not in known_est:
        raise UserError(
            f"arm '{text}': unknown estimator '{estimator}'; known estimators: "
            f"{', '.join(known_est)}; known routers: {', '.join(known_routers)}"
        )
    if options and not takes_options(router):
        raise UserError(f"arm '{text}': only br0, brh and brh-paper take options")
    unknown = set(options) - set(BalanceRouteConfig.__dataclass_fields__)
    if unknown:
        raise UserError(
            f"arm '{text}': unknown option(s) {sorted(unknown)}; known: "
            f"{sorted(BalanceRouteConfig.__dataclass_fields__)}"
        )
    if takes_estimator(router) and not estimator:
        estimator = "none"
    return Arm(text, router, estimator or None, uri or None, options)


def parse_arms(text: str) -> list[Arm]:
    arms = [parse_arm(a) for a in split_arms(text)]
    if not arms:
        raise UserError("no arms given")
    labels = [a.label for a in arms]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise UserError(f"arms given twice: {dupes}")
    return arms
