"""The hand-written prose of docs/reliability.md: each section's heading and explanation, and the
section on how the pieces work, which tools/deploytools/reliability_report.py places around the
tables it renders from the scenarios' results (the rows stay in the renderer and its results files)."""

INTRO = """\
# Reliability: bad input, faults and secrets

Operators feed this repository wrong variables, half-broken hosts and interrupted runs.
Each case below was tried against a serving host, a systemd container of the CPU rehearsal
profile (`molecule/reliability`), with the real `deploy.yml`; the tables are what the tests
measured and asserted (exact message, `changed=0`, the server's MainPID and start time, unit
file, secrets and links unchanged, the deploy lock given back). Regenerate this page:

```
make reliability        # molecule test -s reliability, then tools/reliability-report
```

(or `molecule test -s reliability && tools/reliability-report`). The cases took {minutes} min
on the 2-core CI machine, plus about 1.5 min to create, converge and destroy the container;
`make test` (and `make molecule`) runs the scenario too.

Run of {generated}, commit `{commit}`, {cpus} CPUs (load average {load} when it ended),
image `{image}`, pytest exit status {exit_status}.

**{rows} rows from the scenarios' tests, {failed} of them not as expected** ({counts}).
A row is as expected when the test named in it passed and its own verdict holds; the verify
fails when the rows or their outcomes differ from this page's results
(docs/reliability-results.json).{fleet} The hand-written rows (the launch plan's, the drafters', the
exposure's, the gateway's and the adoption's sections) are listed apart and not counted.

"""

FLEET = """
The fleet's {rows} fault row(s) come from molecule/fleet (three hosts behind the gateway), run of
{generated}, commit `{commit}`: its verify writes artifacts/fleet/faults.json and fails when
they differ from docs/reliability-results-fleet.json (copy the file there after a change)."""

BAD_INPUT = """\
## Bad input

Every refusal is one sentence naming the variable (or the fact) and what to do, and happens
before anything on the host changes. `deploy.yml` takes the host's deploy lock, then runs
every role's input check before any role changes anything: preflight (profile, systemd,
glibc, GPUs, the port's owner), ml_env's (lock file, the engine version the lock pins,
glibc against the lock's manylinux tag, venv path), model_sync's (source variables, the
source's `config.json` and shards when they can be read without a transfer), the launch
plan itself (`inference_server/tasks/precheck.yml`: the lock's engine version, the source's
config.json, the GPUs found) and the gate's thresholds. What only the sync or the engine can
tell (disk space for the bytes to fetch, a Hub answer, the GPU memory rule that needs the
weights' size, the engine's own parser in the venv) is checked after ml_env and model_sync,
still before the unit changes; the last row shows that path: the new model revision was
staged, the engine's check refused, and the rescue put `current` back, so the running
server and its links are as they were.

GPU rows use `rel-gpu`, the same container in the `sglang_servers` group: SGLang 0.5.11's
lock, Qwen3.6-27B's real `config.json` (no weights) and a stand-in `nvidia-smi` printing N RTX
A6000 (the test machines have no GPU; on ct129 preflight reads the real one). The plan
refuses each before ml_env would build the SGLang venv.

| case | how it was tried | the exact message | refused by | changed | host untouched | s | test |
| --- | --- | --- | --- | --- | --- | --- | --- |
"""

DRAFTERS = """\
### Bad drafters (DFLASH), refused offline

Hand-written rows, not scenario results: ct129's plan with `inference_server_speculative_algorithm: DFLASH`
and the drafter config `files/models/dflash-drafter-27b.config.json` (one SGLang 0.5.11 served
beside Qwen3.6-27B's real config) changed as *how* says. The launch plan refuses each in
`inference_server/tasks/precheck.yml`, before anything changes on the host (a drafter whose
config.json needs a sync, a mirror host or the Hub, is checked in `plan.yml` after the sync,
still before the unit changes); `tests/launch_plan/test_launch_plan_draft.py` checks every message
against the plan word for word. The rules: docs/launch-plan.md, "DFLASH".

| case | how it was tried | the exact message |
| --- | --- | --- |
"""

