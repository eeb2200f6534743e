#!/usr/bin/python
"""Ansible module: wait, bounded, until an inference server has no request in flight.

Kept instead of ``ansible.builtin.uri`` with ``until``: ``settle`` (0 on polls in a row) and the
count of connections in ``/proc/net/tcp*`` cannot be said with them (docs/architecture.md,
'Hand-written code beside a library or builtin').
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: inflight_wait
short_description: Wait until the inference server on this host has finished its in-flight requests
description:
  - Run on the serving host after the gateway stopped routing to it. Polls until the
    server's in-flight count has read 0 on C(settle) consecutive polls, or C(timeout_s) passed.
  - C(source=metrics) sums the named gauges of the server's Prometheus C(/metrics) (SGLang
    with C(--enable-metrics), that is C(sglang:num_running_reqs) and C(sglang:num_queue_reqs)).
  - C(source=connections) counts established TCP connections to the server's port, from
    C(/proc/net/tcp) and C(/proc/net/tcp6) of the host's network namespace; a streaming
    request holds its connection until the last token (the engine-neutral signal for
    engines without metrics, such as C(transformers serve)). The gateway closes idle pooled
    connections after a few seconds, so 0 means no request of the gateway is left.
  - Never reports a change. On timeout it returns C(timed_out=true) (the caller warns and
    goes on; the wait is bounded), unless C(fail_on_timeout).
options:
  source:
    description: Where the in-flight count comes from.
    type: str
    choices: [metrics, connections]
    default: connections
  metrics_url:
    description: The server's Prometheus endpoint (source=metrics).
    type: str
    default: ""
  metrics:
    description: Gauges summed into the in-flight count (every label set of each).
    type: list
    elements: str
    default: ["sglang:num_running_reqs", "sglang:num_queue_reqs"]
  port:
    description: The server's TCP port (source=connections).
    type: int
    default: 0
  timeout_s:
    description: Longest wait in seconds.
    type: float
    default: 300
  interval_s:
    description: Seconds between polls.
    type: float
    default: 1
  settle:
    description: Consecutive polls that must read 0.
    type: int
    default: 2
  fail_on_timeout:
    description: Fail instead of returning C(timed_out=true).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Wait for SGLang's running and queued requests to finish
  inflight_wait:
    source: metrics
    metrics_url: http://127.0.0.1:30000/metrics
    timeout_s: 600

- name: Wait for the rehearsal server's streams to end
  inflight_wait:
    source: connections
    port: 8000
    timeout_s: 120
"""

RETURN = r"""
inflight_before:
  description: The in-flight count at the first poll (null when it could not be read).
  type: int
  returned: always
inflight:
  description: The in-flight count at the last poll.
  type: int
  returned: always
waited_s:
  description: Seconds waited.
  type: float
  returned: always
timed_out:
  description: True when the count was still above 0 at the timeout.
  type: bool
  returned: always
"""

import re  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

ESTABLISHED = "01"
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metrics_count(text: str, names: list[str]) -> int:
    """Sum every sample of the named metrics in a Prometheus exposition text."""
    wanted = set(names)
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in wanted:
            try:
                total += float(match.group(3))
            except ValueError:
                continue
    return int(round(total))


def connections_count(port: int, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> int:
    """Established TCP connections whose local port is ``port``."""
    count = 0
    for table in tables:
        try:
            with open(table, encoding="ascii") as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == ESTABLISHED and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        count += 1
        except FileNotFoundError:
            continue
    return count


def read_count(params: dict) -> int | None:
    """The current in-flight count, or None when the metrics cannot be read."""
    if params["source"] == "connections":
        return connections_count(params["port"])
    try:
        with urllib.request.urlopen(params["metrics_url"], timeout=10) as response:  # noqa: S310
            return metrics_count(response.read().decode(errors="replace"), params["metrics"])
    except (urllib.error.URLError, OSError, ValueError):
        return None


def run(params: dict) -> dict:
    """Poll until the count settles at 0 or the timeout passes."""
    started = time.monotonic()
    first = read_count(params)
    count, zeros = first, 0
    while True:
        zeros = zeros + 1 if count == 0 else 0
        waited = time.monotonic() - started
        if zeros >= params["settle"] or waited >= params["timeout_s"]:
            break
        time.sleep(params["interval_s"])
        count = read_count(params)
    return {
        "changed": False,
        "inflight_before": first,
        "inflight": count,
        "waited_s": round(waited, 2),
        "timed_out": zeros < params["settle"],
    }


def main() -> None:
    """Entry point."""
    module = AnsibleModule(
        argument_spec={
            "source": {"type": "str", "choices": ["metrics", "connections"], "default": "connections"},
            "metrics_url": {"type": "str", "default": ""},
            "metrics": {
                "type": "list",
                "elements": "str",
                "default": ["sglang:num_running_reqs", "sglang:num_queue_reqs"],
            },
            "port": {"type": "int", "default": 0},
            "timeout_s": {"type": "float", "default": 300},
            "interval_s": {"type": "float", "default": 1},
            "settle": {"type": "int", "default": 2},
            "fail_on_timeout": {"type": "bool", "default": False},
        },
        required_if=[("source", "metrics", ["metrics_url"]), ("source", "connections", ["port"])],
        supports_check_mode=True,
    )
    result = run(module.params)
    if result["timed_out"] and module.params["fail_on_timeout"]:
        module.fail_json(
            msg=f"the server still had {result['inflight']} request(s) in flight after "
            f"{module.params['timeout_s']:.0f} s",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
