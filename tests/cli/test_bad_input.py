"""Bad input to every command and option: exit code 2, one line on stderr naming what is wrong,
no traceback, and no file (or ``*.tmp``) left behind.

Each case runs the CLI in-process (``main``) in an empty working folder, so what it leaves there
is what the command wrote. Cases that pass the parser reach the library, whose checks must
answer the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from balanceroute.cli import main
from balanceroute.features.synthetic import generate
from balanceroute.features.trace_io import write_trace

SIM = ["simulate", "--preset", "geometric", "--requests", "50", "--saturate", "--out", "o"]
AB = ["ab", "--preset", "geometric", "--requests", "50", "--no-mlflow", "--out", "o"]
TRAIN = ["train", "--preset", "geometric", "--requests", "50"]
EVAL = ["evaluate", "--preset", "geometric", "--requests", "50"]
GW = ["gateway", "--rank", "http://127.0.0.1:9", "--slots", "2"]

# name -> (argv, words the one line must contain); "TRACE" is replaced by a valid trace file.
CASES: dict[str, tuple[list[str], list[str]]] = {
    # numbers: not numbers, out of range, not finite, overflowing
    "workers zero": ([*SIM, "--workers", "0"], ["--workers", "at least 1"]),
    "workers 1e8": ([*SIM, "--workers", "1e8"], ["--workers", "whole number"]),
    "workers huge": ([*SIM, "--workers", "100000000"], ["--workers", "at most"]),
    "workers 2^63": ([*SIM, "--workers", str(2**63)], ["--workers", "at most"]),
    "slots huge": ([*SIM, "--slots", str(10**30)], ["--slots", "at most"]),
    "group huge": ([*SIM, "--workers", "4096", "--slots", "65536"], ["G x B"]),
    "requests 1e30": ([*SIM, "--requests", "1e30"], ["--requests", "whole number"]),
    "horizon 1e8": ([*SIM, "--horizon", "100000000"], ["horizon"]),
    "train horizon": ([*TRAIN, "--horizon", "100000000"], ["--horizon", "at most"]),
    "t-token nan": ([*SIM, "--t-token", "nan"], ["--t-token", "finite"]),
    "t-fixed -1": ([*SIM, "--t-fixed", "-1"], ["--t-fixed", ">= 0"]),
    "t both zero": ([*SIM, "--t-fixed", "0", "--t-token", "0"], ["some time"]),
    "beta inf": ([*SIM, "--router", "brh", "--beta", "inf"], ["--beta", "finite"]),
    "beta 1e308": ([*SIM, "--router", "brh", "--beta", "1e308"], ["beta"]),
    "max-wait-s -1": ([*SIM, "--router", "brh", "--max-wait-s", "-1"], ["max_wait_s"]),
    "max-wait-s nan": ([*SIM, "--router", "brh", "--max-wait-s", "nan"], ["--max-wait-s"]),
    "window huge": ([*SIM, "--router", "brh", "--window", "100000"], ["window"]),
    "load zero": (
        ["simulate", "--preset", "geometric", "--requests", "50", "--load", "0", "--out", "o"],
        ["--load"],
    ),
    "rate-scale inf": ([*SIM[:-3], "--rate-scale", "inf", "--out", "o"], ["--rate-scale"]),
    "seed negative": ([*SIM, "--seed", "-1"], ["--seed"]),
    "train-fraction 5": ([*SIM, "--train-fraction", "5"], ["--train-fraction"]),
    "timeout 0": ([*SIM, "--estimator-timeout", "0"], ["--estimator-timeout"]),
    "predictor-timeout 0": ([*SIM, "--predictor-timeout", "0"], ["--predictor-timeout"]),
    "prefill instances": ([*SIM, "--prefill-instances", "-3"], ["--prefill-instances"]),
    "unknown router": ([*SIM, "--router", "nope"], ["--router", "invalid choice"]),
    # ab
    "ab jobs 0": ([*AB, "--arms", "count-jsq", "--jobs", "0"], ["--jobs", "at least 1"]),
    "ab repeats": ([*AB, "--arms", "count-jsq", "--repeats", "0"], ["--repeats"]),
    "ab workers": ([*AB, "--arms", "count-jsq", "--workers", "8,0"], ["--workers"]),
    "ab window-fraction": (
        [*AB, "--arms", "count-jsq", "--window-fraction", "5"],
        ["--window-fraction"],
    ),
    "ab gamma abc": ([*AB, "--arms", "brh:oracle{gamma=abc}"], ["gamma", "abc"]),
    "ab gamma 5": ([*AB, "--arms", "brh:oracle{gamma=5}"], ["gamma"]),
    "ab unknown arm": ([*AB, "--arms", "nope"], ["unknown router"]),
    "ab options unclosed": ([*AB, "--arms", "brh{gamma=0.9"], ["close"]),
    # trace
    "synth requests 0": (["trace", "synth", "--requests", "0", "--out", "t.csv"], ["--requests"]),
    "synth extension": (["trace", "synth", "--requests", "5", "--out", "t.xlsx"], ["extension"]),
    "split onto input": (
        ["trace", "split", "TRACE", "--head", "TRACE", "--tail", "b.csv"],
        ["input"],
    ),
    "split same outputs": (
        ["trace", "split", "TRACE", "--head", "a.csv", "--tail", "a.csv"],
        ["same"],
    ),
    "split at 1.5": (
        ["trace", "split", "TRACE", "--at", "1.5", "--head", "a", "--tail", "b"],
        ["--at"],
    ),
    "inspect missing": (["trace", "inspect", "missing.csv"], ["missing.csv", "no such file"]),
    "inspect limit": (["trace", "inspect", "TRACE", "--limit", "0"], ["--limit"]),
    "key-blocks": (["trace", "inspect", "TRACE", "--key-blocks", "0"], ["--key-blocks"]),
    # outputs
    "out is a file": (
        ["simulate", "--preset", "geometric", "--requests", "50", "--out", "TRACE"],
        ["file"],
    ),
    "ab out is a file": ([*AB[:-2], "--arms", "count-jsq", "--out", "TRACE"], ["file"]),
    "out unwritable": ([*SIM[:-2], "--out", "/proc/balanceroute/o"], ["/proc/balanceroute/o"]),
    "synth unwritable": (
        ["trace", "synth", "--requests", "5", "--out", "/proc/balanceroute/t.csv"],
        ["/proc/balanceroute/t.csv"],
    ),
    "evaluate unwritable": ([*EVAL, "--model-uri", "TRACE", "--out", "/proc/x"], ["TRACE"]),
    # models, estimators, services
    "not a model": ([*EVAL, "--model-uri", "TRACE", "--out", "e"], ["not a saved completion"]),
    "train unknown": ([*TRAIN, "--estimators", "nope"], ["unknown estimator"]),
    "estimator url": ([*SIM, "--router", "brh", "--estimator-url", "notaurl"], ["notaurl"]),
    "estimator ftp": ([*SIM, "--router", "brh", "--estimator-url", "ftp://x"], ["http"]),
    "estimator port": (
        [*SIM, "--router", "brh", "--estimator-url", "http://127.0.0.1:99999"],
        ["out of range"],
    ),
    "estimator down": (
        [*SIM, "--router", "brh", "--estimator-url", "http://127.0.0.1:9"],
        ["cannot reach"],
    ),
    "solve-step state": (["solve-step", "--state", "missing.json"], ["missing.json"]),
    "solve-step limit": (
        ["solve-step", "--state", "s.json", "--time-limit", "0"],
        ["--time-limit"],
    ),
    "serve log level": (
        ["serve", "--model-uri", "TRACE", "--log-level", "nonsense"],
        ["log_level"],
    ),
    "serve host": (["serve", "--model-uri", "TRACE", "--host", "300.1.1.1"], ["300.1.1.1"]),
    "serve port": (["serve", "--model-uri", "TRACE", "--port", "70000"], ["port"]),
    "pipeline no log": (["pipeline", "--log", "missing-log"], ["missing-log"]),
    "pipeline window": (["pipeline", "--log", "TRACE", "--window-rows", "0"], ["--window-rows"]),
    "pipeline gateway url": (["pipeline", "--log", "TRACE", "--gateway", "notaurl"], ["notaurl"]),
    "pipeline loop": (["pipeline", "--log", "TRACE", "--loop", "soon"], ["--loop"]),
    # the live test bed
    "emulate ranks 0": (["emulate", "--ranks", "0"], ["--ranks", "at least 1"]),
    "emulate time-scale nan": (["emulate", "--time-scale", "nan"], ["--time-scale", "finite"]),
    "emulate port": (["emulate", "--port-base", "70000"], ["port"]),
    "emulate output mean": (["emulate", "--output-mean", "-5"], ["--output-mean"]),
    "bench requests 0": (
        ["bench", "--url", "http://127.0.0.1:9", "--requests", "0", "--out", "o"],
        ["--requests"],
    ),
    "bench load": (
        ["bench", "--url", "http://127.0.0.1:9", "--load", "-1", "--out", "o"],
        ["--load"],
    ),
    "bench timeout": (
        ["bench", "--url", "http://127.0.0.1:9", "--request-timeout", "0", "--out", "o"],
        ["--request-timeout"],
    ),
    "bench concurrency": (
        ["bench", "--url", "http://127.0.0.1:9", "--concurrency-limit", "0", "--out", "o"],
        ["--concurrency-limit"],
    ),
    "bench url": (["bench", "--url", "notaurl", "--requests", "2", "--out", "o"], ["notaurl"]),
    # the gateway
    "gateway no rank": (["gateway", "--slots", "4", "--out", "o"], ["ranks"]),
    "gateway slots 0": ([*GW[:3], "--slots", "0"], ["--slots", "at least 1"]),
    "gateway no slots": (GW[:3], ["slots"]),
    "gateway url": (["gateway", "--rank", "notaurl", "--slots", "2"], ["notaurl"]),
    "gateway url twice": ([*GW, "--rank", "http://127.0.0.1:9"], ["twice"]),
    "gateway oracle": ([*GW, "--router", "brh", "--estimator", "oracle"], ["cannot run live"]),
    "gateway no history": ([*GW, "--router", "brh", "--estimator", "gbdt"], ["--history"]),
    "gateway exact": ([*GW, "--router", "exact"], ["cannot run live"]),
    "gateway router": ([*GW, "--router", "nope"], ["unknown router"]),
    "gateway arms": ([*GW, "--arms", "brh,brh"], ["arms given twice"]),
    "gateway switch-every": ([*GW, "--switch-every", "0s"], ["--switch-every"]),
    "gateway switch-every text": ([*GW, "--switch-every", "soon"], ["--switch-every"]),
    "gateway warmup": ([*GW, "--switch-every", "2s", "--warmup", "3s"], ["warmup"]),
    "gateway header": (
        [*GW, "--rank", "http://127.0.0.1:10", "--rank-header", "X-data-parallel-rank"],
        ["exactly one"],
    ),
    "gateway header size": ([*GW, "--rank-header", "X-data-parallel-rank"], ["group_size"]),
    "gateway tokenizer": ([*GW, "--tokenizer", "missing.json"], ["missing.json"]),
    "gateway not a tokenizer": ([*GW, "--tokenizer", "TRACE"], ["tokenizer"]),
    "gateway url and arms": (
        [*GW, "--arms", "brh,br0", "--estimator-url", "http://127.0.0.1:9"],
        ["estimator_url"],
    ),
    "gateway service down": (
        [*GW, "--router", "brh", "--estimator-url", "http://127.0.0.1:9"],
        ["cannot reach"],
    ),
    "gateway history": ([*GW, "--router", "brh:survival", "--history", "nope.csv"], ["nope.csv"]),
    "gateway port": ([*GW, "--port", "70000"], ["port"]),
    "gateway host": ([*GW, "--host", "300.1.1.1"], ["300.1.1.1"]),
    "gateway max-pool": ([*GW, "--max-pool", "0"], ["--max-pool"]),
}

ENV_CASES: dict[str, tuple[dict[str, str], list[str], list[str]]] = {
    "replay buffer 1e10": (
        {"BALANCEROUTE_REPLAY_BUFFER": "1e10"},
        ["serve", "--model-uri", "TRACE"],
        ["replay_buffer"],
    ),
    "replay buffer huge": (
        {"BALANCEROUTE_REPLAY_BUFFER": "10000000000"},
        ["serve", "--model-uri", "TRACE"],
        ["replay_buffer"],
    ),
    "token of spaces": (
        {"BALANCEROUTE_API_TOKEN": " " * 24},
        ["serve", "--model-uri", "TRACE"],
        ["BALANCEROUTE_API_TOKEN"],
    ),
    "limit not a number": (
        {"BALANCEROUTE_MAX_OUTPUT_TOKENS": "1e10"},
        ["trace", "inspect", "TRACE"],
        ["BALANCEROUTE_MAX_OUTPUT_TOKENS"],
    ),
    "limit above ceiling": (
        {"BALANCEROUTE_MAX_PROMPT_TOKENS": str(2**40)},
        ["trace", "inspect", "TRACE"],
        ["BALANCEROUTE_MAX_PROMPT_TOKENS"],
    ),
}


def _run(argv: list[str], folder: Path, capsys) -> tuple[int, str]:
    trace = folder / "in" / "t.csv"
    argv = [str(trace) if a == "TRACE" else a for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def _files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*")} - {Path("in"), Path("in/t.csv")}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder with one valid trace in ``in/`` and no tracking store around."""
    (tmp_path / "in").mkdir()
    write_trace(generate("geometric", 40, seed=0), tmp_path / "in" / "t.csv")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'none' / 'x.db'}")
    for key in [k for k in os.environ if k.startswith("BALANCEROUTE_")]:
        monkeypatch.delenv(key)
    return tmp_path


