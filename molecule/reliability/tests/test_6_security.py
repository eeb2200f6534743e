"""Security refusals of issues 26 and 44, each a real deploy.yml run against the serving container, recorded
in the bad-input table: a control character from a model's config.json or in a unit name of
inference_server_after_units (issue 44's repro), a service account that
cannot reach its venv, root without asking for it, a Hugging Face token in the engine's environment
or in its secrets, a tampered wheel in the wheelhouse (the modes of the deploy's own state are in
test_4_files.py); and of issue 44: a link the service account put where its cache directory must be
(bad input), a venv the account cannot run (bad input), and the engine's check run by root with a
module the account put in its cache (a row of the files table: the marker root would write).

Each bad input must stop with its sentence and leave the server as it was (test_1_bad_input's
``refuse``: same MainPID and start time, unit, secrets, venv and model links, the lock given back).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import CACHE, HOST, REPO, UNIT, Deployer, dexec, record, sh
from test_1_bad_input import TINY, Case, refuse

INJECTION = "\nExecStartPre=+/usr/bin/touch /tmp/pwned\n"
# A small wheel of the rehearsal's lock, replaced in a copy of the wheelhouse by a tampered one.
TAMPERED = "mdurl-0.1.2-py3-none-any.whl"
LOCK = "transformers-cpu"
# Issue 44, item 1: a root directory the service account points its Hugging Face cache at.
VICTIM = "/opt/victim"
HF_CACHE = f"/var/cache/{UNIT}/huggingface"


def plant_link() -> None:
    """Setup: as the service account, replace its Hugging Face cache with a link to a root directory."""
    sh(
        f"install -d -o root -g root -m 0755 {VICTIM} && setpriv --reuid=inference --regid=inference "
        f"--clear-groups sh -c 'rm -rf {HF_CACHE} && ln -s {VICTIM} {HF_CACHE}'"
    )


def remove_link() -> None:
    """Teardown: the Hugging Face cache as the role leaves it."""
    sh(f"rm -f {HF_CACHE} && install -d -o inference -g inference -m 0750 {HF_CACHE} {HF_CACHE}/hub")


# Issue 44, item 2: the tiny model with its own config class (auto_map), served from a path on the
# host with trust_remote_code; transformers copies the class's module into HF_HOME/modules (the
# account's cache) unless a file there has its name, size and mtime, and imports the copy.
REMOTE_MODEL = "/srv/tiny-remote"
REMOTE_MODULE = f"{HF_CACHE}/modules/transformers_modules/tiny_hyphen_remote/remote_config.py"
CHECK_MARKER = "/root/issue44-root-ran-the-account-code"
REMOTE_CONFIG = (
    "from transformers import Qwen3_5TextConfig as _Base\n\n\n"
    "class Qwen3_5TextConfig(_Base):\n"
    '    """The model\'s own config class (auto_map), named as the one transformers maps to the model."""\n'
)
# The account's copy: the same class, and a marker when root imports it (the engine runs as inference).
TRAP = f"import os\n\nif os.getuid() == 0:\n    open({CHECK_MARKER!r}, 'w').write('root')\n" + REMOTE_CONFIG


