"""filter_plugins/prometheus_textfile.py: the gate's figures in Prometheus text format.

Every output is read back by ``parse_exposition``, a strict little parser of the text
exposition format (HELP/TYPE before the samples of their family, families contiguous,
valid names, quoted and escaped label values, float values, no duplicate series, a final
newline), so a malformed file fails the tests the way node_exporter would refuse it.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_nightly_support import FIXTURE, REPO, recorded_event

spec = importlib.util.spec_from_file_location("prometheus_textfile", REPO / "filter_plugins" / "prometheus_textfile.py")
pt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pt)

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}

Series = tuple[str, tuple[tuple[str, str], ...]]


def _parse_labels(text: str, line: str) -> tuple[tuple[str, str], ...]:
    """``a="x",b="y\\"z"`` -> (("a", "x"), ("b", 'y"z')), strictly."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        match = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)=\"").match(text, i)
        assert match, f"bad label syntax at {text[i:]!r} in {line!r}"
        name, i = match.group(1), match.end()
        value = []
        while True:
            assert i < len(text), f"unterminated label value in {line!r}"
            ch = text[i]
            if ch == "\\":
                nxt = text[i + 1]
                assert nxt in ("\\", '"', "n"), f"bad escape \\{nxt} in {line!r}"
                value.append({"\\": "\\", '"': '"', "n": "\n"}[nxt])
                i += 2
            elif ch == '"':
                i += 1
                break
            else:
                assert ch != "\n"
                value.append(ch)
                i += 1
        assert name not in dict(pairs), f"duplicate label {name} in {line!r}"
        pairs.append((name, "".join(value)))
        if i < len(text):
            assert text[i] == ",", f"expected ',' at {text[i:]!r} in {line!r}"
            i += 1
    return tuple(sorted(pairs))


def parse_exposition(text: str) -> dict[str, dict[str, object]]:
    """{family: {"help": str, "type": str, "samples": {labels-tuple: float}}}; asserts on any error."""
    assert text.endswith("\n"), "the file must end with a newline"
    families: dict[str, dict[str, object]] = {}
    seen: set = set()
    current = None
    finished: set = set()
    for line in text[:-1].split("\n"):
        assert line.strip(), "empty line"
        if line.startswith("#"):
            match = re.match(r"^# (HELP|TYPE) (\S+) (.+)$", line)
            assert match, f"bad comment line {line!r}"
            kind, name, rest = match.groups()
            assert METRIC_NAME.match(name), name
            if name != current:
                assert name not in finished and name not in families, f"family {name} is split"
                if current:
                    finished.add(current)
                current = name
                families[name] = {"help": None, "type": None, "samples": {}}
            fam = families[name]
            assert not fam["samples"], f"{kind} before the samples of {name}"
            key = kind.lower()
            assert fam[key] is None, f"second {kind} for {name}"
            if kind == "TYPE":
                assert rest in TYPES, rest
            fam[key] = rest
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( -?\d+)?$", line)
        assert match, f"bad sample line {line!r}"
        name, _, label_text, value = match.group(1), match.group(2), match.group(3), match.group(4)
        assert name == current, f"sample of {name} outside its family ({current})"
        fam = families[name]
        assert fam["help"] is not None and fam["type"] is not None, f"{name} has no HELP/TYPE"
        labels = _parse_labels(label_text, line) if label_text else ()
        series = (name, labels)
        assert series not in seen, f"duplicate series {series!r}"
        seen.add(series)
        fam["samples"][labels] = float(value)
    return families


def sample(families, name, **labels) -> float:
    """The value of one series."""
    return families[name]["samples"][tuple(sorted(labels.items()))]


FLAT = {
    "decode_tps": 52.1,
    "ttft_p50_s": 0.31,
    "ttft_p95_s": 0.41,
    "accept_length": 2.1,
    "passed": True,
    "timestamp": "2026-11-30T02:00:41Z",
    "min_decode_tps": 30,
    "min_accept_length": 1.5,
    "eval_score": 0.975,
    "min_eval_score": 0.9,
}


