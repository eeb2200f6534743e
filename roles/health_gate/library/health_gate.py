#!/usr/bin/python
# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Ansible module ``health_gate``: readiness, throughput and MTP gate for an LLM server."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: health_gate
short_description: Wait for an LLM inference server, measure it, and gate the deploy on the figures
description:
  - Runs on the target host with the system python3 (standard library only). The same logic
    is available by hand as C(tools/health-gate) (C(--json), exit 0 pass, 1 fail, 2 usage error).
  - "B(Readiness): polls C(GET /health) until it answers 200 or O(ready_timeout_s) passes.
    Connection refused counts as I(still loading) (SGLang opens its port only after the
    weights are loaded), HTTP 503 as I(warming up)."
  - "B(Watching): with O(unit), a background thread runs C(systemctl show) about twice per
    O(poll_interval_s). If the unit fails, exits, waits in C(auto-restart), or restarts
    (C(NRestarts) grows or C(InvocationID) changes), the module fails at once with the
    unit's state and the journal of this start of the unit
    (C(journalctl _SYSTEMD_INVOCATION_ID=<id> + INVOCATION_ID=<id> -o cat)), capped at
    O(journal_max_lines) lines and saying so when capped."
  - "B(Measurement): O(warmup_requests) warm-up requests, then O(requests) streaming
    C(/v1/chat/completions) requests (temperature 0, fixed O(max_tokens),
    C(stream_options.include_usage)) with O(concurrency) in flight. Per request: TTFT,
    inter-token latency (between content chunks), decode tokens/s =
    (completion_tokens - 1) / (t_last_token - t_first_token), end-to-end latency. Token
    counts come from the server's C(usage); a stream without usage fails the gate."
  - "B(SGLang): the engine is detected through C(/server_info) (or C(/get_server_info));
    the report then carries the server version, the speculative settings and the MTP
    accept length (C(internal_states[0].avg_spec_accept_length), else a C(/generate) call's
    C(meta_info.spec_accept_length)) and, as C(capacity), how many requests its scheduler runs
    at once (C(internal_states[0].effective_max_running_requests_per_dp), read after the
    measurement, beside the C(max_running_requests) asked for)."
  - "B(Verdict): mean decode tok/s >= O(min_decode_tps), TTFT p95 <= O(max_ttft_s),
    accept length >= O(min_accept_length), running requests >= O(min_running_requests) (the
    last two only when the engine reports them). A threshold of 0 disables its check. With
    O(baseline) and O(max_regression_pct), the same figures must also be within that many
    percent of the last-known-good's (the relative gate); the running requests must not drop at all.
    The whole verdict is returned as RV(verdict), with the RV(baseline) the last-known-good records next."
  - "B(Correctness): with O(probe_set), the gate also asks what the server says (docs/health-gate.md,
    I(Correctness)): the probe set's golden prompts (raw text, greedy, a fixed length; SGLang through
    C(/generate) with token ids and log-probabilities, after C(/flush_cache)), each consistency prompt as a
    cache hit and a repeat, and its seeded eval as chat questions with exact answers. It fails the gate when
    the golden outputs differ from the last-known-good's (O(baseline)'s C(correctness) record, same probe set
    and model revision) beyond a near-tie the engine's re-scoring explains, when greedy outputs are not
    deterministic or a cache hit changes them (beyond a near-tie), when the eval score is below
    O(min_eval_score), or when, question by question against the last-known-good's answers, it is
    confidently worse by more than O(eval_margin_pct) points (McNemar's exact test). O(correctness) C(auto)
    asks only when the unit is not the one whose outputs the last-known-good recorded."
  - "B(Report): a JSON report (also for a failed gate) is written to O(report_dir) as
    C(<UTC timestamp>.json) plus C(latest.json); the history is pruned to O(keep_reports).
    The module always returns C(changed=false): reports are logs, not configuration."
version_added: "1.0.0"
author:
  - llm-deploy authors
options:
  url:
    description: Base URL of the server as seen from the target host.
    type: str
    default: http://127.0.0.1:30000
  unit:
    description:
      - systemd unit to watch (C(.service) is appended when no suffix is given).
      - Empty or omitted means the server is not watched; a dead server is then only
        noticed when O(ready_timeout_s) passes.
    type: str
  listener_user:
    description:
      - The account that runs the server (a name or a uid). When set and O(url) names this host, every
        request first reads who listens on its port (C(/proc/net/tcp), C(/proc/net/tcp6)) and the gate fails,
        before it sends a key, when a listening socket there belongs to another account (a local user that
        bound the port while the server was loading).
      - Empty or omitted means not checked.
    type: str
  public_url:
    description:
      - "The API front's public bind as seen from the target host (the server then listens on loopback at O(url),
        behind the front). With an O(admin_api_key) other than O(api_key), the gate asks the front's
        C(/server_info) and C(/get_server_info) with the API key, as a client would, instead of the server's,
        and fails in discovery when either hands the admin key over (SGLang 0.5.11 returns its arguments
        there): the front must refuse those routes to clients (docs/security.md)."
      - Empty means not asked; the server's own routes are asked at O(url) then, and a route that hands the
        admin key over is a warning, not a failure.
    type: str
    default: ""
  public_listener_user:
    description:
      - The account that runs the API front (a name or a uid). When set and O(public_url) names this host,
        a listener of another account on its port gets no key, as O(listener_user) for O(url).
      - Empty or omitted means not checked.
    type: str
  ca_file:
    description:
      - The CA (a PEM file on the target host) that the certificate of an https O(url) or O(public_url) is
        verified with; empty means the system's CAs. A certificate it does not verify, or one not issued to
        O(tls_server_name), fails the gate in discovery before any key is sent (docs/security.md, TLS).
    type: str
    default: ""
  tls_server_name:
    description:
      - The name an https URL's certificate must be issued to; empty means the URL's host.
    type: str
    default: ""
  allow_prior_restarts:
    description:
      - C(NRestarts) is reset by a deliberate (re)start, so a value above 0 when the gate
        begins means systemd restarted a crashed server since. By default that fails the
        gate; set this to C(true) to accept earlier crashes (only restarts during the gate fail).
    type: bool
    default: false
  model:
    description:
      - Model id for the requests. The first id listed by C(/v1/models) is used unless this
        option is one of the listed ids; when the server lists nothing (C(transformers serve)),
        this option is used and is then required.
    type: str
  api_key:
    description: API key sent as C(Authorization Bearer). Never logged, never in the report.
    type: str
  engine:
    description: Server engine. C(auto) detects SGLang through C(/server_info); anything else is C(generic).
    type: str
    choices: [auto, sglang, transformers, generic]
    default: auto
  ready_timeout_s:
    description: Seconds to wait for readiness; sized for loading a 52 GiB model plus CUDA-graph capture and JIT.
    type: float
    default: 1800
  poll_interval_s:
    description: Seconds between C(/health) polls (the unit is checked twice as often, at most every second).
    type: float
    default: 1.0
  health_timeout_s:
    description:
      - Timeout of one C(/health) or discovery call.
      - SGLang's C(/health) runs a 1-token generation with a 20 s timeout.
    type: float
    default: 30
  request_timeout_s:
    description: A measured request fails when it takes longer than this, or when its stream is silent this long.
    type: float
    default: 300
  warmup_requests:
    description:
      - Requests sent (and not measured) before the measurement, at its shapes - the measured prompts from
        the first on, at O(concurrency) (at least that many requests), the same output length - so first-request
        JIT, kernel selection for new prompt lengths and the prefix cache are behind the measurement. Set it
        to O(requests) for every measured prompt to have run once (what repeated gates need to agree). 0 - none.
    type: int
    default: 2
  requests:
    description: Measured requests.
    type: int
    default: 8
  concurrency:
    description: Requests in flight at once during warm-up and measurement.
    type: int
    default: 1
  max_tokens:
    description:
      - C(max_tokens) of every request (at least 2). SGLang (C(ignore_eos)) and transformers serve
        (C(generation_config) C(min_new_tokens)) are asked for exactly this many tokens; other engines may stop early.
    type: int
    default: 256
  prompts:
    description:
      - "Prompts, used round-robin. A list (strings, or mappings with C(messages) and an optional C(id)),
        or the path of a JSON file on the target holding such a list or a mapping with a C(prompts) list."
      - Omitted, two built-in coding prompts are used; the role passes its C(files/prompts.json).
    type: raw
  min_decode_tps:
    description: Minimum mean decode tokens/s per request. 0 disables the check.
    type: float
    default: 0
  max_ttft_s:
    description:
      - Maximum time to first token, 95th percentile over the measured requests, in seconds.
      - 0 disables the check.
    type: float
    default: 0
  min_accept_length:
    description:
      - Minimum speculative (MTP) accept length, applied only when the engine reports one.
      - 0 disables the check.
    type: float
    default: 0
  min_running_requests:
    description:
      - Minimum number of requests the server runs at once, by its own scheduler
        (SGLang's C(/server_info) C(internal_states[0].effective_max_running_requests_per_dp), read
        after the measurement). SGLang 0.5.17 starts even when its mamba state cache cannot hold
        C(--max-running-requests) and caps it, down to 1; a gate of one stream at a time cannot see that.
      - Applied only when the engine reports the figure; otherwise the check is listed with
        C(ok) null and a C(not applied) note. 0 disables the check.
    type: int
    default: 0
  baseline:
    description:
      - "The last-known-good's gate figures, for the relative gate: C(decode_tps_mean), C(ttft_p95_s),
        C(accept_length), C(effective_max_running_requests), the C(unit_sha256) they were measured on
        and the measurement (C(requests), C(concurrency), C(max_tokens), C(prompts), C(warmup_requests),
        C(fixed_output)); what the role
        records in last-known-good."
      - Compared only when O(max_regression_pct) is above 0, the unit differs from the baseline's
        (C(metadata.unit_sha256)) and the measurement is the same; the report says why not otherwise.
    type: dict
  reference:
    description:
      - "Another server's figure this gate is compared with, besides the verdict: C(decode_tps_mean) (null
        when that server has none) and exactly one of C(min_share) (a floor: this server must reach that share
        of it; adoption, the by-hand server's speed) or C(margin_pct) (a lead: this server beats it only when
        it is faster by more than that many percent; bake-off, the last-known-good's speed)."
      - "The comparison is returned as RV(verdict.reference) and never fails the gate: the caller decides on
        its C(ok). With C(min_share), 0 or no reference figure is C(ok); with C(margin_pct), no figure is not."
    type: dict
  max_regression_pct:
    description:
      - Fail when decode tok/s or the accept length is lower, or TTFT p95 higher, than the
        O(baseline)'s by more than this many percent. 0 disables the relative gate.
      - With the relative gate on, fewer running requests at once than the O(baseline)'s
        C(effective_max_running_requests) fail by any amount.
    type: float
    default: 0
  regression_min_ttft_delta_s:
    description: >-
      A TTFT p95 above the baseline's by more than O(max_regression_pct) also needs
      to be above it by more than these seconds to fail.
    type: float
    default: 0.1
  journal_max_lines:
    description: Cap on the journal lines quoted as evidence (the last lines are kept; the message says when capped).
    type: int
    default: 3000
  journal_max_bytes:
    description: Cap on the size of the quoted journal, in bytes.
    type: int
    default: 524288
  report_dir:
    description: Directory on the target for the JSON reports. Omitted, no report is written. Not written in check mode.
    type: path
  keep_reports:
    description: Timestamped reports kept in O(report_dir) (oldest pruned first).
    type: int
    default: 20
  metadata:
    description:
      - Free mapping copied into the report, e.g. C(unit_sha256), C(env_sha256), C(venv_lock_sha256),
        C(model_revision), C(engine_version) (what last-known-good records).
    type: dict
    default: {}
  correctness:
    description:
      - When the correctness probe runs. C(auto) when the unit is not the last-known-good's, or its record holds no
        outputs of this probe set (a no-op deploy asks nothing more); C(always) (a rollback's re-gate); C(off).
    type: str
    choices: [auto, always, "off"]
    default: auto
  probe_set:
    description:
      - The correctness probe set (a mapping, or the path of its JSON file on the target); omitted, no probe.
        Its format is in C(llm_gate.probeset) and docs/health-gate.md. The role passes its C(files/probes/<name>.json).
    type: raw
  admin_api_key:
    description: SGLang's admin key, for C(/flush_cache) before the golden pass. Never logged, never in the report.
    type: str
  min_eval_score:
    description: The lowest share of the probe set's eval answered exactly (0 to 1). 0 disables the floor.
    type: float
    default: 0
  eval_concurrency:
    description:
      - The eval's questions asked at once (its answers are scored, not compared token by token, so a
        batch does not change the verdict; SGLang answers 40 of them about as fast as 10 one by one).
    type: int
    default: 4
  eval_margin_pct:
    description:
      - The eval against the last-known-good's answers to the same questions fails only when this server answers
        more than this many percentage points fewer of them right (net) and is confidently worse (the exact
        one-sided sign test on the questions the two answered differently, at O(eval_confidence)). An unchanged
        server never fails it. 0 disables the relative check.
    type: float
    default: 5
  eval_confidence:
    description: One-sided confidence of the sign test that the eval is worse than the last-known-good's.
    type: float
    choices: [0.8, 0.9, 0.95, 0.975, 0.99]
    default: 0.95
  golden_min_match_share:
    description:
      - Share of the golden prompts (0 to 1) whose outputs must equal the last-known-good's, or part at a near-tie.
    type: float
    default: 1.0
  max_logprob_drift:
    description:
      - Between a cache hit and a miss, or a repeat and the hit (SGLang), the mean absolute difference of the
        log-probabilities before the divergence, in nats per token, above which it is not a near-tie.
    type: float
    default: 0.05
  max_rescore_kl:
    description:
      - Re-scoring (SGLang) only. SGLang's KL estimate, mean(e^r - 1 - r) per token, between this server's re-score of
        the last-known-good's golden tokens and the last-known-good's own re-score of them, above which a prompt
        fails.
    type: float
    default: 0.0025
  tie_margin:
    description:
      - A divergence is a near-tie when this server ranks the reference's token within this many nats of its own
        choice (re-scored), or, between a cache hit and a miss, when the miss's top two were this close.
    type: float
    default: 0.2
  require_cache_hit:
    description:
      - On an engine with a prefix cache, fail when C(/flush_cache) failed or the consistency prompts' hits served no
        cached tokens (no hit was checked against a miss). false accepts it, with a note.
    type: bool
    default: true
  accept_output_change:
    description:
      - The golden outputs and the eval score may differ from the last-known-good's on purpose (reported, not
        failed); the new outputs become the reference. The floor and the consistency check still apply.
    type: bool
    default: false
