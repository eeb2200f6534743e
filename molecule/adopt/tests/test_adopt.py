"""Adoption of a host that runs by hand: (b) a failed switch gives the by-hand server back,
(a) the adoption serves under systemd with the hand-built venv kept and a short gap, (c) a
plain deploy afterwards is a no-op; no secret of the by-hand environment in any output."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

# molecule/shared: the helpers of every scenario's verifier (molecule/shared/verify_steps.py).
from verify_steps import failed_output, recorded

FAKE_TOKEN = "hf_FAKE-adopt-token-not-a-real-one"
UNIT = "inference-server"
ADOPT_DIR = f"/var/lib/{UNIT}-deploy/adopt"


def step(name: str) -> dict:
    """Exit code, output (colours removed) and port owner of one step of converge.yml."""
    found = recorded(f"adopt-{name}.json")
    found["output"] = re.sub(r"\x1b\[[0-9;]*m", "", found["output"])
    return found


def origin() -> dict:
    """The by-hand server as prepare left it (llm-host inspect, masked)."""
    return recorded("adopt-origin.json")


def recap(output: str) -> dict:
    """The PLAY RECAP counters of the molecule-adopt host."""
    found = re.findall(r"molecule-adopt\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output)
    ok, changed, unreachable, failed = map(int, found[-1])
    return {"ok": ok, "changed": changed, "unreachable": unreachable, "failed": failed}


def test_origin_is_a_server_started_by_hand():
    found = origin()
    assert found["found"] and found["unit"] is None
    assert found["user"] == "root" and found["cwd"] == "/root"
    assert found["argv"][:3] == ["/root/ml-env/bin/python", "/root/ml-env/bin/transformers", "serve"]
    assert found["venv"] == "/root/ml-env" and found["model_dir"] == "/root/models/tiny-qwen3.5"
    assert found["stdout"] == "/root/sglang_serve.log"
    assert found["env_masked"]["HF_TOKEN"] == "***" and found["env_masked"]["OMP_NUM_THREADS"] == "1"


def test_plain_deploy_refuses_the_host_and_says_how_to_adopt():
    run = step("plain")
    out = failed_output(run)
    assert re.search(
        r"Port 30000 on molecule-adopt is already taken by /root/ml-env/bin/python "
        r"/root/ml-env/bin/transformers serve .*\(pid \d+, not a systemd service\); stop that process or "
        r"set inference_server_port to a free port, or take that server over without a gap with "
        r"deploy_adopt=true",
        out,
    )
    assert run["owner"]["pid"] == origin()["pid"]


def test_check_mode_finds_the_server_by_hand_and_leaves_it_serving():
    run = step("check")
    assert run["rc"] == 0, run["output"][-3000:]
    assert "server by hand: pid" in run["output"]
    assert run["owner"]["pid"] == origin()["pid"] and run["owner"]["unit"] is None


def test_b_failed_switch_fails_with_one_message_and_the_server_by_hand_serves_again():
    run = step("b")
    out = failed_output(run)
    assert "less than adopt_min_decode_share 100 of the by-hand server's" in out
    assert (
        "so the host is back on the server that ran by hand (started again as inference-server-by-hand.service"
    ) in out
    owner = run["owner"]
    # The same argv, working directory, user and environment, now under a transient unit.
    assert owner["found"] and owner["unit"] == "inference-server-by-hand.service"
    for key in ("argv", "cwd", "user", "uid", "gid", "venv", "model_dir", "stdout", "stderr"):
        assert owner[key] == origin()[key], key
    # Its whole environment again (systemd adds USER, LOGNAME and SHELL for --uid).
    assert origin()["env_masked"].items() <= owner["env_masked"].items()


def test_a_adoption_serves_under_systemd_with_the_venv_kept(host):
    run = step("a")
    assert run["rc"] == 0, run["output"][-3000:]
    assert "Adopted: by hand" in run["output"]
    assert not step("a")["owner"]["found"] and step("a")["owner"]["unit"] == f"{UNIT}.service"
    assert host.service(UNIT).is_running and host.service(UNIT).is_enabled
    link = host.file("/root/ml-env")
    assert link.is_symlink and link.linked_to.startswith("/root/ml-env.d/")
    kept = host.run("ls -d /root/ml-env.by-hand-*").stdout.split()
    assert len(kept) == 1 and host.file(f"{kept[0]}/bin/transformers").exists
    assert host.file(f"{kept[0]}/pyvenv.cfg").exists


def test_a_report_holds_before_and_after(host):
    report = json.loads(host.file(f"{ADOPT_DIR}/report.json").content_string)
    assert report["adopted"] is True
    assert report["before"]["decode_tps_mean"] > 0 and report["after"]["decode_tps_mean"] > 0
    assert report["share"] >= report["min_decode_share"]
    assert report["by_hand"]["venv_kept"].startswith("/root/ml-env.by-hand-")
    assert "HF_TOKEN" in report["by_hand"]["env_names"]
    assert FAKE_TOKEN not in host.file(f"{ADOPT_DIR}/report.json").content_string
    assert host.file(f"{ADOPT_DIR}/by-hand.env").mode == 0o600


def gate_reports(host) -> list[dict]:
    """Every gate report kept on the host, oldest first."""
    names = host.run(f"ls /var/lib/{UNIT}-deploy/gate/").stdout.split()
    return [
        json.loads(host.file(f"/var/lib/{UNIT}-deploy/gate/{name}").content_string)
        for name in sorted(names)
        if name.startswith("2") and name.endswith(".json")
    ]


def test_a_our_server_says_what_the_server_by_hand_said(host):
    """The by-hand server's answers, asked before it was stopped, are the reference of ours: the same
    model directory, so the same golden outputs (and the eval score against its score)."""
    reports = gate_reports(host)
    by_hand = [r for r in reports if (r.get("metadata") or {}).get("by_hand") and r.get("correctness")]
    assert by_hand, "the by-hand server's gate did not ask the correctness probe"
    ours = []
    for report in reports:
        checks = {c["name"]: c for c in report.get("checks") or []}
        if "golden_outputs" in checks and not (report.get("metadata") or {}).get("by_hand"):
            ours.append(checks)
    assert ours, "no gate of our server compared its outputs with the by-hand server's"
    golden = ours[-1]["golden_outputs"]
    assert golden["same"] == len(golden["prompts"]) == 5 and ours[-1]["eval_score_vs_last_known_good"]["ok"]


def test_a_gap_is_at_most_the_warm_start_plus_5_s():
    gap = recorded("adopt-gap.json")
    print(f"gap {gap['client']['gap_s']} s, warm start {gap['warm_start_s']:.2f} s")
    assert gap["client"]["answers"] > 10
    assert gap["client"]["gap_s"] <= float(gap["warm_start_s"]) + 5.0


def test_c_plain_deploy_after_the_adoption_is_a_no_op():
    run = step("c")
    assert run["rc"] == 0, run["output"][-3000:]
    assert recap(run["output"]) == {**recap(run["output"]), "changed": 0, "failed": 0}
    assert "Converged:" in run["output"]


def test_no_secret_of_the_by_hand_environment_in_any_output():
    for name in ("b", "a", "c"):
        assert FAKE_TOKEN not in step(name)["output"], name
    # (b) ran at -vvvv.
    assert "<molecule-adopt> ESTABLISH" in step("b")["output"] or "ESTABLISH DOCKER" in step("b")["output"]


def test_last_known_good_is_ours_after_the_adoption(host):
    state = json.loads(host.file(f"/var/lib/{UNIT}-deploy/last-known-good/state.json").content_string)
    assert state.get("kind", "unit") != "by-hand"
    assert state["venv_dir"].startswith("/root/ml-env.d/")


def test_status_shows_before_and_after():
    text = (Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "adopt-status.txt").read_text()
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())
    assert "adopted from a server run by hand: before (by hand, pid" in text
    assert "after (ours) gate PASS" in text and "hand-built venv kept at /root/ml-env.by-hand-" in text