def test_flat_report_round_trips():
    text = pt.prometheus_textfile(FLAT, {"host": "ct129", "engine": "sglang"})
    fam = parse_exposition(text)
    labels = {"host": "ct129", "engine": "sglang"}
    assert sample(fam, "llm_gate_decode_tokens_per_second", **labels) == 52.1
    assert sample(fam, "llm_gate_ttft_seconds", quantile="0.5", **labels) == 0.31
    assert sample(fam, "llm_gate_ttft_seconds", quantile="0.95", **labels) == 0.41
    assert sample(fam, "llm_gate_accept_length", **labels) == 2.1
    assert sample(fam, "llm_gate_passed", **labels) == 1
    stamp = dt.datetime(2026, 11, 30, 2, 0, 41, tzinfo=dt.timezone.utc).timestamp()
    assert sample(fam, "llm_gate_last_run_timestamp_seconds", **labels) == stamp
    assert sample(fam, "llm_gate_min_decode_tokens_per_second", **labels) == 30
    assert sample(fam, "llm_gate_min_accept_length", **labels) == 1.5
    assert sample(fam, "llm_gate_eval_score", **labels) == 0.975
    assert sample(fam, "llm_gate_min_eval_score", **labels) == 0.9
    assert list(fam) == [m[0] for m in pt.METRICS]
    assert all(f["type"] == "gauge" and f["help"] for f in fam.values())


def test_recorded_gate_report_is_mapped():
    """The health_gate module's whole report (recorded) works as input."""
    report = recorded_event("health_gate_pass.json")["event_data"]["res"]["report"]
    fam = parse_exposition(pt.prometheus_textfile(report, {"host": "ct129"}))
    assert sample(fam, "llm_gate_decode_tokens_per_second", host="ct129") == report["aggregate"]["decode_tps_mean"]
    assert sample(fam, "llm_gate_ttft_seconds", host="ct129", quantile="0.95") == report["aggregate"]["ttft_p95_s"]
    assert sample(fam, "llm_gate_accept_length", host="ct129") == report["speculative"]["accept_length"]
    assert sample(fam, "llm_gate_passed", host="ct129") == 1
    thresholds = report["thresholds"]
    assert sample(fam, "llm_gate_min_accept_length", host="ct129") == thresholds["min_accept_length"]
    assert sample(fam, "llm_gate_min_decode_tokens_per_second", host="ct129") == thresholds["min_decode_tps"]
    failed = recorded_event("health_gate_fail.json")["event_data"]["res"]["report"]
    assert sample(parse_exposition(pt.prometheus_textfile(failed)), "llm_gate_passed") == 0


def test_missing_figures_leave_their_family_out():
    report = {"passed": False, "timestamp": 1764468041, "decode_tps": None, "accept_length": None, "ttft_p50_s": 1.5}
    fam = parse_exposition(pt.prometheus_textfile(report))
    assert set(fam) == {"llm_gate_ttft_seconds", "llm_gate_passed", "llm_gate_last_run_timestamp_seconds"}
    assert fam["llm_gate_ttft_seconds"]["samples"] == {(("quantile", "0.5"),): 1.5}
    assert sample(fam, "llm_gate_last_run_timestamp_seconds") == 1764468041
    assert "decode" not in pt.prometheus_textfile(report)


def test_rollback_time_is_rendered_and_a_missing_one_refused():
    fam = parse_exposition(pt.prometheus_rollback_textfile("2026-11-30T02:05:00Z", {"host": "ct129"}))
    stamp = dt.datetime(2026, 11, 30, 2, 5, tzinfo=dt.timezone.utc).timestamp()
    assert fam["llm_rollback_last_timestamp_seconds"]["samples"] == {(("host", "ct129"),): stamp}
    assert fam["llm_rollback_last_timestamp_seconds"]["type"] == "gauge"
    with pytest.raises(pt.AnsibleFilterError, match="timestamp is missing"):
        pt.prometheus_rollback_textfile(None)