notes:
  - Supports check mode; in check mode the server is measured but no report is written.
  - Standard library only; Python 3.8 or newer on the target.
seealso:
  - name: tools/health-gate
    description: The same gate as a command line, for operators.
    link: https://github.com/llm-deploy/llm-deploy/blob/main/docs/health-gate.md
"""

EXAMPLES = r"""
- name: Gate the deploy on ct129's figures
  health_gate:
    url: http://127.0.0.1:30000
    unit: inference-server
    min_decode_tps: 40
    max_ttft_s: 3.0
    min_accept_length: 1.5
    min_running_requests: 4
    report_dir: /var/lib/inference-server/gate
    metadata:
      model_revision: "{{ model_sync_revision }}"
      venv_lock_sha256: "{{ ml_env_lock_sha256 }}"
  register: __health_gate_result

- name: Gate a transformers serve rehearsal server (it lists no model, so name it)
  health_gate:
    url: http://127.0.0.1:8000
    unit: inference-server
    model: /srv/models/tiny-qwen3.5/current
    requests: 4
    max_tokens: 32
    min_decode_tps: 5
"""

RETURN = r"""
passed:
  description: Whether every check passed.
  returned: always (after the options were accepted)
  type: bool
  sample: true
summary:
  description: One human line.
  returned: always (after the options were accepted)
  type: str
  sample: >-
    gate PASS: 52.3 tok/s decode (min 40), TTFT p95 0.41 s (max 3), accept 2.10 (min 1.5),
    max running 4 (min 4), 8 requests