# Written by hand, not measured by the scenario: refusals of the memory budget, which needs the
# weights' size (known after the sync) and a GPU size; the same sentences are asserted word for
# word by tests/launch_plan/test_launch_plan_budget.py, offline.
PLAN_ONLY = """\
### Checked by the launch plan offline: the memory budget

These refusals come from the memory budget (tools/deploytools/launch_plan/budget.py, docs/launch-plan.md
"Memory budget"), which needs the weights' size, so a deploy meets them in `plan.yml` after the
sync, still before the unit changes. They are not rows of the scenario (its container has no
weights): `tests/launch_plan/test_launch_plan_budget.py` asserts each sentence word for word with ct129's
offline facts (2x RTX A6000 48 GB, 51.75 GiB of weights), and `tools/launch-plan` prints them.

| case | how it was tried | the exact message | refused by |
| --- | --- | --- | --- |
| SGLang's unset `--max-running-requests` (48 with speculative decoding) on ct129 | `tools/launch-plan ct129 -e '{"inference_server_overrides": {"--max-running-requests": 48}}'` | `the memory budget per GPU cannot start SGLang: with --mem-fraction-static 0.717 (the plan: SGLang's own default for this GPU) and --max-running-requests 48 (inference_server_overrides['--max-running-requests']), the weights (25.5 GiB) leave 7.9 GiB of the 33.5 GiB static pools, and the speculative verify buffers for 48 requests (13.8 GiB) leave no room for the KV cache (SGLang stops with 'RuntimeError: Not enough memory'): lower inference_server_overrides['--max-running-requests'] to 7 or raise inference_server_mem_fraction_static to at least 0.907.` | inference_server : Refuse the launch plan with its own sentence |
| the same on one H200, as SGLang refused it there (tests/launch_plan/fixtures/sglang_realsize_h200_logged.json) | `tools/launch-plan h200-realsize -i inventory/gpu-realsize.yml -e '{"h200_realsize_overrides": {"--mem-fraction-static": 0.45, "--max-running-requests": 48}}'` | `the memory budget per GPU cannot start SGLang: with --mem-fraction-static 0.45 (inference_server_overrides['--mem-fraction-static']) and --max-running-requests 48 (inference_server_overrides['--max-running-requests']), the weights (51.0 GiB) leave 11.6 GiB of the 62.6 GiB static pools, and the speculative verify buffers for 48 requests (27.5 GiB) leave no room for the KV cache (SGLang stops with 'RuntimeError: Not enough memory'): lower inference_server_overrides['--max-running-requests'] to 5 or raise inference_server_overrides['--mem-fraction-static'] to at least 0.609.` | inference_server : Refuse the launch plan with its own sentence |
| more running requests wanted than the budget holds | `tools/launch-plan ct129 -e inference_server_target_concurrency=8` | `inference_server_target_concurrency is 8, but the memory budget per GPU (--mem-fraction-static 0.717 (the plan: SGLang's own default for this GPU), --max-running-requests 8 (the plan: inference_server_target_concurrency)) holds only 7 running requests (37 mamba slots at 5 per request): lower inference_server_target_concurrency to 7 or raise inference_server_mem_fraction_static to at least 0.726.` | inference_server : Refuse the launch plan with its own sentence |
| a fraction that leaves the MTP draft no room | `tools/launch-plan ct129 -e inference_server_mem_fraction_static=0.95` | `--mem-fraction-static 0.95 (inference_server_mem_fraction_static) leaves 2.0 GiB per GPU beside SGLang's pools, but the MTP draft (2.8 GiB while it loads), its KV cache (0.6 GiB) and SGLang's activation and CUDA-graph estimate (6.8 GiB) need 10.2 GiB: lower inference_server_mem_fraction_static to at most 0.78.` | inference_server : Refuse the launch plan with its own sentence |
| a context longer than the KV cache | `tools/launch-plan ct129 -e '{"inference_server_overrides": {"--context-length": 200000}}'` | `inference_server_overrides['--context-length'] is 200000, but the memory budget's KV cache holds 119495 tokens per GPU, so SGLang would cut every request at 119494: lower it to at most 118784 or leave it unset so the plan sets it.` | inference_server : Refuse the launch plan with its own sentence |
| a KV cache shorter than the least context | `tools/launch-plan ct129 -e inference_server_min_context_length=131072` | `the memory budget per GPU (--mem-fraction-static 0.717 (the plan: SGLang's own default for this GPU), --max-running-requests 4 (the plan: inference_server_target_concurrency)) leaves a KV cache of 119495 tokens, less than inference_server_min_context_length 131072: lower inference_server_target_concurrency to 1 or raise inference_server_mem_fraction_static to at least 0.733 or lower inference_server_min_context_length.` | inference_server : Refuse the launch plan with its own sentence |

"""

