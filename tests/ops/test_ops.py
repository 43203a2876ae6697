"""The shipped observability (``ops/``): the rules pass ``promtool``, every metric the rules and
the dashboard name is exposed by a live gateway or service (but the documented future ones), and,
in the ``slow`` suite, a real Prometheus scraping a live gateway loads and evaluates the rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from balanceroute.features.synthetic import generate
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.live_quality import LIVE_QUALITY_METRICS
from balanceroute.predict.model_store import save_estimator
from balanceroute.serving.testbed.harness import ServerProcess, free_port
from tests.serving.gateway.helpers import GatewayProcess, completion
from tests.serving.service.helpers import Server
from tests.serving.testbed.helpers import Emulator

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "ops" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "ops" / "prometheus" / "rules_test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "balanceroute.json"
NAME = re.compile(r"\bbalanceroute_[a-z0-9_]+")
SUFFIX = re.compile(r"_(total|bucket|sum|count|created)$")
NO_PROMTOOL = "promtool not found: install Debian's prometheus package (scripts/test.sh does)"


def _family(name: str) -> str:
    return SUFFIX.sub("", name)


def referenced() -> set[str]:
    """Metric families the rules' and the dashboard's expressions name."""
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    exprs += [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    return {_family(n) for n in NAME.findall("\n".join(exprs))}


def exposed(text: str) -> set[str]:
    """Metric families of a /metrics answer (their ``# TYPE`` lines)."""
    return {_family(line.split()[2]) for line in text.splitlines() if line.startswith("# TYPE ")}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Two emulated ranks, a BR-H gateway with a learned estimator in front (a few requests and
    a reload through it) and a prediction service (a reload)."""
    base = tmp_path_factory.mktemp("ops")
    history = generate("azure-conv", 300, seed=1)
    model = save_estimator(build_estimator(EstimatorSpec("survival"), history=history,
                                           horizon=80), base / "survival.joblib")  # fmt: skip
    emu = Emulator(base / "emu.log", ranks=2, slots=4, time_scale=20.0)
    gw = sv = None
    try:
        gw = GatewayProcess(base / "gw.log", emu.urls, "--slots", "4", "--router", "brh",
                            "--estimator", f"survival@{model}")  # fmt: skip
        for i in range(4):
            completion(gw.url, 8, stream=bool(i % 2), prompt=f"p {i}")
        gw.post("/admin/reload")
        sv = Server(str(model), log=base / "sv.log")
        httpx.post(sv.url + "/v1/admin/reload", timeout=60)
        yield {"gateway": gw, "service": sv, "base": base}
    finally:
        if sv is not None:
            sv.process.terminate()
        if gw is not None:
            gw.stop()
        emu.stop()


@pytest.mark.server
def test_every_metric_the_ops_files_name_is_exposed_or_documented(live) -> None:
    gw, sv = live["gateway"], live["service"]
    names = exposed(gw.get("/metrics").text) | exposed(httpx.get(sv.url + "/metrics").text)
    missing = referenced() - names - set(LIVE_QUALITY_METRICS)
    assert missing == set(), f"the ops/ files name metrics nobody exposes: {sorted(missing)}"
    assert set(LIVE_QUALITY_METRICS) <= referenced()  # the dashboard shows the future ones too


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip(NO_PROMTOOL)
    return tool


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    tool = _promtool()
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULES_TEST)]):
        done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_grafana_json_with_a_query_per_panel() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "balanceroute" and len(dash["panels"]) >= 10
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in dash["panels"])


def _rules_state(url: str) -> list[dict]:
    groups = httpx.get(url + "/api/v1/rules", timeout=5).json()["data"]["groups"]
    return groups


@pytest.mark.slow
@pytest.mark.server
def test_a_real_prometheus_scrapes_the_gateway_and_evaluates_the_rules(live) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not found: install Debian's prometheus package")
    gw, sv, base = live["gateway"], live["service"], live["base"]
    port = free_port()
    config = base / "prometheus.yml"
    targets = [gw.url.removeprefix("http://"), sv.url.removeprefix("http://")]
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "balanceroute", "static_configs": [{"targets": targets}]}],
    }))  # fmt: skip
    prom = ServerProcess(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={base / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        log=base / "prometheus.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        prom.wait_ready([url + "/-/ready"], timeout_s=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            groups = _rules_state(url)
            rules = [r for g in groups for r in g["rules"]]
            ups = httpx.get(url + "/api/v1/query", params={"query": "up"}, timeout=5).json()
            up = [float(s["value"][1]) for s in ups["data"]["result"]]
            if rules and all(r.get("lastEvaluation", "").startswith("2") and
                             r["health"] == "ok" for r in rules) and up == [1.0, 1.0]:  # fmt: skip
                break
            time.sleep(1)
        names = {g["name"] for g in groups}
        assert names == {"balanceroute-gateway", "balanceroute-service",
                         "balanceroute-prediction-quality"}, prom.log()  # fmt: skip
        assert all(r["health"] == "ok" for r in rules), rules
        assert up == [1.0, 1.0], ups
        pool = httpx.get(url + "/api/v1/query", timeout=5,
                         params={"query": "balanceroute_gateway_pool_size"}).json()  # fmt: skip
        assert pool["data"]["result"], pool  # the gateway's series reached Prometheus
    finally:
        prom.terminate()
