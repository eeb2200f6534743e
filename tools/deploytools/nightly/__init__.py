"""Nightly redeploy: run ``deploy.yml`` through the ansible-runner API and judge the result.

One run = one private data dir under the artifacts dir (``<repo>/artifacts/nightly`` by
default) named after its UTC start time (``20261130T020000Z``). ansible-runner keeps its
artifacts there (``artifacts/deploy/{stdout,job_events/,rc,status}``); this tool adds
``summary.json`` and copies it to ``<artifacts dir>/latest.json``. Run dirs older than
``--keep-days`` are pruned; nothing else in the artifacts dir is touched.

Only one run at a time: a lock file (``fcntl.flock``) is taken before anything else; a
second run prints one ``LOCKED`` line and exits with code 3 at once.

What the summary reads from ansible-runner's record of the run (see docs/nightly.md):

* the per-host totals: the play recap (``playbook_on_stats``, as ``Runner.stats`` gives it);
* what the roles report themselves through ``set_stats`` (``events.STATS_KEY``, handed over
  by ansible-runner as that event's ``artifact_data``): the server's deliberate restarts
  (roles/inference_server, one per new start of the unit) and the gate's verdict and figures
  (roles/health_gate), nothing recognised by a task's name or module;
* the changed and failed tasks, by name for the reader: ``runner_on_ok`` (``res.changed``)
  and ``runner_on_failed`` events.

Regression check: each host's gate figure is compared with the last figure recorded as a
baseline for that host in ``history.json`` next to the artifacts; more than
``--max-drop-percent`` below it fails the run. The gate itself fails the deploy below its
absolute threshold.

Extra variables (``-e``) go to ansible-playbook as given, through ansible-runner's command
line; ansible-playbook parses them.

Exit codes: 0 success, 1 the deploy failed or regressed (or ansible-runner failed), 2 usage
error, 3 another run holds the lock.

Modules: ``events`` (the event stream), ``state`` (history, run dirs, lock), ``cli``.
``tools/nightly-deploy`` is the thin entry point.

Nothing secret is written by this tool: ``env/envvars`` holds only ``ANSIBLE_CONFIG``,
``ANSIBLE_NOCOLOR`` and ``PATH``; ansible-runner's ``artifacts/deploy/command`` (which
records the whole environment) is rewritten with every value outside a short allow-list
replaced by ``<redacted>``. Credentials reach Ansible the usual way (ssh-agent,
``~/.ssh/config``, a vault password file named by ansible.cfg or ``--vault-password-file``).
"""
