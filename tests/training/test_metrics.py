"""Metric definitions and the time-ordered split's refusals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from balanceroute.features.errors import UserError
from balanceroute.features.schema import validate_trace
from balanceroute.training.holdout import holdout_snapshots, make_holdout
from balanceroute.training.metrics import expected_calibration_error, score, score_by_age


def test_score_known_values():
    p = np.array([0.0, 1.0, 0.5, 0.5])
    r = np.array([100, 3, 3, 100])  # finishing within H=10: no, yes, yes, no
    c = np.array([10.0, 3.0, 5.0, 10.0])
    m = score(p, c, r, 10)
    assert m["brier"] == pytest.approx(0.125)
    assert m["auc"] == pytest.approx(0.875)  # one tied pair
    assert m["c_mae"] == pytest.approx(0.5)
    assert m["ece"] == pytest.approx(0.0)
    assert set(score_by_age(p, c, r, np.array([0, 20, 70, 2000]), 10)) == {
        "0-15",
        "16-63",
        "64-255",
        "1024+",
    }


def test_ece_detects_miscalibration():
    y = np.array([0.0, 0.0, 1.0, 1.0])
    assert expected_calibration_error(np.full(4, 0.9), y) == pytest.approx(0.4)


def test_snapshots_are_seeded_and_valid():
    out = np.array([1, 5, 50, 500, 5000])
    a = holdout_snapshots(out, 2, 3, seed=4)
    b = holdout_snapshots(out, 2, 3, seed=4)
    np.testing.assert_array_equal(a[1], b[1])
    assert np.all(a[1] < out[a[0]]) and a[0].min() == 2 and a[0].size == 9


def _frame(n, outputs=None):
    return validate_trace(
        pd.DataFrame(
            {
                "arrival_s": np.arange(n, dtype=float),
                "prompt_tokens": np.full(n, 10),
                "output_tokens": outputs if outputs is not None else np.arange(n) % 7 + 1,
            }
        )
    )


def test_split_refusals():
    with pytest.raises(UserError, match="too short"):
        make_holdout(_frame(40))
    with pytest.raises(UserError, match="same output length"):
        make_holdout(_frame(500, np.full(500, 3)))
    holdout = make_holdout(_frame(500))
    assert len(holdout.train) == holdout.first_test == 350
    test_arrivals = holdout.arrays.arrival_s[holdout.first_test :]
    assert holdout.train["arrival_s"].max() < test_arrivals.min()


def test_the_evaluate_table_shows_every_scalar_metric() -> None:
    """Generic over the metric keys: a metric added later shows up as a row, nested ones not."""
    from balanceroute.training.evaluate import metrics_table

    table = metrics_table(
        {
            "survival": {"brier": 0.1234567, "auc": 0.7, "by_age": {"0": {}}, "steps": 12000},
            "gbdt": {"brier": 0.1, "auc": 0.8, "new_score": float("nan")},
        }
    )
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "survival", "gbdt"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == {"brier", "auc", "steps", "new_score"}
    assert rows["brier"] == ["0.1235", "0.1"] and rows["steps"] == ["12,000"]
    assert rows["new_score"] == ["n/a"]


def test_at_risk_scores_weigh_each_snapshot_by_its_request_length() -> None:
    from balanceroute.training.evaluate import at_risk_scores

    # a short request (length 10) that finishes within H, a long one (length 1000) that does
    # not; predicting 0.5 for both is calibrated per request, not by time at risk
    p = np.array([0.5, 0.5])
    remaining = np.array([3, 900])
    out = at_risk_scores(p, remaining, horizon=80, at_risk=np.array([10, 1000]))
    assert out["brier_at_risk"] == pytest.approx(0.25)
    assert out["ece_at_risk"] == pytest.approx(abs(0.5 - 10 / 1010), rel=1e-9)
    # equal lengths: the per-request score
    same = at_risk_scores(p, remaining, horizon=80, at_risk=np.array([7, 7]))
    assert same["ece_at_risk"] == pytest.approx(0.0)


def test_the_holdout_brier_at_admission_scores_each_test_request_at_age_zero():
    from balanceroute.features.synthetic import generate
    from balanceroute.predict.factory import EstimatorSpec, build_estimator
    from balanceroute.training.evaluate import evaluate_estimator
    from balanceroute.training.prediction_replay import replay_predictions

    frame = generate("azure-conv", 1_500, seed=4)
    holdout = make_holdout(frame, 0.7, 0)

    def fitted():
        return build_estimator(EstimatorSpec("exactmatch"), history=holdout.train)

    metrics, _ = evaluate_estimator(fitted(), holdout, 80)
    test = np.arange(holdout.first_test, holdout.arrays.size)
    alone = replay_predictions(fitted(), holdout.arrays, holdout.first_test, test, 0 * test)
    at_zero = score(alone.p_finish, alone.c, holdout.arrays.output_tokens[test], 80)
    assert metrics["brier_at_admission"] == pytest.approx(at_zero["brier"], rel=1e-9)
    assert metrics["brier_at_admission"] != pytest.approx(metrics["brier"], rel=0.05)
