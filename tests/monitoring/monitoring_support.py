"""What the monitoring tests share: paths, promtool, and the series names rules and panels use."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "monitoring"
RULES = ROLE / "files" / "rules" / "llm-deploy.rules.yml"
DASHBOARD = ROLE / "files" / "grafana" / "llm-deploy.json"
CACHE = Path(os.environ.get("DEPLOY_CACHE_DIR", REPO / ".cache"))

# PromQL words that are no series: functions, aggregations, keywords, units, label names after by/on.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_RANGES = re.compile(r"\[[^\]]*\]")
_KEYWORDS = frozenset(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile by without on ignoring group_left"
    " group_right and or unless bool offset abs absent absent_over_time ceil changes clamp clamp_max clamp_min"
    " day_of_month day_of_week days_in_month delta deriv exp floor histogram_quantile holt_winters hour idelta"
    " increase irate label_join label_replace ln log2 log10 minute month predict_linear rate resets round"
    " scalar sgn sort sort_desc sqrt time timestamp vector year avg_over_time min_over_time max_over_time"
    " sum_over_time count_over_time quantile_over_time stddev_over_time stdvar_over_time last_over_time"
    " present_over_time inf nan".split()
)
# Series Prometheus makes itself (not scraped).
SYNTHETIC = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds", "scrape_samples_scraped"})


def promtool() -> str:
    """promtool from Debian's package, fetched into the cache by tools/fetch-prometheus (make setup)."""
    proc = subprocess.run(
        [str(REPO / "tools" / "fetch-prometheus"), "--promtool"],
        capture_output=True,
        text=True,
        env=dict(os.environ, DEPLOY_CACHE_DIR=str(CACHE)),
        timeout=300,
    )
    assert proc.returncode == 0, f"tools/fetch-prometheus failed: {proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


def series_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label names, strings and functions left out)."""
    text = _STRINGS.sub('""', expr)
    text = _LABEL_LIST.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables ($__rate_interval, $host)
    names = set()
    for match in _NAME.finditer(text):
        name = match.group(0)
        following = text[match.end() :].lstrip()
        if name in _KEYWORDS or following.startswith("("):
            continue
        if re.fullmatch(r"\d+[smhdwy]", name) or name[0].isdigit():
            continue
        names.add(name)
    return names


def rules() -> list[dict]:
    """Every rule of the rules file."""
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expression) of every target of the dashboard."""
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        if variable.get("type") == "query" and query:
            inner = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query)
            out.append((f"variable {variable['name']}", inner))
    return out