# Hand-written: the checks of precheck.yml and the gateway's preflight (docs/security.md).
EXPOSURE = """\
### Network exposure without a key, refused offline

Hand-written rows, not scenario results (docs/security.md): the checks of
`inference_server/tasks/precheck.yml` (after the launch plan's) and `gateway/tasks/preflight.yml`
refuse a server or a gateway on a network address without a key, before anything changes.
`molecule/render-ct129/tests/test_render.py::test_a_network_bind_needs_both_keys_before_anything_changes`
runs ct129's checks offline (`molecule/render-ct129/refusal.yml`, ct129 as the repository holds
it: 0.0.0.0, keys only in the operator's vault) and
`molecule/exposure/tests/test_exposure.py::test_an_open_gateway_is_refused_before_anything_changes`
the gateway's; both compare the sentence word for word.

| case | how it was tried | the exact message | refused by |
| --- | --- | --- | --- |
| a bind to 0.0.0.0 without an API key | ct129 (`inference_server_host: 0.0.0.0`), no `inference_server_api_key` | `inference_server_host is "0.0.0.0", a network address, but inference_server_api_key is empty: anyone who reaches ct129:30000 could use the server; set inference_server_api_key (in Ansible Vault) for an SGLang server, set inference_server_host to 127.0.0.1, or set inference_server_allow_unauthenticated_network to true to accept it unauthenticated behind its IP allow-list (localhost).` | inference_server : Refuse a server on a network address without an API key its engine enforces |
| an API key without SGLang's admin key | ct129 with `inference_server_api_key` only | `inference_server_api_key is set but inference_server_admin_api_key is empty, so SGLang lets every holder of the API key use its admin endpoints (/update_weights_from_disk, /flush_cache, /pause_generation, ...): set inference_server_admin_api_key to another secret (in Ansible Vault).` | inference_server : Refuse SGLang's admin endpoints without a key of their own |
| the gateway's API on 0.0.0.0 without a key | the gateway role's checks with the repository's inventory, no `gateway_api_key` | `gateway_host is "0.0.0.0", a network address, but gateway_api_key is empty: anyone who reaches localhost:30000 could send requests through the gateway; set gateway_api_key (in Ansible Vault), set gateway_host to 127.0.0.1, or set gateway_allow_unauthenticated_network to true to accept it unauthenticated behind its IP allow-list (localhost, 127.0.0.1).` | gateway : Refuse the gateway's API on a network address without a key |
| the gateway's /metrics on 0.0.0.0, nobody named to scrape it | `gateway_prometheus_host: 0.0.0.0`, no `gateway_allowed_sources` | `gateway_prometheus_host is "0.0.0.0", a network address, but smg's /metrics takes no key and gateway_allowed_sources is empty: name the hosts that scrape it in gateway_allowed_sources, set gateway_prometheus_host to 127.0.0.1, or set gateway_allow_unauthenticated_network to true.` | gateway : Refuse the gateway's /metrics on a network address that nobody is named to scrape |
"""

FAULTS = """\
## Faults

Times are measured on the CI machine: from the fault to the end of the run that proved the
host serves again (its gate passed), unless the row says otherwise.

| fault | how | what happened | what the host did | time to recover (s) | test |
| --- | --- | --- | --- | --- | --- |
"""

SECRETS = """\
## Secrets and access

Known fake values of the HF token (`model_sync_hf_token`), an engine secret
(`inference_server_secrets.ENGINE_LICENSE_KEY`) and the API key (`inference_server_api_key`), vaulted in the inventory's host_vars as an
operator keeps them, went through every deploy of the scenario: first rendered by the run
that was killed (at `-vvvv --diff`), rotated to a second set by the deploy whose engine
crashed and rolled back with it, carried by the `tools/nightly-deploy` run that found the
hung engine. Both sets were then searched for:

| where searched | searched | found |
| --- | --- | --- |
"""

ON_PURPOSE = """\
Where they are on purpose (the positive control: the test first checks that the current
values are there, or finding nothing elsewhere would prove nothing):

| file | mode owner:group | holds |
| --- | --- | --- |
"""

FILES = """\
The service runs as a dedicated system user (`inference_server_user`, default `inference`,
ct129 included; root only with `inference_server_allow_root`, docs/security.md); the deploy's
own state (last-known-good, gate reports, the converged record) is root's only. testinfra
checks, after all the cases:

| path | expected | found |
| --- | --- | --- |
"""

