"""Every series the alert rules and the dashboard name exists in a real capture.

The captures are /metrics texts of the real programs, committed with the command that made
them: SGLang per supported version (``bench/results/sglang-<version>-metrics.txt``, the GPU
machine at real size, bench/results/realsize-0.5.17.md), smg (``bench/results/smg-1.13.0-metrics.txt``,
tools/capture-smg-metrics on CPU), and the project's own textfile series as
filter_plugins/prometheus_textfile.py renders them. The supported SGLang versions are read from
tools/deploytools/launch_plan/engines.json; a version without a capture yet is listed, not guessed.
SGLang versions name their series ``sglang:x`` or ``sglang_x`` (sglang#34408); the scrape config
renames the second to the first, so either spelling in a capture satisfies a ``sglang:`` name.
"""

from __future__ import annotations

import importlib.util
import json
import re
import warnings

import pytest
from monitoring_support import REPO, SYNTHETIC, dashboard_exprs, rules, series_names

RESULTS = REPO / "bench" / "results"
ENGINES = json.loads((REPO / "tools" / "deploytools" / "launch_plan" / "engines.json").read_text())
SUPPORTED = sorted(ENGINES["sglang"]["supported"])
SMG_CAPTURES = sorted(RESULTS.glob("smg-*-metrics.txt"))

spec = importlib.util.spec_from_file_location("prometheus_textfile", REPO / "filter_plugins" / "prometheus_textfile.py")
textfile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(textfile)


def exposition_names(text: str) -> set[str]:
    """The sample names of a /metrics text (``sglang_x`` also as ``sglang:x``, as the scrape renames it)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            names.add(name)
            if name.startswith("sglang_"):
                names.add("sglang:" + name[len("sglang_") :])
    return names


def sglang_captures() -> dict[str, set[str]]:
    """Series names per supported SGLang version that has a capture."""
    out = {}
    for version in SUPPORTED:
        path = RESULTS / f"sglang-{version}-metrics.txt"
        if path.exists():
            out[version] = exposition_names(path.read_text())
    return out


def project_textfile_names() -> set[str]:
    """Every series filter_plugins/prometheus_textfile.py writes (a full report, and a rollback)."""
    full = {
        "decode_tps": 50,
        "ttft_p50_s": 0.2,
        "ttft_p95_s": 0.3,
        "accept_length": 2.5,
        "passed": True,
        "timestamp": 1,
        "min_decode_tps": 30,
        "min_accept_length": 1.5,
    }
    text = textfile.prometheus_textfile(full, {"host": "h"}) + textfile.prometheus_rollback_textfile(1, {"host": "h"})
    return exposition_names(text)


def known_names() -> set[str]:
    """Every series some capture of a supported version (or the project's textfile) holds."""
    names = set(SYNTHETIC) | project_textfile_names()
    for captured in sglang_captures().values():
        names |= captured
    for path in SMG_CAPTURES:
        names |= exposition_names(path.read_text())
    return names


def used_names() -> dict[str, set[str]]:
    """Series name -> where it is used (rule or panel)."""
    used: dict[str, set[str]] = {}
    for rule in rules():
        for name in series_names(rule["expr"]):
            used.setdefault(name, set()).add(f"rule {rule['alert']}")
    for title, expr in dashboard_exprs():
        for name in series_names(expr):
            used.setdefault(name, set()).add(f"panel {title!r}")
    return used


def test_there_are_captures_to_check_against():
    assert sglang_captures(), f"no bench/results/sglang-<version>-metrics.txt for any of {SUPPORTED}"
    assert SMG_CAPTURES, "no bench/results/smg-<version>-metrics.txt"
    missing = [v for v in SUPPORTED if v not in sglang_captures()]
    if missing:
        warnings.warn(f"supported SGLang versions without a /metrics capture yet: {missing}", stacklevel=1)


def test_every_series_of_the_rules_and_the_dashboard_is_in_a_capture():
    known = known_names()
    unknown = {name: sorted(where) for name, where in used_names().items() if name not in known}
    assert unknown == {}, f"series no capture of a supported version holds (renamed upstream?): {unknown}"


def test_the_rules_and_the_dashboard_use_each_kind_of_series():
    used = set(used_names())
    assert {"sglang:num_queue_reqs", "smg_worker_health", "llm_gate_passed", "up"} <= used
    assert {"sglang:spec_accept_length", "sglang:mamba_usage", "llm_rollback_last_timestamp_seconds"} <= used


@pytest.mark.parametrize(
    "expr, names",
    [
        ('max by (host) (sglang:token_usage{host=~"$host"}) > 0.95', {"sglang:token_usage"}),
        (
            "histogram_quantile(0.95, sum by (host, le) (rate(sglang:time_to_first_token_seconds_bucket[5m])))",
            {"sglang:time_to_first_token_seconds_bucket"},
        ),
        ('up{job="sglang"} == 1 unless on(instance) sglang:num_running_reqs', {"up", "sglang:num_running_reqs"}),
        ("time() - llm_gate_last_run_timestamp_seconds > 26 * 3600", {"llm_gate_last_run_timestamp_seconds"}),
    ],
)
def test_series_names_are_read_from_promql(expr, names):
    assert series_names(expr) == names


def test_a_renamed_series_is_caught():
    """A name no capture holds (sglang:num_queue_requests) is reported, either prefix accepted."""
    known = known_names()
    assert "sglang:num_queue_reqs" in known and "sglang:num_queue_requests" not in known
    assert "sglang:num_running_reqs" in exposition_names("sglang_num_running_reqs 1\n")


def test_textfile_series_are_what_the_filter_writes():
    """The llm_* names the rules and panels use are exactly among the filter's output."""
    written = project_textfile_names()
    used = {name for name in used_names() if name.startswith("llm_")}
    assert used <= written, used - written
    assert {"llm_gate_passed", "llm_gate_min_accept_length", "llm_rollback_last_timestamp_seconds"} <= written
