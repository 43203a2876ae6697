"""The A/B harness end to end on a small synthetic trace."""

from __future__ import annotations

import json

import pytest

from balanceroute.cli import main as balanceroute_main
from balanceroute.features.errors import UserError
from balanceroute.features.synthetic import generate
from balanceroute.router.lab.ab import ABConfig, aggregate, run_ab
from balanceroute.router.lab.twin.config import TwinConfig
from balanceroute.router.policies.specs import RouterSpec, parse_arms

ARMS = "count-jsq,token-jsq,br0,brh:none,brh:survival,brh:oracle{gamma=0.9;beta=20}"


@pytest.fixture(scope="module")
def ab_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ab")
    db = out / "mlflow.db"
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    mp.chdir(out)  # a SQLite store keeps its artifacts under ./mlruns: here, not in the checkout
    code = balanceroute_main(
        [
            "ab",
            "--preset",
            "azure-conv",
            "--requests",
            "1500",
            "--arms",
            ARMS,
            "--workers",
            "2,4",
            "--slots",
            "8",
            "--repeats",
            "3",
            "--saturate",
            "--jobs",
            "2",
            "--out",
            str(out),
        ]
    )
    yield code, out, db
    mp.undo()


def test_the_run_leaves_its_artifacts_beside_its_store(ab_run):
    _, out, _ = ab_run
    assert list((out / "mlruns").rglob("summary.json")), "the MLflow artifacts were not logged"


def test_every_arm_is_reported(ab_run):
    code, out, _ = ab_run
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["arms"]) == [a.label for a in parse_arms(ARMS)]
    for stats in summary["arms"].values():
        assert set(stats["by_workers"]) == {"2", "4"}
        assert stats["steady_mean_imbalance"] > 0
    report = (out / "report.md").read_text()
    assert "Table 3" in report and "Table 4" in report and "Value of prediction" in report
    for plot in ("trajectories.png", "imbalance_distribution.png", "scaling.png"):
        assert (out / plot).stat().st_size > 10_000


def test_arms_are_paired_on_identical_releases(ab_run):
    _, out, _ = ab_run
    summary = json.loads((out / "summary.json").read_text())
    for g in ("2", "4"):
        digests = {tuple(a["by_workers"][g]["releases_sha256"]) for a in summary["arms"].values()}
        assert len(digests) == 1
        (per_repeat,) = digests
        assert len(set(per_repeat)) == 3  # three different windows


def test_intervals_contain_the_point_estimate(ab_run):
    _, out, _ = ab_run
    summary = json.loads((out / "summary.json").read_text())
    for stats in summary["arms"].values():
        for per_g in stats["by_workers"].values():
            for metric, (lo, hi) in per_g["interval"].items():
                assert lo <= per_g[metric] <= hi
            for r in per_g["ratio_to_reference"].values():
                assert r["low"] <= r["mean"] <= r["high"]


def test_mlflow_parent_and_child_runs(ab_run):
    _, _, db = ab_run
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("balanceroute-ab")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1
    assert sorted(r.data.params["arm"] for r in children) == sorted(
        a.label for a in parse_arms(ARMS)
    )
    arts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"report.md", "summary.json", "plots"} <= arts


def test_results_do_not_depend_on_jobs():
    from balanceroute.features.synthetic import generate

    frame = generate("azure-conv", 800, seed=3)
    cfg = ABConfig(
        arms=tuple(parse_arms("count-jsq,br0,brh:survival")),
        workers=(2,),
        slots=6,
        repeats=2,
        saturate=True,
    )
    one = aggregate(run_ab(frame, cfg, jobs=1), cfg)
    two = aggregate(run_ab(frame, cfg, jobs=2), cfg)
    for arm in one["arms"]:
        assert _untimed(one["arms"][arm]["repeats"]) == _untimed(two["arms"][arm]["repeats"])


def test_dask_backend_gives_the_same_results():
    from distributed import LocalCluster

    from balanceroute.features.synthetic import generate

    frame = generate("azure-conv", 600, seed=4)
    cfg = ABConfig(
        arms=tuple(parse_arms("count-jsq,br0")), workers=(2,), slots=6, repeats=2, saturate=True
    )
    local = aggregate(run_ab(frame, cfg, jobs=1), cfg)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        remote = aggregate(run_ab(frame, cfg, dask_scheduler=cluster.scheduler_address), cfg)
    for arm in local["arms"]:
        assert _untimed(local["arms"][arm]["repeats"]) == _untimed(remote["arms"][arm]["repeats"])


def _untimed(repeats: list[dict]) -> list[dict]:
    """Per-repeat results without wall-clock timings (which differ run to run)."""
    return [{k: v for k, v in r.items() if not k.startswith("router_step")} for r in repeats]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("fastest", "unknown router 'fastest'; known routers:"),
        ("brh:magic", "unknown estimator 'magic'; known estimators:"),
        ("count-jsq:oracle", "takes no estimator; routers that do: brh, brh-paper"),
        ("brh:oracle{gamma}", "is not name=value"),
        ("br0{bogus=1}", r"unknown br0 option\(s\) \[.bogus.\]; known: age_late"),
    ],
)
def test_bad_arm_strings_are_clear_errors(text, needle):
    with pytest.raises(UserError, match=needle):
        RouterSpec.parse(text)


def test_bad_arm_on_the_command_line_exits_2(capsys, tmp_path):
    code = balanceroute_main(
        [
            "ab",
            "--preset",
            "azure-conv",
            "--requests",
            "200",
            "--arms",
            "count-jsq,nope",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "known routers" in err and "count-jsq" in err and "known estimators" in err
    assert "Traceback" not in err


def test_arm_strings_parse_uris_and_options():
    arm = RouterSpec.parse("brh:gbdt@models:/completion-predictor@champion")
    assert (arm.router, arm.estimator.kind, arm.estimator.model_uri) == (
        "brh",
        "gbdt",
        "models:/completion-predictor@champion",
    )
    arm = RouterSpec.parse("brh:oracle{gamma=0.98;beta=43;refill=true}")
    assert arm.options == {"gamma": 0.98, "beta": 43, "refill": True}
    assert RouterSpec.parse("brh").estimator.kind == "none"
    assert RouterSpec.parse("count-jsq").estimator is None


def test_each_windows_twin_weight_is_kept_in_the_summary():
    frame = generate("paper-prod", 900, seed=5)
    cfg = ABConfig(
        arms=tuple(parse_arms("brh:none{horizon=16},brh:survival{horizon=16}")),
        workers=(3,),
        slots=6,
        repeats=4,
        window_requests=120,
        saturate=True,
        reference="brh:none{horizon=16}",
        twin=TwinConfig(block_requests=96),
    )
    raw = run_ab(frame, cfg)
    arms = aggregate(raw, cfg)["arms"]
    tasks = sorted(
        (t for t in raw["tasks"] if t["arm"] == cfg.arms[1].label), key=lambda t: t["repeat"]
    )
    routed = [t["summary"]["twin_weight_mean"] for t in tasks]
    kept = [r["twin_weight"] for r in arms[cfg.arms[1].label]["repeats"]]
    assert len(kept) == 4 and kept == routed  # the weight each window routed with, in order
    assert all(r["twin_weight"] is None for r in arms[cfg.arms[0].label]["repeats"])