DESIGN = r"""
### How the pieces work

* **Deploy lock** (`roles/deploy_lock`): `/run/llm-deploy/deploy.lock` on the host, written
  under an `flock` of `<lock>.guard`, names the holder (controller host and boot id, the
  ansible-playbook pid and its start time, user, when). Taken first in `deploy.yml`, given
  back in an `always:`; never counted as a change (a no-op deploy stays `changed=0`). A lock
  whose run is gone from the same controller (pid gone, pid reused, or the controller
  rebooted) is taken over at once with a warning; any lock older than
  `deploy_lock_stale_after_s` (6 h) too. A run killed on another controller blocks deploys
  from elsewhere until then, or until someone removes the file (the refusal says so).
  `/run` is cleared at boot. Check mode reads the lock and refuses when it is held, but
  never writes it.
* **Interrupted restarts**: a run killed after writing the unit or one of its inputs (secrets,
  API key file, SGLang's logging configuration: `_inference_server_unit_inputs`) but
  before it restarted the server would leave the old process running the old
  configuration, and the next run, seeing no change, would gate and record it as
  last-known-good. `inference_server` now compares those files' mtimes with the running
  process's start (`files/started-before.py`, systemd's monotonic start time) and restarts
  when they are newer.
* **Port guard**: `ExecStartPre=+/usr/local/lib/<unit>/port-guard <port> <unit>` (as root,
  outside the sandbox). A process in the unit's own control group that still holds the
  port (systemd: "Found left-over process ... in control group while starting unit") is
  ours: SIGTERM (+SIGCONT), SIGKILL after 10 s. Anything else is named and left alone, and
  the unit fails at once. preflight refuses a foreign holder before the deploy changes
  anything. A crash loop that hit `StartLimitBurst` is cleared (`systemctl reset-failed`)
  before a deploy's deliberate start or a rollback's restart.
* **Rollback**: restores the last-known-good unit, secrets, API key file and the venv and
  model links; when the unit already is the last-known-good one, it still puts the links
  back (a refusal after a new model revision was staged) and, if the gate found the server
  not serving (crashed, hung, never ready), restarts it and gates it again.

### Restarts that drain

A stop or restart of the unit (a deploy, a rollback, `systemctl restart`) lets the
requests in flight finish. `KillMode=mixed` sends SIGTERM to the engine's main process only;
systemd SIGKILLs what is left of the control group once that process has exited, or after
`TimeoutStopSec` = `inference_server_drain_timeout_s` (120 s) + 30 s for the engine to exit
(systemd.kill(5)); a stream still running then is cut. Neither engine bounds the drain
itself (SGLang's SIGTERM watchdog waits for its last request; transformers serve leaves
uvicorn's `timeout_graceful_shutdown` unset), so the unit's timeout is the bound. The
restarts are `no_block`, and the unit is `deactivating` while the old server drains, so the
play waits for the new start (`tasks/restart.yml`, at most `TimeoutStopSec`) before the
gate looks at it. `inference_server_stop_timeout_s` is gone; a deploy that still sets it is
refused with the value of `inference_server_drain_timeout_s` that keeps its timeout.

| engine | what stopped it | streams in flight | the process | measured by |
| --- | --- | --- | --- | --- |
| SGLang 0.5.11 | SIGTERM to the main process (`KillMode=mixed`) | 1 of 1 (1024 tokens) completed; "Gracefully exiting... Remaining number of requests 1" every 5 s | exited 24 s after the signal, once the request was done | the GPU run (2x H200, same flags) |
| SGLang 0.5.11 | SIGTERM to every process (`KillMode=control-group`, the unit before) | cut 1.4 s after the signal (RemoteDisconnected) | the detokenizer died of SIGTERM, SIGQUIT took the rest | the GPU run |
| transformers serve 5.6.0 (uvicorn 0.54) | SIGTERM to the main process | 3 of 3 (128 tokens each) completed; the port refused new connections at once ("Waiting for connections to close") | exited 0.4 s after the last stream, by the SIGTERM uvicorn re-raises (a clean stop for systemd) | `tests/roles/test_drain.py` |
| transformers serve | SIGTERM to the process group | 3 of 3 completed: it is one process, so control-group and mixed do the same | exited after the last stream | by hand, as the test |
| transformers serve | SIGKILL (what `TimeoutStopSec` ends with) | 3 of 3 cut | at once | `tests/roles/test_drain.py` |
| transformers serve, the deployed unit | `systemctl restart` with 3 streams in flight (128 tokens each), 5 runs | 15 of 15 completed; the port refused new connections 0.1 s after the restart was asked | the new server's first token came 5.4 s after the old one's last token on an idle machine (7.4, 10.9, 11.8 and 25.0 s while other scenarios loaded the 2 cores): the downtime is the new server's start, since the stop drains first | `molecule/default/tests/test_drain.py` (prints the figures) |

transformers serve (without `--continuous-batching`) generates one request at a time: the
streams behind the first get all their tokens during the drain. The rehearsal engine drains
under either kill mode, so only the GPU run shows what `mixed` changes for SGLang.
systemd's start limit (`inference_server_start_limit_burst`, 3 starts in 10 min) counts
restarts by hand too: the probe's second restart after a converge was refused
(`start-limit-hit`) until `systemctl reset-failed`, which the probe now runs first, as the
rollback does. A deploy's own restart clears the count only when the unit is `failed`.

### API key

`inference_server_api_key` (vault it) is written to `/etc/<unit>/api-key.yaml`
(`root:<service group>`, 0640; `/etc/<unit>` is 0750 `root:<group>`, `secrets.env` stays
0600 root) as `api-key: "<key>"`, and the plan appends `--config /etc/<unit>/api-key.yaml`
to SGLang's argv: SGLang 0.5.11 reads no environment variable for its key (`api_key` is only
a server argument, `sglang/srt/server_args.py`), but `sglang serve` merges a YAML `--config`
file into its arguments (`sglang/srt/server_args_config_parser.py`), so the key is in
neither the unit file (0644) nor `/proc/<pid>/cmdline` (readable by every user). Overrides
`--api-key`, `--admin-api-key` and `--config` are refused. The key is kept and restored
with last-known-good. The gate sends it as a Bearer token (`health_gate_api_key` defaults
to `inference_server_api_key`; a 401/403 on `/v1/models` fails the gate with a sentence
naming that variable) and redacts it from its reports and quoted journals.

SGLang 0.5.11 logs its whole `ServerArgs`, `api_key` included, at INFO level when it starts
(`logger.info(f"{server_args=}")` in `srt/entrypoints/engine.py`); the GPU run found the key
in the server's log that way (`bench/results/gpu_api_key.md`). With a key set the plan
therefore points `SGLANG_LOGGING_CONFIG_PATH` at `/etc/<unit>/sglang-logging.json`, written
by the role: SGLang's format and level, with the logger `sglang.srt.entrypoints.engine` at
WARNING. The second GPU run had 0 log lines holding the key (129 lines logged). The price is
the ` TPn` prefix SGLang adds only when it configures logging itself. `/server_info` still
returns the key, but only to a caller that already has it. The gate redacts the key from
the journal it quotes.

`transformers serve` (the CPU rehearsal) has no API key support: a key is refused for that
engine unless `inference_server_allow_unenforced_api_key: true`, which this scenario sets to
rehearse the key's path (file, modes, rollback, gate, redaction) knowing `/v1/*` stays
open. Enforcement is proved twice: `tests/launch_plan/test_api_key.py` runs the gate and
`tools/api-key-check` against a local server that enforces a Bearer token exactly as SGLang's
`sglang/srt/utils/auth.py` does (every path but `/health*` and `/metrics`), and
`bench/results/gpu_api_key.md` is real SGLang 0.5.11 on 2x H200 started from the role's keyed
plan (`--config /etc/inference-server/api-key.yaml`): `/v1/models` 401 without or with a wrong
key, 200 with it, `/health` 200; the gate fails naming the 401 without the key and passes
with it. To repeat it: `tools/gpu-acceptance prepare --plan` with a plan rendered by
`tools/launch-plan` with `inference_server_api_key` set, write the key file and the plan's
`logging_config` (as `/etc/inference-server/sglang-logging.json`) on the device, `launch`,
`wait`, then:

```
python3 tools/api-key-check --url http://127.0.0.1:30000 --api-key-file /etc/inference-server/api-key.yaml --json
HEALTH_GATE_API_KEY="$(sed -n 's/^api-key: "\(.*\)"$/\1/p' /etc/inference-server/api-key.yaml)" \
  python3 tools/gpu-acceptance gate <name>                                        # exit 0: the gate authenticates
python3 tools/health-gate --url http://127.0.0.1:30000 --json                     # exit 1: "refused /v1/models with HTTP 401 ..."
grep -c "$(sed -n 's/^api-key: "\(.*\)"$/\1/p' /etc/inference-server/api-key.yaml)" <the server's log>   # 0
```
"""