def test_label_values_are_escaped():
    odd = 'a "quoted" \\ back\nslash'
    fam = parse_exposition(pt.prometheus_textfile({"passed": True}, {"model": odd}))
    assert sample(fam, "llm_gate_passed", model=odd) == 1


@pytest.mark.parametrize(
    "report, labels, message",
    [
        ({"decode_tps": 5}, None, "has no 'passed'"),
        ({"passed": "maybe"}, None, "passed must be a boolean"),
        ({"passed": True, "decode_tps": "fast"}, None, "decode_tps must be a number"),
        ({"passed": True, "decode_tps": True}, None, "decode_tps must be a number"),
        ({"passed": True, "ttft_p95_s": float("inf")}, None, "must be finite"),
        ({"passed": True, "timestamp": "last tuesday"}, None, "timestamp must be ISO 8601"),
        ({"passed": True}, {"quantile": "x"}, "not a usable label name"),
        ({"passed": True}, {"__name__": "x"}, "not a usable label name"),
        ({"passed": True}, {"bad-name": "x"}, "not a usable label name"),
        ({"passed": True}, {"host": None}, "has no value"),
        ({"passed": True}, ["host"], "labels must be a mapping"),
        ("not a report", None, "expects a mapping"),
    ],
)
def test_bad_input_is_refused(report, labels, message):
    with pytest.raises(pt.AnsibleFilterError, match=re.escape(message)):
        pt.prometheus_textfile(report, labels)


def test_values_and_timestamps_are_exact():
    fam = parse_exposition(
        pt.prometheus_textfile({"passed": "false", "decode_tps": "48.25", "timestamp": "2026-11-30T03:00:41+01:00"})
    )
    assert sample(fam, "llm_gate_passed") == 0
    assert sample(fam, "llm_gate_decode_tokens_per_second") == 48.25
    assert (
        sample(fam, "llm_gate_last_run_timestamp_seconds")
        == dt.datetime(2026, 11, 30, 2, 0, 41, tzinfo=dt.timezone.utc).timestamp()
    )
    assert pt.gate_metrics({"passed": True, "decode_tps": float("nan")})["decode_tps"] is None


def test_parser_rejects_malformed_text():
    """The checker itself catches what node_exporter would refuse."""
    good = pt.prometheus_textfile(FLAT)
    bad_texts = [
        good.rstrip("\n"),  # no final newline
        good.replace("# TYPE llm_gate_passed gauge\n", ""),  # a family without TYPE
        good + "llm_gate_passed 1\n",  # a series twice / split family
        good.replace('quantile="0.5"', "quantile=0.5"),  # unquoted label value
        good.replace("llm_gate_passed 1", "llm_gate_passed one"),  # not a number
    ]
    for text in bad_texts:
        with pytest.raises((AssertionError, ValueError)):
            parse_exposition(text)


def test_filter_writes_the_textfile_through_ansible(tmp_path):
    """Loaded by Ansible from filter_plugins/, written by copy, reported as no change."""
    report = recorded_event("health_gate_pass.json")["event_data"]["res"]["report"]
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps({"fixture_gate_report": report, "fixture_textfile_dir": str(tmp_path)}))
    playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or "ansible-playbook"
    env = dict(
        os.environ,
        ANSIBLE_FILTER_PLUGINS=str(REPO / "filter_plugins"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CONFIG=str(FIXTURE / "ansible.cfg"),
    )
    for _ in range(2):
        proc = subprocess.run(
            [
                playbook,
                str(FIXTURE / "prometheus.yml"),
                "-i",
                "localhost,",
                "-e",
                f"@{vars_file}",
                "-e",
                f"ansible_python_interpreter={sys.executable}",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert re.search(r"localhost\s+: ok=1\s+changed=0", proc.stdout), proc.stdout
    path = tmp_path / "llm_gate.prom"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    fam = parse_exposition(path.read_text())
    assert (
        sample(fam, "llm_gate_decode_tokens_per_second", host="localhost", engine="sglang")
        == report["aggregate"]["decode_tps_mean"]
    )
