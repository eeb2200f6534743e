"""testinfra: `systemctl restart` of the deployed unit lets the streams in flight finish.

Runs last (after test_default.py): it restarts the server. Inside the container a probe
opens STREAMS streaming chat completions against the deployed server, asks systemd for a
restart once the server took them all, and measures every stream, then the first token of
the new server. The downtime printed is from the old server's last token to the new
server's first token (the stop drains first, so it is the new server's start).
"""

from __future__ import annotations

import base64
import json

UNIT = "inference-server"
PORT = 8000
STREAMS = 3
TOKENS = 128

PROBE = r"""
import json, os, socket, subprocess, sys, threading, time, urllib.request
port, model, streams, tokens, unit = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
url = "http://127.0.0.1:%d/v1/chat/completions" % port

def chat(out, n, timeout=120):
    body = {"model": model, "stream": True, "max_tokens": n, "messages": [{"role": "user", "content": "Count."}],
            "generation_config": json.dumps({"min_new_tokens": n, "max_new_tokens": n, "do_sample": False})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    out.update(first=None, last=None, finish=None, tokens=None, error=None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    out["tokens"] = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        out["last"] = time.time()
                        out["first"] = out["first"] or out["last"]
                    out["finish"] = choice.get("finish_reason") or out["finish"]
    except Exception as exc:
        out["error"] = repr(exc)
    out["ended"] = time.time()

def refused():
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True

def journal_count(text):
    return subprocess.run(["journalctl", "-u", unit, "--no-pager", "-o", "cat"], capture_output=True,
                          text=True).stdout.count(text)

received_before = journal_count("[Request received]")
results = [{} for _ in range(streams)]
threads = [threading.Thread(target=chat, args=(r, tokens)) for r in results]
for t in threads:
    t.start()
deadline = time.time() + 120
while not (any(r.get("first") for r in results) and journal_count("[Request received]") - received_before >= streams):
    if time.time() > deadline:
        print(json.dumps({"error": "the streams never started", "streams": results}))
        sys.exit(1)
    time.sleep(0.2)
pid_before = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit],
                            capture_output=True, text=True).stdout.strip()
# The unit allows inference_server_start_limit_burst (3) starts in 10 min, restarts by hand
# included; the scenario's deploys and drifts have used them. Clear the count, as a
# deploy does before its deliberate restarts, so this restart is not refused.
subprocess.run(["systemctl", "reset-failed", unit], check=False)
restart = time.time()
subprocess.run(["systemctl", "restart", "--no-block", unit], check=True)
# The old server closes its port at once; from then on an answer is the new server's.
while not refused():
    if time.time() - restart > 30:
        break
    time.sleep(0.05)
closed = time.time()
new = {}
while time.time() - restart < 600:
    probe = {}
    chat(probe, 4, timeout=30)
    if probe.get("first") and not probe.get("error"):
        new = probe
        break
    time.sleep(0.2)
for t in threads:
    t.join(120)

def show():
    out = subprocess.run(["systemctl", "show", "-p", "MainPID", "-p", "KillMode", "-p", "TimeoutStopUSec", "-p",
                          "ActiveState", unit], capture_output=True, text=True).stdout.splitlines()
    return dict(line.split("=", 1) for line in out if "=" in line)

# ExecStartPost (wait-ready) turns the unit active once /health answers.
state = show()
while state.get("ActiveState") != "active" and time.time() - restart < 660:
    time.sleep(0.5)
    state = show()

def in_unit(pid):
    try:
        with open("/proc/%s/cgroup" % pid) as handle:
            return ("/%s.service" % unit) in handle.read()
    except OSError:
        return False

procs = sorted(p for p in os.listdir("/proc") if p.isdigit() and in_unit(p))
last_old = max((r["last"] for r in results if r.get("last")), default=None)
print(json.dumps({"streams": results, "restart": restart, "port_closed_s": closed - restart,
                  "last_old_token_s": last_old and last_old - restart,
                  "new_first_token_s": new.get("first") and new["first"] - restart,
                  "downtime_s": (new.get("first") and last_old) and new["first"] - last_old,
                  "pid_before": pid_before, "unit": state, "unit_processes": procs}))
"""


def test_a_restart_lets_every_stream_in_flight_finish_and_reports_the_downtime(host):
    model = host.file("/srv/models/tiny-qwen3.5/current").linked_to
    unit = host.file(f"/etc/systemd/system/{UNIT}.service").content_string
    assert f" serve {model} " in unit, "the probe must ask for the model the unit serves"
    encoded = base64.b64encode(PROBE.encode()).decode()
    run = host.run(
        f"echo {encoded} | base64 -d > /tmp/drain-probe.py && "
        f"python3 /tmp/drain-probe.py {PORT} {model} {STREAMS} {TOKENS} {UNIT}"
    )
    assert run.rc == 0, run.stdout + run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for i, stream in enumerate(report["streams"]):
        print(
            "stream {:d}: {} tokens, finish {}, error {}, ended {:.2f} s after the restart was asked".format(
                i, stream.get("tokens"), stream.get("finish"), stream.get("error"), stream["ended"] - report["restart"]
            )
        )
    print(
        "old server: port closed {:.2f} s and last token {:.2f} s after the restart was asked; new server: first "
        "token {:.2f} s after it; downtime (old last token to new first token) {:.2f} s".format(
            report["port_closed_s"], report["last_old_token_s"], report["new_first_token_s"], report["downtime_s"]
        )
    )
    cut = [s for s in report["streams"] if s.get("error") or s.get("finish") != "length" or s.get("tokens") != TOKENS]
    assert not cut, f"{len(cut):d} of {STREAMS:d} streams were cut by the restart: {report}"
    assert all(s["ended"] > report["restart"] for s in report["streams"]), "a stream ended before the restart"
    # systemd's own reading of the unit, and a new main process that serves.
    assert report["unit"]["KillMode"] == "mixed"
    assert report["unit"]["TimeoutStopUSec"] == "2min 30s"
    assert report["unit"]["ActiveState"] == "active"
    assert report["unit"]["MainPID"] not in ("0", report["pid_before"])
    assert report["new_first_token_s"] is not None
    # The old server drained: uvicorn waited for its connections, then exited.
    journal = host.run(f"journalctl -u {UNIT} --no-pager -o cat").stdout
    assert "Waiting for connections to close" in journal
    # No process of the old server is left in the unit's control group: only the new main process.
    assert report["unit_processes"] == [report["unit"]["MainPID"]], report["unit_processes"]