report_path:
  description:
    - Path of the stored report.
    - C(null) without O(report_dir), in check mode, or when it could not be written.
  returned: always (after the options were accepted)
  type: str
  sample: /var/lib/inference-server/gate/20261129T224000Z.json
report:
  description:
    - The full report. Keys include C(schema), C(timestamp), C(host), C(url), C(engine), C(version),
      C(model), C(settings), C(thresholds), C(readiness), C(server), C(warmup), C(requests) (per request),
      C(aggregate), C(speculative), C(capacity), C(keys_readable), C(public_url), C(checks), C(passed), C(phase),
      C(reasons), C(verdict), C(evidence), C(unit), C(metadata), C(summary), C(duration_s).
  returned: always (after the options were accepted)
  type: dict
  contains:
    aggregate:
      description: Aggregate figures.
      type: dict
      returned: when the measurement ran
      sample:
        decode_tps_mean: 52.3
        decode_tps_median: 52.1
        ttft_p50_s: 0.31
        ttft_p95_s: 0.41
        itl_mean_s: 0.038
        itl_p95_s: 0.052
        e2e_p95_s: 5.2
        completion_tokens: 2048
        total_tps: 51.0
    speculative:
      description: MTP accept length and where it came from.
      type: dict
      returned: when the measurement ran
      sample: {accept_length: 2.1, source: "server_info.internal_states[0].avg_spec_accept_length"}
    capacity:
      description:
        - How many requests the server runs at once by its scheduler (C(effective_max_running_requests),
          null when the engine reports none, with a C(note) saying why), the C(requested)
          C(max_running_requests) and the C(source).
      type: dict
      returned: when the measurement ran
      sample:
        effective_max_running_requests: 4
        requested: 4
        source: "server_info.internal_states[0].effective_max_running_requests_per_dp"
        note: null
    keys_readable:
      description:
        - Where the API key reads the admin key (SGLang's C(/server_info) and C(/get_server_info) return its
          arguments, C(admin_api_key) among them), as C(<route> (the admin key)); the module then warns.
        - With O(public_url), the routes of the API front's public bind instead, and any of them fails the
          gate (no warning besides).
        - Empty when no route hands it over; null when no admin key was given or it equals the API key.
      type: list
      elements: str
      returned: when the gate reached the server
      sample: ["/server_info (the admin key)", "/get_server_info (the admin key)"]
    evidence:
      description:
        - On a unit failure, its state and the journal of this start.
        - Keys C(log), C(log_lines), C(log_capped), C(exception), C(state), C(reason).
      type: dict
      returned: when the watched unit or process failed
    reasons:
      description: Why the gate failed (empty when it passed).
      type: list
      elements: str
      returned: always