def _check(code: int, err: str, words: list[str], folder: Path) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word.replace("TRACE", str(folder / "in" / "t.csv")) in lines[0], (word, lines[0])
    left = _files(folder)
    assert not left, f"left behind: {sorted(map(str, left))}"


@pytest.mark.parametrize("case", list(CASES))
def test_bad_option_is_one_line_and_exit_2(case: str, workdir: Path, capsys) -> None:
    argv, words = CASES[case]
    code, err = _run(argv, workdir, capsys)
    _check(code, err, words, workdir)


@pytest.mark.parametrize("case", list(ENV_CASES))
def test_bad_environment_is_one_line_and_exit_2(
    case: str, workdir: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, argv, words = ENV_CASES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from balanceroute.features.limits import input_limits

    input_limits.cache_clear()
    try:
        code, err = _run(argv, workdir, capsys)
    finally:
        monkeypatch.undo()
        input_limits.cache_clear()
    _check(code, err, words, workdir)


def test_disk_errors_while_writing_are_one_line_and_leave_nothing(
    workdir: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (ENOSPC while the result is written) names the file; no ``*.tmp`` stays."""
    import errno
    import os

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # the first result flushed to disk is a Parquet file
    code, err = _run([*SIM[:-1], "sim"], workdir, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "No space left" in err and "parquet" in err
    assert not list(workdir.rglob("*.tmp")) and not list(workdir.rglob(".*.tmp"))
