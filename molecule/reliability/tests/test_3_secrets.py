"""Secrets: known fake values of the HF token, an engine secret and the API key, vaulted in the inventory
(conftest.SECRETS), went through every deploy of the scenario: rendered first by the run the
faults test kills (at -vvvv --diff), rotated by the deploy whose engine crashes and rolled
back with it, gated with, and carried by the nightly run that found the hung engine. Here
they are searched for everywhere they must not be: every play output of the session, the
artifacts of that tools/nightly-deploy run (ansible-runner), the gate reports and every other
file on the host, the unit file and the unit's journal. Positive controls first: the values
must be where they belong (secrets.env, api-key.yaml, the last-known-good copies, the
engine's environment), or a search that finds nothing would prove nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ENGINE_SECRET, SECRETS, UNIT, Deployer, dexec, healthy, record, sh, unit_props


def values(sets: list[dict[str, str]] = SECRETS) -> list[str]:
    """Every fake secret value of the session."""
    return [v for s in sets for v in s.values()]


def count_in(text: str, needles: list[str]) -> int:
    """Occurrences of any needle in ``text``."""
    return sum(text.count(n) for n in needles)


def host_count(paths: str, needles: list[str], exclude: list[str] = ()) -> tuple[int, int]:
    """(files searched, occurrences of the needles) under ``paths`` in the container, but ``exclude``."""
    drop = "".join(f" -e '{e}'" for e in exclude) or " -e '^$'"
    pattern = "".join(f" -e '{n}'" for n in needles)
    script = (
        f"find {paths} -xdev -type f -print 2>/dev/null | grep -v -x -F{drop} > /tmp/rel-files; "
        "grep -c . /tmp/rel-files; "
        f"tr '\\n' '\\0' < /tmp/rel-files | xargs -0 -r grep -F -o -a -h{pattern} 2>/dev/null | wc -l; "
        "rm -f /tmp/rel-files"
    )
    out = sh(script, check=False).split()
    return int(out[0]), int(out[1])


def test_the_secrets_reach_only_where_they_belong(deployer: Deployer, nightly_dir: Path) -> None:
    """Search every output of the session and every file on the host for both sets of fake values."""
    # Positive controls: the values of set 0 are deployed (set 1 was rolled back), where they belong.
    pid = unit_props("MainPID")["MainPID"]
    secrets_env = sh(f"stat -c '%a %U:%G' /etc/{UNIT}/secrets.env; cat /etc/{UNIT}/secrets.env")
    api_key_file = sh(f"stat -c '%a %U:%G' /etc/{UNIT}/api-key.yaml; cat /etc/{UNIT}/api-key.yaml")
    lkg = sh(
        f"stat -c '%a %U:%G' /var/lib/{UNIT}-deploy/last-known-good; "
        f"cat /var/lib/{UNIT}-deploy/last-known-good/secrets.env /var/lib/{UNIT}-deploy/last-known-good/api-key.yaml"
    )
    environ = dexec("cat", f"/proc/{pid}/environ")
    report = json.loads(sh(f"cat /var/lib/{UNIT}-deploy/gate/latest.json"))
    assert secrets_env.startswith("600 root:root") and SECRETS[0]["engine_secret"] in secrets_env
    assert api_key_file.startswith("640 root:inference") and SECRETS[0]["api_key"] in api_key_file
    assert lkg.startswith("700 root:root") and SECRETS[0]["api_key"] in lkg and SECRETS[0]["engine_secret"] in lkg
    assert f"{ENGINE_SECRET}={SECRETS[0]['engine_secret']}" in environ
    assert report["settings"]["api_key_set"] is True and report["passed"] is True
    assert healthy()

    needles = values()
    controller = [(label, count_in(text, needles), text.count("\n")) for label, text in deployer.outputs]
    nightly_files = [p for p in nightly_dir.rglob("*") if p.is_file()]
    nightly_found = sum(count_in(p.read_text(errors="replace"), needles) for p in nightly_files)
    verbose_runs = [c for c in controller if c[0].startswith("-vvvv")]
    on_purpose = [
        f"/etc/{UNIT}/secrets.env",
        f"/etc/{UNIT}/api-key.yaml",
        f"/var/lib/{UNIT}-deploy/last-known-good/secrets.env",
        f"/var/lib/{UNIT}-deploy/last-known-good/api-key.yaml",
    ]
    searched = {
        "gate reports on the host": host_count(f"/var/lib/{UNIT}-deploy/gate", needles),
        "the unit file": host_count(f"/etc/systemd/system/{UNIT}.service", needles),
        "every other file under /etc, /var/lib, /var/cache (but the wheelhouse), /var/log, /usr/local, /run, "
        "/tmp, /root, /srv and the venv records (the four files above excluded)": host_count(
            "/etc /var/lib /var/cache /var/log /usr/local /run /tmp /root /srv /opt/ml-env.d/*/ml-env-installed.json "
            "-path /var/cache/ml-env -prune -o",
            needles,
            on_purpose,
        ),
    }
    journal = sh(f"journalctl -u {UNIT} --no-pager -o cat", check=False)
    searched["the unit's journal"] = (journal.count("\n"), count_in(journal, needles))

    rows = [
        (
            "play output of every deploy of the session",
            f"{len(controller)} runs, {sum(c[2] for c in controller)} lines",
            sum(c[1] for c in controller),
        ),
        (
            "of which at -vvvv --diff (first rendering, the killed run and its rerun, the rotation and the "
            "crash rollback)",
            f"{len(verbose_runs)} runs, {sum(c[2] for c in verbose_runs)} lines",
            sum(c[1] for c in verbose_runs),
        ),
        (
            "ansible-runner artifacts of tools/nightly-deploy, the run that found the hung engine and rolled "
            "back (job_events, stdout, command, env, summary)",
            f"{len(nightly_files)} files",
            nightly_found,
        ),
    ]
    rows += [
        (where, f"{n} files" if "journal" not in where else f"{n} lines", found)
        for where, (n, found) in searched.items()
    ]
    for where, size, found in rows:
        record("secrets", where=where, searched=size, found=found)
    # fmt: off
    record("secrets_on_purpose", where=f"/etc/{UNIT}/secrets.env", mode=secrets_env.split("\n")[0],
           holds=f"inference_server_secrets ({ENGINE_SECRET}); read by systemd as root (EnvironmentFile)")
    record("secrets_on_purpose", where=f"/etc/{UNIT}/api-key.yaml", mode=api_key_file.split("\n")[0],
           holds="inference_server_api_key; read by the engine (SGLang --config) as the service's group")
    # fmt: on
    record(
        "secrets_on_purpose",
        where=f"/var/lib/{UNIT}-deploy/last-known-good/",
        mode=lkg.split("\n")[0],
        holds="copies of both, for rollback (files 0600)",
    )
    # Measured, not written down: who owns the engine's environ, and whether another account can read it
    # (nobody, the account a foreign process on the host would have) while root can.
    environ_mode = sh(f"stat -c '%a %U:%G' /proc/{pid}/environ").strip()
    other = sh(
        f"setpriv --reuid=nobody --regid=nogroup --clear-groups cat /proc/{pid}/environ >/dev/null 2>&1; echo $?"
    )
    nobody_reads = other.strip() == "0"
    root_reads = f"{ENGINE_SECRET}=" in environ
    # fmt: off
    record("secrets_on_purpose", where="/proc/<engine pid>/environ", mode=environ_mode,
           holds=f"{ENGINE_SECRET}, as every EnvironmentFile variable: read by root "
                 f"({'yes' if root_reads else 'NO'}), by nobody ({'YES' if nobody_reads else 'no'})")

    assert environ_mode.startswith("400 inference:"), environ_mode
    assert root_reads and not nobody_reads, f"nobody could read the engine's environment ({other!r})"
    assert [c for c in controller if c[1]] == [], "a play output holds a secret"
    # fmt: on
    assert nightly_found == 0, "the nightly artifacts hold a secret"
    assert {w: f for w, (_, f) in searched.items() if f} == {}, "a file or the journal on the host holds a secret"
    assert len(verbose_runs) >= 3 and len(nightly_files) > 5