verdict:
  description:
    - The verdict, decided in one place (C(llm_gate.verdict)) and read by the roles and playbooks, which
      decide nothing again. Also in the report as C(verdict).
    - "C(passed), C(reasons); C(absolute) (the thresholds) and C(relative) (against O(baseline): C(compared),
      C(note), the C(baseline) compared with), each C(passed), C(checks), C(reasons), or null when the gate
      failed before it judged; C(reference) (against O(reference)), C(figures) (this gate's, as a baseline
      record) and C(baseline) (as RV(baseline))."
  returned: always (after the options were accepted)
  type: dict
  contains:
    reference:
      description:
        - "The comparison with O(reference): C(value), C(reference), C(needed), C(share), C(change_pct), C(ok),
          and C(min_share) or C(margin_pct). Null without O(reference) or a measurement."
      type: dict
      returned: always
      sample: {figure: decode_tps_mean, value: 47.9, reference: 52.0, min_share: 0.9, needed: 46.8,
               share: 0.921, change_pct: -7.88, ok: true}
    figures:
      description: This gate's figures, unit and measurement as a baseline record; null before a measurement.
      type: dict
      returned: always
baseline:
  description:
    - "What the last-known-good records for the next deploy's relative gate, once this gate passed; null
      when it failed. The O(baseline) itself when it was measured on this unit with this measurement (a no-op
      deploy keeps its record), this gate's figures otherwise."
  returned: always (after the options were accepted)
  type: dict
  sample:
    unit_sha256: 9f2c...
    decode_tps_mean: 52.3
    ttft_p95_s: 0.41
    accept_length: 2.1
    effective_max_running_requests: 4
    timestamp: "2026-11-29T22:40:00Z"
    requests: 8
    concurrency: 1
    max_tokens: 256
    prompts: [py-log-top-errors, py-fix-slow-dedupe]
    warmup_requests: 2
    fixed_output: ignore_eos