ROLLING = """\
## Rolling deploys through the gateway

A fleet of three rehearsal hosts behind SGLang's gateway `smg` 1.13.0 (`molecule/fleet`, role
`gateway`), 4 streaming clients sending requests through the gateway the whole time
(`bench/rolling_deploy load`, inside the gateway's container). For each serving host whose
roles run, `deploy.yml` takes it out of the gateway (`DELETE /workers/{{id}}`: no new request
goes to it), waits until its in-flight requests are done (`inflight_wait`: SGLang's
`sglang:num_running_reqs` + `sglang:num_queue_reqs` from `/metrics`, or, for `transformers
serve`, which has no metrics, the established connections to its port), deploys and gates it
directly, and puts it back (`POST /workers`, waiting until the gateway lists it ready and
healthy). A host that fails stays out and the roll stops (`max_fail_percentage: 0`).
Figures: `bench/results/rolling_deploy.json`, measured {measured_at} on {cpus} CPUs.

| case | how it was tried | what happened | requests | failed | cut |
| --- | --- | --- | --- | --- | --- |
"""

SERVING = """\
### Serving between deploys: restart policy, watchdog, boot

**Restart policy** (systemd 252, Debian 12). The unit restarts on failure every
`inference_server_restart_sec` (10 s); at `inference_server_start_limit_burst` starts within
`inference_server_start_limit_interval_s` (3 in 600 s) systemd gives up and the unit is
`failed` (systemd 252 keeps the last start's `Result=exit-code`). `OnFailure=` then runs `<unit>-gave-up.service`, which
writes one line to the journal and counts `llm_server_gave_up_total`. The watchdog's timer
starts a failed unit again once it has been failed for `inference_server_watchdog_retry_failed_s`
(120 s), doubling that wait after each retry that did not bring it back, up to
`inference_server_watchdog_retry_failed_max_s` (1800 s): a crash loop never leaves the server
dead for longer than that. A unit stopped on purpose (`inactive`) is left alone. systemd 254
would add `RestartSteps=` and `RestartMaxDelaySec=` (the back-off inside the unit: RestartSec
growing to a maximum over N steps, no give-up needed) and `RestartMode=direct`; Debian 12 has
neither, so the back-off is the watchdog's.

**The watchdog between deploys**: `<unit>-watchdog.timer` runs `<unit>-watchdog.service`
(`/usr/local/lib/<unit>/watchdog`, `roles/inference_server/files/watchdog.py`, the host's own
python3) `inference_server_watchdog_interval_s` (60 s) after the last run ended. It skips while
a deploy holds the deploy lock (a lock older than `deploy_lock_stale_after_s` does not count)
or the unit is starting or stopping; otherwise it asks `/health` and then one streamed
generation of one token, each within `inference_server_watchdog_deadline_s` (30 s), with the
API key read from the unit's own key file (sent as the Bearer header, never printed), at the
address the server listens on (`inference_server_host`; a wildcard on its own family's
loopback). A probe that missed its deadline is told apart from a hang by the engine's own
counters: SGLang's `/metrics` (with `inference_server_enable_metrics`, as `group_vars/sglang_servers.yml` sets it)
read just before the probe and again after it; when `sglang:generation_tokens_total` plus
`sglang:realtime_tokens_total` grew meanwhile, the probe waited behind running requests and is
"busy" (`llm_watchdog_probe_busy`, `llm_watchdog_busy_probes_total`), not a failure, and it ends
a run of failures as an answer would. The running and queued requests are named but do not
decide (a hung scheduler leaves its gauges as they were). An engine without metrics
(transformers serve, SGLang without `inference_server_enable_metrics`) keeps the rule as it was: a missed
deadline is a failure. After `inference_server_watchdog_failures` (2) failed probes in a row it
restarts the server with the deploy's own restart program (role llm_host's
`llm_host_lib/restart.py`, installed beside the watchdog with the port guard's modules, which
inference_server's `tasks/restart.yml` runs through the `llm_host` module): `systemctl restart
--no-block` (SIGTERM to the main process, the drain bounded by `TimeoutStopSec`; systemd follows
SIGTERM with SIGCONT, so a stopped process drains too), then the wait for the new start, and
here until it is ready; but it does not clear the start limit first: a server that hangs again after every restart reaches
`StartLimitBurst`, systemd fails the unit (`OnFailure=`) and the back-off above takes over, whose
start alone clears the limit (`reset-failed`), once per retry. It writes `llm_watchdog.prom` in
`inference_server_textfile_dir` through a fresh file of a random name in that directory (created
`O_EXCL|O_NOFOLLOW`, its mode set on the open file, fsynced, renamed into place; no planted link
is followed): `llm_watchdog_last_probe_timestamp_seconds`, `llm_watchdog_probe_latency_seconds`,
`llm_watchdog_probe_success`, `llm_watchdog_probe_busy`, `llm_watchdog_busy_probes_total`,
`llm_watchdog_consecutive_failures`, `llm_watchdog_restarts_total`,
`llm_watchdog_last_restart_timestamp_seconds`, and the two give-up series, each labelled `unit`.
One probe now, with a shorter deadline: write
`LLM_WATCHDOG_DEADLINE_S=5` (and `LLM_WATCHDOG_FAILURES=1`) to `/run/<unit>-watchdog.env` and
`systemctl start <unit>-watchdog.service`.

**Boot**: `RequiresMountsFor=` names the venv link and directory and the model's (and the
drafter's) revision directory (`inference_server_mounts_for`), so a late mount is waited for
instead of crashed into; the SGLang unit is `After=`/`Wants=nvidia-persistenced.service`
(`inference_server_after_units`; a host without that unit is unaffected, systemd ignores a
`Wants=` of a unit that does not exist). The Faults table's two unclean stops (`docker restart --time 1`
of the host container, once while a deploy restarts the server and once after a deploy) show the
rest of a boot: `/run` is empty, so no deploy lock is left; systemd starts the unit on disk by
itself; and the same deploy run again passes the gate and leaves the last-known-good unit equal
to the running one. They are no power cuts: the container's page cache survives them, so a write
lost for want of an fsync cannot show there (the record writers' write-order test is what shows it).

**The last-known-good record** is written whole into `last-known-good.staged` and exchanged
with the live directory by one `renameat2(RENAME_EXCHANGE)` after an fsync
(`library/last_known_good.py`, one module run): a kill at any point leaves the old record or the new one. A rollback
first checks that the record's venv (`bin/python`), model and drafter directories and the
unit copy exist, and otherwise refuses with one sentence naming what is missing, before any
link or unit moves (`tests/roles/test_lkg_record.py`).

**Writes that must survive a power cut** (issue 44): the last-known-good record, the converged
record (and its last-known-good copy), the port guard's files and model_sync's `current` switch
and revisions are each written under a temporary name, fsynced (each file, and a staged
directory), renamed, and then the directory that holds the name is fsynced, before the module
says it is done: one place for the steps in each package (`llm_host_lib/durable.py` for the
deploy's records, `model_sync_lib/fs.py`'s `publish` for the model). A container restart keeps
the page cache, so a missing fsync cannot show in the power cuts above; the tests record the
order of each writer's writes, fsyncs and renames instead (`tests/shared/durability.py`) and fail
when a file's fsync before its rename, or the directory's after it, is left out.

**A disk that fills**: model_sync checks the host's free space against the model's bytes to
fetch plus `model_sync_disk_reserve_mib` before it copies, and ml_env against the lock's wheels
(the wheelhouse's files) times `ml_env_unpack_factor` (4; the rehearsal's venv is 4.0x its
wheels) plus `ml_env_disk_reserve_mib`, less what a half-built venv already holds, before pip
starts (an install from an index has no sizes to read first: only the reserve is checked). A
disk that another writer fills after the check fails the run with one sentence that names the
disk and says what to do; nothing is switched (`current`, `ml_env_path`), and the next run
resumes the copy or completes the venv: the Faults rows `disk-full-sync` and `disk-full-venv`,
on a 256 MiB tmpfs filled as the copy begins.

Proven on a real systemd host by the Faults table's rows `hang-between-deploys` (a SIGSTOPped
main process restarted by one watchdog run through the drain) and `crash-loop` (a runtime
drop-in that fails every start, recorded by `OnFailure=` and brought back by the watchdog
after its back-off), with the metrics read back; the timer and the unit's ordering by
`molecule/default/tests/test_watchdog.py`; the program's decisions (deadline, failures in a row, a
busy server against a frozen one, the start limit its restarts reach, the deploy lock, the back-off,
the textfile through no planted link, the key never printed) by `tests/roles/test_serving_watch.py`.
"""

