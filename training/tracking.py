"""MLflow tracking of training: the defaults of ``train`` and the error a tracking outage raises.

Where runs go (``MLFLOW_TRACKING_URI``, else SQLite in the working folder) is set up by
:func:`balanceroute.predict.model_store.setup_mlflow`, which reading a model needs too.
"""

from __future__ import annotations

from balanceroute.features.errors import UserError

DEFAULT_EXPERIMENT = "completion-predictors"
DEFAULT_ESTIMATORS = ("survival", "exactmatch", "gbdt")


class TrackingError(UserError):
    """The tracking store could not be reached or refused a write; local artifacts are kept."""

    exit_code = 3