def cases(work: Path) -> list[Case]:
    """The cases, with this session's controller-side inputs under ``work``."""
    # fmt: off
    return [
        Case("control-character", "a model's config.json with a newline in a string that reaches the unit",
             "a copy of the tiny model whose config.json has `architectures: [\"Qwen3_5ForCausalLM\\nExecStartPre="
             "+/usr/bin/touch /tmp/pwned\\n\"]` as `controller_dir` source (the plan's first note names the "
             "architecture, and the unit's comment lines carry the notes)",
             r"a note of the plan holds the control character '\\n' \(.*\), which would break the unit's lines: it "
             r"comes from the model's config\.json\['architectures'\]\[0\]; remove it there before anything is "
             r"written\.",
             extra={"model_sync_source": {"type": "controller_dir", "path": str(work / "tiny-newline")}}),
        Case("after-units-newline", "a unit name with a newline and [Service] lines in inference_server_after_units",
             "issue 44's repro: `-e '{\"inference_server_after_units\": [\"x.service\\n[Service]\\n"
             "ExecStartPre=+/usr/bin/touch /tmp/pwned\"]}'` (on main the unit got the line twice, root made "
             "/tmp/pwned and the gate passed)",
             r"inference_server_after_units 'x\.service\\n\[Service\]\\nExecStartPre=\+/usr/bin/touch /tmp/pwned' "
             r"holds a control character, which would break the lines of a systemd unit: remove it\.",
             extra={"inference_server_after_units": [f"x.service\n[Service]{INJECTION.rstrip()}"]}),
        Case("service-user-no-venv", "a service account that cannot reach the venv (an adopted root host's path)",
             "`-e ml_env_path=/root/ml-env` (/root is 0700 root:root) with the service account `inference`",
             r"inference_server_user inference cannot reach ml_env_path /root/ml-env \(/root is 0700 root:root, it "
             r"needs search \(x\)\): set ml_env_path to a path it can reach, such as under /opt or /srv "
             r"\(docs/security\.md, \"Moving a host off root\"\), or set inference_server_user to root with "
             r"inference_server_allow_root true; nothing was stopped or changed\.",
             extra={"ml_env_path": "/root/ml-env"}),
        Case("root-not-asked", "root as the service account without asking for it",
             "`-e inference_server_user=root` (no `inference_server_allow_root`)",
             r"inference_server_user is root, so the engine \(and the model's own code with trust_remote_code\) "
             r"would run with every right on rel-molecule: leave inference_server_user at a dedicated account \(the "
             r"default, inference; docs/security\.md says how to move a host off root\), or set "
             r"inference_server_allow_root to true to run it as root knowingly\.",
             extra={"inference_server_user": "root"}),
        Case("hub-token-in-environment", "a Hugging Face token in the engine's plain environment",
             "`inference_server_environment: {HF_TOKEN: hf_...}` (a made-up value)",
             r"inference_server_environment sets HF_TOKEN, a Hugging Face token, which would be written into the "
             r"unit file \(0644\) and the engine's environment although the engine runs offline \(HF_HUB_OFFLINE=1\) "
             r"and only model_sync downloads: put the token in model_sync_hf_token \(in Ansible Vault\) and remove "
             r"it from inference_server_environment\.",
             extra={"inference_server_environment": {"HF_TOKEN": "hf_RelMadeUpNotASecret"}}),
        Case("hub-token-in-secrets", "a Hugging Face token in the engine's secrets",
             "`inference_server_secrets: {HF_TOKEN: hf_...}` (a made-up value)",
             r"inference_server_secrets sets HF_TOKEN, a Hugging Face token, which would sit in the engine's "
             r"environment although the engine runs offline \(HF_HUB_OFFLINE=1\) and only model_sync downloads: put "
             r"the token in model_sync_hf_token \(in Ansible Vault\) and remove it from inference_server_secrets\.",
             extra={"inference_server_secrets": {"HF_TOKEN": "hf_RelMadeUpNotASecret"}}),
        Case("tampered-wheel", "a tampered wheel in the wheelhouse",
             f"a copy of the wheelhouse whose `{TAMPERED}` has 16 bytes appended, and a copy of the lock with one "
             "more comment line (a new venv directory, so ml_env installs): `-e ml_env_wheelhouse=... "
             "-e ml_env_lock_dir=...`; pip runs with `--require-hashes` (the new venv directory is made and "
             "left unlinked)",
             r"pip refused to install ml_env_lock 'transformers-cpu' into /opt/ml-env\.d/[0-9a-f]{12} because "
             r"mdurl==0\.1\.2 has sha256 [0-9a-f]{16}, which \S+/locks-tampered/transformers-cpu\.txt does not list "
             r"\(THESE PACKAGES DO NOT MATCH THE HASHES\): the wheelhouse \S+/wheelhouse-tampered holds another file "
             r"than the lock was made from, so rebuild it with tools/build-bundle --lock \S+ --out \S+, and refresh "
             r"the lock's hashes \(tools/lock-profile --hash-only \S+\) only for a file you trust\.",
             extra={"ml_env_wheelhouse": str(work / "wheelhouse-tampered"),
                    "ml_env_lock_dir": str(work / "locks-tampered")},
             allow_changes=True),
        Case("service-link", "a link the service account put where its cache directory must be (issue 44)",
             f"as `inference`: `rm -rf {HF_CACHE} && ln -s {VICTIM} {HF_CACHE}` ({VICTIM} root:root 0755); the link "
             "changes the converged record, so the server's role runs",
             rf"{HF_CACHE} is a symbolic link to {VICTIM}, where inference_server_cache_dir needs a directory: "
             rf"/var/cache/{UNIT} can be written by inference, who could have put it there, so root follows no link "
             rf"and changed nothing there; remove {HF_CACHE} and deploy again\.",
             setup=plant_link, teardown=remove_link),
        Case("venv-closed", "a venv the service account cannot run (built under root's umask 077, issue 44)",
             "`chmod 0700` the venv `/opt/ml-env` points at, as ml_env left it under umask 077 before issue 44; "
             "`inference_server_environment: {ISSUE44_VENV: \"1\"}` changes the unit, so the server's role runs",
             r"inference_server_user inference cannot run the python of ml_env_path's venv /opt/ml-env \(/opt/ml-env "
             r"is 0700 root:root, it needs search \(x\)\), so the server could not start \(203/EXEC\): open the venv "
             r"to other accounts with chmod -R go\+rX /opt/ml-env \(it was built under a umask that closed it; ml_env "
             r"builds venvs open since issue 44\) or remove it so that ml_env builds it again; nothing was stopped or "
             r"changed\.",
             extra={"inference_server_environment": {"ISSUE44_VENV": "1"}},
             setup=lambda: sh("chmod 0700 $(readlink -f /opt/ml-env)"),
             teardown=lambda: sh("chmod 0755 $(readlink -f /opt/ml-env)")),
    ]
    # fmt: on


