"""``posterior``: the synthetic preset's own output law, the ceiling of what is knowable."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.features.errors import UserError
from balanceroute.features.schema import to_arrays
from balanceroute.features.synthetic import generate
from balanceroute.predict.base import RunningBatch, from_survival
from balanceroute.predict.registry import estimator_class, make_estimator

HORIZON = 80


@pytest.fixture(scope="module")
def trace():
    return generate("paper-prod", 4000, seed=5)


@pytest.fixture(scope="module")
def fitted(trace):
    return make_estimator("posterior", horizon=HORIZON, trace_seed=5).fit(trace)


def test_registered_as_a_reference_not_deployable():
    cls = estimator_class("posterior")
    assert not cls.deployable and cls.provides_survival


def test_law_is_the_one_the_preset_drew(fitted, trace):
    """Standardised log outputs are about N(0, 1), templates and one-offs alike; with another
    seed's catalogue the templates' spread is far wider (the catalogue is what it knows)."""
    out = np.log(trace["output_tokens"].to_numpy())
    z = (out - fitted.mu_) / fitted.sd_
    once = trace["prompt_key"].str.startswith("once-").to_numpy()
    assert abs(z[~once].mean()) < 0.1 and abs(z[~once].std() - 1) < 0.1
    assert abs(z[once].mean()) < 0.15 and abs(z[once].std() - 1) < 0.15
    wrong = make_estimator("posterior", horizon=HORIZON, trace_seed=6).fit(trace)
    assert ((out - wrong.mu_) / wrong.sd_)[~once].std() > 1.5


def test_curves_condition_on_the_age(fitted, trace):
    """Valid curves; at age ``a`` the curve is ``S(a + h) / S(a)`` of the age-0 law."""
    arrays = to_arrays(trace)
    rows = np.arange(0, 4000, 37)
    age = (arrays.output_tokens[rows] // 2).astype(np.int64)
    batch = RunningBatch(arrays.prompt_tokens[rows], age, request_index=rows)
    pred = fitted.predict(batch, survival=True)
    s = pred.survival
    assert np.all(s[:, 0] == 1.0) and np.all(np.diff(s, axis=1) <= 1e-12)
    derived = from_survival(s)
    np.testing.assert_allclose(pred.p_finish, derived.p_finish)
    np.testing.assert_allclose(fitted.predict(batch).c, derived.c)
    tokens = age[:, None] + np.arange(HORIZON + 1)[None, :]
    log_s = fitted.log_survival(rows, tokens.astype(np.float64))
    np.testing.assert_allclose(s, np.exp(log_s - log_s[:, :1]), rtol=1e-9)


def test_presets_without_a_closed_form_are_refused():
    azure = generate("azure-conv", 200, seed=0)
    with pytest.raises(UserError, match="azure-conv"):
        make_estimator("posterior", preset="azure-conv").fit(azure)
    mooncake = generate("mooncake-conv", 200, seed=0)
    with pytest.raises(UserError, match="mooncake-conv"):
        make_estimator("posterior", preset="mooncake-conv").fit(mooncake)


def test_keys_of_another_preset_are_refused(fitted):
    bad = generate("code-completion", 300, seed=0)
    with pytest.raises(UserError, match="templates"):
        make_estimator("posterior").fit(bad)
