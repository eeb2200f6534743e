"""Final state of the mirror scenario on the sim host (testinfra)."""

from __future__ import annotations

import json
import os

import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("sims")

DEST = "/srv/models/tiny-qwen3.5"
MIRROR_R3 = "/srv/mirror/tiny-qwen3.5/r3"
ENGINE = ["/usr/local/sbin/model-sync"]
SSH = ["--ssh-opt=-i", "--ssh-opt=/root/.ssh/model-mirror"]


def _mirror_sums(host) -> dict[str, str]:
    """sha256 of r3's files, computed on the mirror host."""
    mirror = host.get_host("ansible://ms-mirror?ansible_inventory=" + os.environ["MOLECULE_INVENTORY_FILE"])
    out = mirror.check_output(f"cd {MIRROR_R3} && sha256sum *")
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def test_current_is_a_relative_link_to_a_kept_revision(host):
    current = host.file(f"{DEST}/current")
    assert current.is_symlink
    assert current.linked_to.startswith(f"{DEST}/revisions/")
    assert host.check_output(f"readlink {DEST}/current").startswith("revisions/")
    revisions = host.check_output(f"ls {DEST}/revisions").split()
    assert len(revisions) == 2  # current + model_sync_keep_revisions (1)
    assert not [r for r in revisions if r.endswith(".partial")]


def test_current_matches_the_mirror_byte_for_byte(host):
    sums = _mirror_sums(host)
    out = host.check_output(f"cd {DEST}/current && sha256sum *")
    assert {line.split()[1]: line.split()[0] for line in out.splitlines()} == sums


def test_files_are_readable_by_the_service(host):
    for name in ("config.json", "model-00001-of-00004.safetensors"):
        f = host.file(f"{DEST}/current/{name}")
        assert (f.user, f.group, f.mode) == ("root", "root", 0o644)
    d = host.file(f"{DEST}/revisions")
    assert d.mode == 0o755


def test_no_leftovers_of_the_interrupted_transfer(host):
    assert not host.file(f"{DEST}/.incoming/.rsync-partial").exists
    assert host.check_output(f"find {DEST} -name '.model-sync-tmp.*' -o -name '.current.tmp.*'") == ""


def test_noop_reads_no_model_content(host):
    cmd = (
        ENGINE + ["deploy", DEST, "--source-host", "ms-mirror", "--source-path", MIRROR_R3, "--reserve-mib", "16"] + SSH
    )
    result = json.loads(host.check_output(" ".join(cmd)))
    assert result["changed"] is False
    assert result["stats"]["bytes_hashed"] == 0
    assert result["stats"]["bytes_fetched"] == 0


def test_full_verification_passes(host):
    result = json.loads(host.check_output(" ".join(ENGINE + ["verify", f"{DEST}/current", "--verify", "full"])))
    assert result["stats"]["files_hashed"] >= 7
    assert result["weights_bytes"] > 0


def test_controller_push_is_in_place(host):
    assert host.file("/srv/models/tiny-ctl/current/config.json").exists
    assert host.file("/var/lib/model-sync").is_directory
