"""Router specs: ``router[:estimator[@model-uri]][{option=value;...}]``, and the one factory
that builds a policy (with its estimator) from one.

Examples: ``count-jsq``, ``brh:oracle``, ``brh:gbdt@models:/completion-predictor@champion``,
``br0{s_greedy=0}``, ``brh:oracle{gamma=0.98;beta=43}``. In an A/B replay the specs are
separated by commas outside braces and each spec string, as given, is its arm's label.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_args, get_type_hints

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.factory import EstimatorSpec
from balanceroute.predict.registry import estimator_names
from balanceroute.router.policies.policy import Policy
from balanceroute.router.policies.registry import policy_class, policy_names


@dataclass(frozen=True)
class RouterSpec:
    """A router, its options and, for routers that look ahead, its estimator."""

    router: str
    estimator: EstimatorSpec | None = None
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self) -> None:
        cls = policy_class(self.router)
        if self.estimator is not None and not cls.takes_estimator:
            takers = [n for n in policy_names() if policy_class(n).takes_estimator]
            raise UserError(
                f"router '{self.router}' takes no estimator; routers that do: {', '.join(takers)}"
            )
        if cls.takes_estimator and self.estimator is None:
            object.__setattr__(self, "estimator", EstimatorSpec("none"))
        if self.options:
            if cls.options is None:
                raise UserError(
                    f"router '{self.router}' takes no options (got {sorted(self.options)})"
                )
            known = [f.name for f in dataclasses.fields(cls.options)]
            unknown = sorted(set(self.options) - set(known))
            if unknown:
                raise UserError(
                    f"unknown {self.router} option(s) {unknown}; known: {', '.join(sorted(known))}"
                )
            check_option_types(cls.options, self.options)
            defaults = getattr(cls, "defaults", None)
            if defaults is not None:  # the configuration's own checks, now rather than mid-run
                dataclasses.replace(defaults, **self.options)
        if not self.label:
            object.__setattr__(self, "label", self.router)

    @classmethod
    def parse(cls, text: str) -> RouterSpec:
        """One spec string; errors name the spec and list the known routers and estimators."""
        try:
            return cls._parse(text)
        except UserError as exc:
            raise UserError(f"'{text}': {exc}") from None

    @classmethod
    def _parse(cls, text: str) -> RouterSpec:
        body, options = text, {}
        if "{" in text:
            if not text.endswith("}"):
                raise UserError("options must close with '}'")
            body, raw = text[:-1].split("{", 1)
            for item in filter(None, (s.strip() for s in raw.split(";"))):
                if "=" not in item:
                    raise UserError(f"option '{item}' is not name=value")
                k, v = item.split("=", 1)
                options[k.strip()] = _value(v)
        router, _, rest = body.partition(":")
        if router not in policy_names():
            raise UserError(
                f"unknown router '{router}'; known routers: {', '.join(policy_names())}; "
                f"known estimators: {', '.join(estimator_names())}"
            )
        estimator = EstimatorSpec.parse(rest) if rest else None
        return cls(router, estimator, options, label=text)

    @property
    def horizon(self) -> int | None:
        """The lookahead this spec's options set, if any."""
        value = self.options.get("horizon")
        return None if value is None else int(value)

    def build_policy(self, estimator: CompletionEstimator | None = None) -> Policy:
        """A fresh policy of this spec, with its options and (for routers that look ahead) the
        estimator built from ``self.estimator``."""
        cls = policy_class(self.router)
        if cls.options is None:
            return cls()
        return cls(estimator=estimator, **self.options)


def check_option_types(config: type, options: dict[str, Any]) -> None:
    """A UserError naming the first option whose value is not of its field's type (an int is
    a float too; None only where the field allows it)."""
    hints = get_type_hints(config)
    for name, value in options.items():
        kinds = get_args(hints[name]) or (hints[name],)
        if float in kinds and type(value) is int:
            continue
        if type(value) not in kinds and not (value is None and type(None) in kinds):
            wanted = " or ".join(k.__name__ for k in kinds)
            raise UserError(f"option {name}: expected {wanted}, got {value!r}")


def _value(raw: str) -> Any:
    """An option value: none/null, true/false, an int, a float, else the text."""
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


def split_specs(text: str) -> list[str]:
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


def parse_arms(text: str) -> list[RouterSpec]:
    """The arms of an A/B replay; labels must be unique."""
    arms = [RouterSpec.parse(a) for a in split_specs(text)]
    if not arms:
        raise UserError("no arms given")
    labels = [a.label for a in arms]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise UserError(f"arms given twice: {dupes}")
    return arms
