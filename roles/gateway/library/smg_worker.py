#!/usr/bin/python
"""Ansible module: put a worker into an smg gateway, or take it out, and wait for it.

Kept instead of ``ansible.builtin.uri``: one task where ``uri`` needs six, with idempotence, check
mode and the key kept out of the arguments (docs/architecture.md, 'Hand-written code beside a
library or builtin').
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: smg_worker
short_description: Register or remove one worker at an smg gateway and wait until it took effect
description:
  - Talks to smg's worker API on the gateway host (C(GET /workers), C(POST /workers),
    C(DELETE /workers/{id})) with the control-plane key read from the gateway's environment
    file on that host, so the key is never a module argument nor part of the result.
  - C(state=present) registers the worker unless it is already registered with the same
    runtime and model, then waits until the gateway lists it ready and healthy (routable).
    A worker registered with another model id (a new model revision) is removed first.
  - C(state=absent) removes the worker and waits until the gateway no longer lists it.
    smg stops routing new requests to it at once, keeps it C(draining) a few seconds, then
    drops it; requests already in flight keep streaming (the caller waits for them on the
    worker itself, module C(inflight_wait)).
  - Reports a change only when it added or removed a worker, so a no-op deploy stays at changed=0.
options:
  gateway_url:
    description: Base URL of the gateway's API, as seen from the host the module runs on.
    type: str
    required: true
  ca_file:
    description:
      - The CA file that verifies the certificate of an C(https) I(gateway_url) (the gateway's
        C(/etc/<unit>-tls/ca.pem)); empty uses the system's CAs. The key is sent only once it verified.
    type: path
    default: ""
  key_file:
    description: Environment file holding C(SMG_CONTROL_PLANE_API_KEY=...) (the gateway unit's EnvironmentFile).
    type: path
    required: true
  url:
    description: The worker's URL as the gateway reaches it.
    type: str
    required: true
  state:
    description: Whether the worker is in the gateway.
    type: str
    choices: [present, absent]
    default: present
  runtime_type:
    description: smg's runtime for the worker (C(sglang), C(generic), ...); empty lets smg detect it.
    type: str
    default: ""
  model_id:
    description: The model id the worker serves (what it expects in a request's C(model)).
    type: str
    default: ""
  model_aliases:
    description: Names clients may use for the model; smg rewrites them to C(model_id).
    type: list
    elements: str
    default: []
  timeout_s:
    description: Seconds to wait for the worker to become routable (present) or gone (absent).
    type: float
    default: 120
  interval_s:
    description: Seconds between polls.
    type: float
    default: 1
"""

EXAMPLES = r"""
- name: Take the worker out of the gateway
  smg_worker:
    gateway_url: http://127.0.0.1:30000
    key_file: /etc/smg-gateway/control-plane.env
    url: http://ct129:30000
    state: absent
  delegate_to: gw1

- name: Put it back and wait until the gateway (with TLS) routes to it
  smg_worker:
    gateway_url: https://127.0.0.1:30000
    ca_file: /etc/smg-gateway-tls/ca.pem
    key_file: /etc/smg-gateway/control-plane.env
    url: http://ct129:30000
    runtime_type: sglang
    model_id: /root/models/Qwen3.6-27B/revisions/abc
    model_aliases: [Qwen3.6-27B]
  delegate_to: gw1
"""

RETURN = r"""
worker:
  description: The worker as the gateway lists it at the end (absent -> null).
  type: dict
  returned: always
load_before:
  description: The gateway's in-flight count for the worker when the module started (null when not registered).
  type: int
  returned: always
waited_s:
  description: Seconds spent waiting for the change to take effect.
  type: float
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llm_deploy.inference.plugins.module_utils.smg_api import (  # noqa: E402
    Gateway,
    GatewayError,
    matches,
    read_key,
    routable,
    wait_for,
    worker_spec,
)


def run(module: AnsibleModule) -> dict:
    """Bring the worker to the requested state and return the module's result."""
    p = module.params
    gateway = Gateway(p["gateway_url"], read_key(p["key_file"]), ca_file=p["ca_file"])
    url = p["url"].rstrip("/")
    current = gateway.find(url)
    result: dict = {
        "changed": False,
        "worker": current,
        "waited_s": 0.0,
        "load_before": current.get("load") if current else None,
    }

    def gone() -> tuple[bool, None]:
        return gateway.find(url) is None, None

    if p["state"] == "absent":
        if current is None:
            return result
        result["changed"] = True
        if not module.check_mode:
            if current.get("status") != "draining":
                gateway.remove(current["id"])
            met, _, waited = wait_for(gone, p["timeout_s"], p["interval_s"])
            result["waited_s"] = waited
            if not met:
                raise GatewayError(f"worker {url} is still listed by the gateway {waited:.0f} s after its removal")
            result["worker"] = None
        return result

    spec = worker_spec(url, p["runtime_type"], p["model_id"], p["model_aliases"])
    if current is not None and current.get("status") != "draining" and matches(current, spec):
        if routable(current):
            return result
    else:
        result["changed"] = True
        if module.check_mode:
            return result
        waited = 0.0
        if current is not None:
            # Another model id (a new revision) or a removal in progress: let it go first.
            if current.get("status") != "draining":
                gateway.remove(current["id"])
            met, _, waited = wait_for(gone, p["timeout_s"], p["interval_s"])
            if not met:
                raise GatewayError(f"worker {url} is still listed by the gateway {waited:.0f} s after its removal")
        gateway.add(spec)
        result["waited_s"] = waited
    if module.check_mode:
        return result

    def ready() -> tuple[bool, dict | None]:
        worker = gateway.find(url)
        return routable(worker), worker

    met, worker, waited = wait_for(ready, p["timeout_s"], p["interval_s"])
    result["waited_s"] = round(result["waited_s"] + waited, 2)
    result["worker"] = worker
    if not met:
        state = "not listed" if worker is None else f"{worker.get('status')}, healthy {worker.get('is_healthy')}"
        raise GatewayError(
            f"worker {url} did not become routable at the gateway within {p['timeout_s']:.0f} s "
            f"(it is {state}); check that the gateway reaches it and that its /health answers 200"
        )
    return result


def main() -> None:
    """Entry point."""
    module = AnsibleModule(
        argument_spec={
            "gateway_url": {"type": "str", "required": True},
            "ca_file": {"type": "path", "default": ""},
            "key_file": {"type": "path", "required": True},
            "url": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "runtime_type": {"type": "str", "default": ""},
            "model_id": {"type": "str", "default": ""},
            "model_aliases": {"type": "list", "elements": "str", "default": []},
            "timeout_s": {"type": "float", "default": 120},
            "interval_s": {"type": "float", "default": 1},
        },
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except GatewayError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