@pytest.fixture(scope="module")
def work(workdir: Path) -> Path:
    """The tampered inputs, on the controller."""
    root = workdir / "security"
    root.mkdir()
    shutil.copytree(TINY, root / "tiny-newline")
    config = json.loads((TINY / "config.json").read_text())
    config["architectures"] = [config["architectures"][0] + INJECTION]
    (root / "tiny-newline" / "config.json").write_text(json.dumps(config))
    # Hard links (no copy of torch), then the one file replaced by a tampered copy of its own.
    wheelhouse = CACHE / "wheelhouse" / LOCK
    tampered = root / "wheelhouse-tampered"
    shutil.copytree(wheelhouse, tampered, copy_function=os.link)
    (tampered / TAMPERED).unlink()
    (tampered / TAMPERED).write_bytes((wheelhouse / TAMPERED).read_bytes() + b"\0" * 16)
    (root / "locks-tampered").mkdir()
    lock = (REPO / "roles/ml_env/files/locks" / f"{LOCK}.txt").read_text()
    (root / "locks-tampered" / f"{LOCK}.txt").write_text(lock + "# reliability: a copy, so that ml_env installs\n")
    yield root
    sh("rm -f /tmp/pwned", check=False)


CASES = cases(Path("/nonexistent"))


@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_security_input_is_refused_before_the_server_changes(
    case_id: str, work: Path, deployer: Deployer, good_state: dict
) -> None:
    refuse(next(c for c in cases(work) if c.id == case_id), deployer)
    if case_id in ("control-character", "after-units-newline"):
        assert sh("test -e /tmp/pwned && echo PWNED || echo clean").strip() == "clean"
        assert "ExecStartPre=+/usr/bin/touch" not in sh(f"cat /etc/systemd/system/{UNIT}.service")
    if case_id == "service-link":
        assert sh(f"stat -c '%U:%G %a' {VICTIM} && rm -rf {VICTIM}").strip() == "root:root 755"


def test_the_engines_check_runs_no_code_the_service_account_put_in_its_cache(
    workdir: Path, deployer: Deployer, good_state: dict
) -> None:
    """Issue 44, item 2: root runs the engine's check; with the plan's HF_HOME it imported the account's module."""
    model = workdir / "tiny-remote"
    shutil.copytree(TINY, model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "remote_config.Qwen3_5TextConfig"}
    (model / "config.json").write_text(json.dumps(config, indent=2))
    # As long as the trap, so that a shallow compare (size and mtime) takes one for the other.
    (model / "remote_config.py").write_text(REMOTE_CONFIG + "#" * (len(TRAP) - len(REMOTE_CONFIG) - 1) + "\n")
    sh(f"rm -rf {REMOTE_MODEL}")
    subprocess.run(["docker", "cp", str(model), f"{HOST}:{REMOTE_MODEL}"], check=True, capture_output=True)
    sh(f"chown -R root:root {REMOTE_MODEL} && chmod -R u=rwX,go=rX {REMOTE_MODEL} && rm -f {CHECK_MARKER}")
    dexec(
        "setpriv", "--reuid=inference", "--regid=inference", "--clear-groups", "sh", "-c",
        f"mkdir -p $(dirname {REMOTE_MODULE}) && cat > {REMOTE_MODULE} && touch -r {REMOTE_MODEL}/remote_config.py "
        f"{REMOTE_MODULE}",
        stdin=TRAP,
    )  # fmt: skip
    run = deployer.run(
        {"model_sync_source": {"type": "host_path", "path": REMOTE_MODEL}, "inference_server_trust_remote_code": True}
    )
    found = sh(f"stat -c 'written by %U' {CHECK_MARKER} 2>/dev/null || echo absent").strip()
    record(
        "files",
        path=f"{CHECK_MARKER} (the engine's check, trust_remote_code, the account's module in HF_HOME/modules)",
        expected="absent: root ran no code the service account put in its cache",
        found=found,
        ok=found == "absent",
    )
    sh(f"rm -f {CHECK_MARKER} {REMOTE_MODULE}")
    assert found == "absent", "root imported the service account's module in the engine's check"
    assert run.rc == 0, f"the deploy of the remote-code model failed:\n{run.tail()}"