msg:
  description: The summary line; on failure followed by the exception line and the journal of this start.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate import (  # noqa: E402
    CORRECTNESS_MODES,
    DEFAULTS,
    ENGINES,
    GateUsageError,
    failure_message,
    keys_readable_note,
    run_gate,
    store_report,
)

# The numeric options, by Ansible type; their defaults are the gate's own (DEFAULTS).
NUMBER_OPTIONS = {
    "float": (
        "ready_timeout_s",
        "poll_interval_s",
        "health_timeout_s",
        "request_timeout_s",
        "min_decode_tps",
        "max_ttft_s",
        "min_accept_length",
        "max_regression_pct",
        "regression_min_ttft_delta_s",
        "min_eval_score",
        "eval_margin_pct",
        "eval_confidence",
        "golden_min_match_share",
        "max_logprob_drift",
        "max_rescore_kl",
        "tie_margin",
    ),
    "int": (
        "warmup_requests",
        "requests",
        "concurrency",
        "max_tokens",
        "min_running_requests",
        "journal_max_lines",
        "journal_max_bytes",
        "keep_reports",
        "eval_concurrency",
    ),
}


def argument_spec() -> dict:
    """The module's options (defaults shared with the CLI through ``DEFAULTS``)."""
    spec = dict(
        url=dict(type="str", default=DEFAULTS["url"]),
        unit=dict(type="str"),
        allow_prior_restarts=dict(type="bool", default=DEFAULTS["allow_prior_restarts"]),
        model=dict(type="str"),
        api_key=dict(type="str", no_log=True),
        listener_user=dict(type="str"),
        public_url=dict(type="str", default=DEFAULTS["public_url"]),
        public_listener_user=dict(type="str"),
        ca_file=dict(type="str", default=DEFAULTS["ca_file"]),
        tls_server_name=dict(type="str", default=DEFAULTS["tls_server_name"]),
        engine=dict(type="str", default=DEFAULTS["engine"], choices=list(ENGINES)),
        prompts=dict(type="raw"),
        baseline=dict(type="dict"),
        reference=dict(type="dict"),
        report_dir=dict(type="path"),
        metadata=dict(type="dict", default={}),
        correctness=dict(type="str", default=DEFAULTS["correctness"], choices=list(CORRECTNESS_MODES)),
        probe_set=dict(type="raw"),
        admin_api_key=dict(type="str", no_log=True),
        accept_output_change=dict(type="bool", default=DEFAULTS["accept_output_change"]),
        require_cache_hit=dict(type="bool", default=DEFAULTS["require_cache_hit"]),
    )
    for kind, names in NUMBER_OPTIONS.items():
        spec.update({name: dict(type=kind, default=DEFAULTS[name]) for name in names})
    return spec


