"""Live prediction quality: the names, written down once.

The gateway and the service will score the predictions they serve against the outputs they see
finish (issue 33, part 4) and expose, per loaded model (labels ``model``, the registered name,
and ``version``):

- ``balanceroute_live_brier``: the Brier score of ``p_finish`` on recent finished requests;
- ``balanceroute_live_calibration_error``: its expected calibration error;
- ``balanceroute_live_auc``: its AUC;
- ``balanceroute_live_remaining_error``: the mean absolute error of ``c`` against ``min(r, H)``;
- ``balanceroute_prediction_drift``: live Brier over the Brier the model scored on its training
  holdout (1: as trained; above 1: worse than when it was judged).

The holdout Brier the drift divides by is registered with every model version by ``train`` and
``pipeline``, as the version tag :data:`HOLDOUT_BRIER_TAG`. The shipped Grafana dashboard and
Prometheus rules (``ops/``) already use these names; no process exposes them yet.
"""

from __future__ import annotations

HOLDOUT_BRIER_TAG = "holdout_brier"
LIVE_LABELS = ("model", "version")
LIVE_BRIER = "balanceroute_live_brier"
LIVE_CALIBRATION_ERROR = "balanceroute_live_calibration_error"
LIVE_AUC = "balanceroute_live_auc"
LIVE_REMAINING_ERROR = "balanceroute_live_remaining_error"
PREDICTION_DRIFT = "balanceroute_prediction_drift"
LIVE_QUALITY_METRICS = (
    LIVE_BRIER,
    LIVE_CALIBRATION_ERROR,
    LIVE_AUC,
    LIVE_REMAINING_ERROR,
    PREDICTION_DRIFT,
)
