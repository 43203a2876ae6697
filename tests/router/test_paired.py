"""The paired ratio over windows: geometric mean, t-interval on log ratios, verdict."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.router.lab.ab import overlap_of, replay_windows
from balanceroute.router.lab.paired import BETTER, SAME, WORSE, paired_ratio

positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)


@given(st.lists(st.tuples(positive, positive), min_size=2, max_size=40))
@settings(max_examples=200, deadline=None)
def test_interval_contains_the_geometric_mean_and_inverts(pairs) -> None:
    a = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    pr = paired_ratio(a, b)
    back = paired_ratio(b, a)
    assert pr.low <= pr.ratio * (1 + 1e-9) and pr.ratio <= pr.high * (1 + 1e-9)
    assert np.isclose(pr.ratio, np.exp(np.mean(np.log(a / b))))
    assert np.isclose(pr.ratio * back.ratio, 1.0)
    assert np.isclose(pr.low * back.high, 1.0) and np.isclose(pr.high * back.low, 1.0)
    assert {pr.verdict, back.verdict} in ({SAME}, {BETTER, WORSE})


@given(st.lists(positive, min_size=2, max_size=40), st.floats(1.0, 5.0))
@settings(max_examples=100, deadline=None)
def test_an_arm_against_itself_is_no_difference_and_overlap_only_widens(vals, f) -> None:
    v = np.array(vals)
    same = paired_ratio(v, v)
    assert same.ratio == 1.0 and same.verdict == SAME
    noisy = v * np.exp(np.linspace(-0.1, 0.12, v.size))
    narrow, wide = paired_ratio(noisy, v), paired_ratio(noisy, v, overlap=f)
    assert wide.low <= narrow.low * (1 + 1e-12) and wide.high >= narrow.high * (1 - 1e-12)


def test_verdicts_follow_the_interval_and_the_metric_direction() -> None:
    rng = np.random.default_rng(0)
    base = rng.uniform(100, 200, 30)
    lower = base * np.exp(rng.normal(-0.1, 0.02, 30))
    assert paired_ratio(lower, base).verdict == BETTER
    assert paired_ratio(lower, base, higher_is_better=True).verdict == WORSE
    assert paired_ratio(base, lower).verdict == WORSE
    noise = base * np.exp(rng.normal(0.0, 0.05, 30))
    pr = paired_ratio(noise, base)
    assert pr.low < 1.0 < pr.high or pr.verdict != SAME
    assert paired_ratio(base[:1], base[:1]) is None


def test_windows_of_a_number_of_requests_leave_room_for_the_shift() -> None:
    w = replay_windows(10_000, 30, 0.5, window_requests=1024)
    assert len(w) == 30 and all(stop - start == 1024 for start, stop in w)
    assert w[0][0] == 0 and w[-1][1] == 10_000 - 1
    assert overlap_of(w, 10_000) == 30 * 1024 / 10_000
    assert replay_windows(100, 5, 0.5) == [
        (int(s), int(s) + 50) for s in np.round(np.linspace(0, 50, 5))
    ]