def main() -> None:
    """Validate, run the gate, store the report, exit or fail with the summary."""
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = dict(module.params)
    report_dir = params.get("report_dir")
    if not params.get("unit"):
        params["unit"] = None
    if not params.get("listener_user"):
        params["listener_user"] = None
    if not params.get("public_listener_user"):
        params["public_listener_user"] = None
    try:
        report = run_gate(params)
    except GateUsageError as exc:
        module.fail_json(msg=f"health_gate: invalid options: {exc}")
        return
    path = None
    if report_dir and not module.check_mode:
        try:
            path = store_report(report, report_dir, params["keep_reports"])
        except OSError as exc:
            module.warn(f"health_gate: could not store the report in {report_dir}: {exc}")
    # With public_url a route that hands the admin key over failed the gate: the failure says it.
    if report.get("keys_readable") and not report.get("public_url"):
        module.warn("health_gate: " + keys_readable_note(report["keys_readable"]))
    verdict = report["verdict"]
    result = dict(
        changed=False,
        passed=report["passed"],
        summary=report["summary"],
        verdict=verdict,
        baseline=verdict["baseline"],
        report=report,
        report_path=path,
    )
    if report["passed"]:
        module.exit_json(msg=report["summary"], **result)
    module.fail_json(msg=failure_message(report), **result)


if __name__ == "__main__":
    main()