ADOPTION = """\
## Adopting a host that runs by hand

Hand-written, not generated from the reliability scenario's results: these rows were tried by
`molecule test -s adopt` (`molecule/adopt`, a container of ct129 as the origin story left it:
venv by hand at `/root/ml-env`, model in `/root/models/tiny-qwen3.5`, `transformers serve`
started with nohup as root on port 30000) and are asserted by `molecule/adopt/tests/test_adopt.py`;
README "Adopting a host that runs by hand" describes the design.

| case | how it was tried | what happened | what the host did |
| --- | --- | --- | --- |
| a plain deploy on a host that runs by hand | `deploy.yml`, no `deploy_adopt` | preflight refused: `Port 30000 on molecule-adopt is already taken by /root/ml-env/bin/python /root/ml-env/bin/transformers serve ... (pid N, not a systemd service); stop that process or set inference_server_port to a free port, or take that server over without a gap with deploy_adopt=true (README: Adopting a host that runs by hand).` | nothing changed; the by-hand server (same pid) kept serving |
| check mode of an adoption | `deploy.yml --check --diff -e deploy_adopt=true` | the by-hand server was found and described (argv, user, cwd, venv, model, environment names; secret-looking values as `***`); nothing measured or stopped | exit 0; the by-hand server (same pid) kept serving |
| the new server fails after the switch | `-e deploy_adopt=true -e adopt_min_decode_share=100` (an impossible share), at `-vvvv` | the by-hand server was measured, our venv built beside it, the plan checked, then the by-hand server stopped (SIGTERM), its venv moved aside, ours started and gated; the share check failed: `The new server decodes X tok/s, less than adopt_min_decode_share 100 of the by-hand server's Y tok/s ...` | the rescue stopped and disabled our unit, moved the hand-built venv back to `/root/ml-env`, started the by-hand server again with its own argv, environment, working directory, user and log file under the transient unit `inference-server-by-hand` (systemd-run), gated it, and the deploy failed with one message ending `so the host is back on the server that ran by hand (started again as inference-server-by-hand.service, pid N, ...) and serving: gate PASS ...` |
| the adoption | `-e deploy_adopt=true` on the host the row above left, a client asking every 0.2 s | the by-hand server stopped only when our venv, model, plan and unit were ready; the client saw no answer for 9.5 s (our warm start 6.5 s; the drain and the tasks between stop and start the rest); the whole scenario took 5.4 min | serving under `inference-server.service`; the hand-built venv kept at `/root/ml-env.by-hand-<timestamp>`; before/after figures in `/var/lib/inference-server-deploy/adopt/report.json` and in `playbooks/status.yml` |
| a plain deploy after the adoption | `deploy.yml` | the converged fast path | `changed=0` |
| secrets of the by-hand environment | a fake `HF_TOKEN` in the nohup server's environment | searched in the output of every run of the scenario (one at `-vvvv`) and in the adoption report | found 0 times; the values stay in `/var/lib/inference-server-deploy/adopt/by-hand.env` (root, 0600), read by the transient unit's `EnvironmentFile=` |

Refusals of `deploy_adopt` that the scenario does not try (one sentence each, before anything
changes): a port held by a process whose pid is hidden from us (not root), a port held by
another systemd service (it could start its server again: disable it first), a by-hand server
that does not answer our gate (no baseline), and `adopt_min_decode_share` below 0 or
`adopt_stop_timeout_s` below 1.

"""

LIMITS = """\
### What is not covered here

* A hang during loading (before `/health` first answers) is caught by
  `health_gate_ready_timeout_s` (1800 s on ct129), not by the request timeout; the row above
  freezes the engine once it served a request, so the request timeout (20 s here, 300 s by
  default) decides.
* The old-glibc case uses a lock whose header names `manylinux_2_99`: no host with an old
  glibc is at hand. ct129's real lock says `manylinux_2_34` and preflight reads the host's
  glibc with `confstr`.
* The Hub case uses a local stand-in that answers like huggingface.co for a gated repo (401,
  `X-Error-Code: GatedRepo`); the real Hub is not reachable from the test machines.
* The GPU rows use a stand-in `nvidia-smi`; the GPU memory rule (weights per GPU plus
  headroom) and the memory budget need the weights' size and are checked after the sync
  (`tests/launch_plan/test_launch_plan.py`, `tests/launch_plan/test_launch_plan_budget.py`, the hand-written table above).
"""
