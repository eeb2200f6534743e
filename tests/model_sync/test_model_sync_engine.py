"""Engine-level tests of model_sync_lib, module_utils of the collection llm_deploy.inference (no Ansible, no network).

Manifest logic, the size+mtime sha256 cache, parallel hashing, atomic staging and
switching, pruning, and interruption/resume of a local copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import durability
import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib import (
    checks,
    compact_json,
    diff,
    fetch_hub,
    fs,
    hashing,
    install,
)
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib.common import TMP_PREFIX, SyncError
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib.engine import Engine
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib.state import State
from role_files import launcher_as_on_a_host

ROOT = Path(__file__).resolve().parents[2]
# The package's source folder, and role model_sync's launcher laid out as on a host.
PACKAGE = Path(install.__file__).parent
LAUNCHER = launcher_as_on_a_host(ROOT / "roles/model_sync/files/model-sync")


def write_shard(path: Path, name: str, nbytes: int, seed: int) -> None:
    """A valid safetensors file with one U8 tensor of ``nbytes`` bytes."""
    header = json.dumps({name: {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    data = bytes((seed + i) % 251 for i in range(nbytes))
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def make_model(path: Path, shards: int = 3, nbytes: int = 200_000, seed: int = 0) -> Path:
    """A small sharded model directory (config.json, index, shards)."""
    path.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        write_shard(path / name, f"w{i}", nbytes + i, seed + i)
        weight_map[f"w{i}"] = name
    (path / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": sum(nbytes + i for i in range(1, shards + 1))}, "weight_map": weight_map}
        )
    )
    (path / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 8}))
    return path


def engine(tmp_path: Path, src: Path, **kw) -> Engine:
    """An engine syncing ``src`` (a local mirror directory) into tmp_path/dest/m, as the current user."""
    import grp
    import pwd

    kw.setdefault("owner", pwd.getpwuid(os.getuid()).pw_name)
    kw.setdefault("group", grp.getgrgid(os.getgid()).gr_name)
    kw.setdefault("reserve_mib", 0)
    return Engine(
        str(tmp_path / "dest/m"), source={"type": "mirror", "path": str(src)}, state_dir=str(tmp_path / "state"), **kw
    )


def deploy(tmp_path: Path, src: Path, **kw) -> dict:
    """sync + switch + prune, as the role does."""
    eng = engine(tmp_path, src, **kw)
    res = eng.sync()
    if res.get("revision"):
        res["switched"] = eng.switch(res["revision"])["changed"]
        res["pruned"] = eng.prune()["pruned"]
    return res


# ----------------------------------------------------------------- manifest logic


def test_revision_label_is_a_content_digest_independent_of_order():
    a = {"b": [2, "bb"], "a": [1, "aa"]}
    b = {"a": [1, "aa"], "b": [2, "bb"]}
    assert checks.revision_label(a) == checks.revision_label(b)
    assert len(checks.revision_label(a)) == 12
    assert checks.revision_label(a) != checks.revision_label({"a": [1, "aa"], "b": [2, "bc"]})


def test_manifest_file_parses_sha256sum_output(tmp_path):
    (tmp_path / "x").write_bytes(b"hello")
    out = subprocess.run(["sha256sum", "x"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    (tmp_path / "manifest.sha256").write_text("# comment\n" + out + f"{'0' * 64} *./y\n")
    parsed = checks.read_manifest_file(str(tmp_path / "manifest.sha256"))
    assert parsed == {"x": hashlib.sha256(b"hello").hexdigest(), "y": "0" * 64}


def test_manifest_file_with_a_bad_line_is_refused(tmp_path):
    (tmp_path / "m").write_text("nothex  file\n")
    with pytest.raises(SyncError, match="line 1"):
        checks.read_manifest_file(str(tmp_path / "m"))


def test_check_model_needs_config_json(tmp_path):
    src = make_model(tmp_path / "src")
    (src / "config.json").unlink()
    with pytest.raises(SyncError, match="has no config.json"):
        checks.check_model(str(src), fs.scan(str(src)), set(), "X")


def test_check_model_names_a_missing_shard(tmp_path):
    src = make_model(tmp_path / "src")
    (src / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(SyncError, match="model-00002-of-00003.safetensors"):
        checks.check_model(str(src), fs.scan(str(src)), set(), "X")


def test_check_model_finds_a_truncated_shard(tmp_path):
    src = make_model(tmp_path / "src")
    shard = src / "model-00001-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    files = fs.scan(str(src))
    with pytest.raises(SyncError, match="truncated or corrupt"):
        checks.check_model(str(src), files, {"model-00001-of-00003.safetensors"}, "X")


def test_check_model_accepts_a_single_file_model(tmp_path):
    src = tmp_path / "one"
    src.mkdir()
    write_shard(src / "model.safetensors", "w", 1000, 1)
    (src / "config.json").write_text("{}")
    res = checks.check_model(str(src), fs.scan(str(src)), {"model.safetensors"}, "X")
    assert res["weights"] == ["model.safetensors"]
    assert res["weights_bytes"] == (src / "model.safetensors").stat().st_size


def test_dumps_matches_json():
    data = {"a": [1, 2.5, None, True, False], "b": 'quote" back\\ nl\n tab\t \x01 ü', "c": {"z": 1, "y": []}}
    assert json.loads(compact_json.dumps(data)) == data


# ----------------------------------------------------------------- cache and hashing


def test_cache_hits_only_while_size_and_mtime_are_unchanged(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    state = State(str(tmp_path / "state"), str(tmp_path), writable=True)
    st = os.stat(f)
    state.store(st, "abc")
    state.save()
    again = State(str(tmp_path / "state"), str(tmp_path), writable=True)
    assert again.lookup(os.stat(f)) == "abc"
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert again.lookup(os.stat(f)) is None
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert again.lookup(os.stat(f)) == "abc"
    f.write_bytes(b"x" * 101)
    assert again.lookup(os.stat(f)) is None


def test_cache_is_not_written_in_check_mode(tmp_path):
    state = State(str(tmp_path / "state"), str(tmp_path), writable=False)
    state.store(os.stat(tmp_path), "abc")
    state.save()
    assert not (tmp_path / "state").exists()


def test_a_corrupt_cache_file_is_ignored(tmp_path):
    state = State(str(tmp_path / "state"), str(tmp_path / "d"), writable=True)
    state.store(os.stat(tmp_path), "abc")
    state.save()
    Path(state.path).write_bytes(b"garbage")
    assert State(str(tmp_path / "state"), str(tmp_path / "d"), writable=True).data["inodes"] == {}


def test_hash_many_runs_in_parallel_and_is_correct(tmp_path, monkeypatch):
    files = []
    for i in range(6):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(300_000 + i))
        files.append((str(p), p.stat().st_size))
    seen_threads: set[int] = set()
    two_at_once = threading.Event()
    real = hashing.sha256_file

    def spy(path, counter=None):
        seen_threads.add(threading.get_ident())
        if len(seen_threads) > 1:
            two_at_once.set()
        two_at_once.wait(5)  # a serial implementation would stall here, then fail below
        return real(path, counter)

    monkeypatch.setattr(hashing, "sha256_file", spy)
    counter = hashing.Counter()
    out = hashing.hash_many(files, 3, counter)
    for path, _ in files:
        assert out[path] == hashlib.sha256(Path(path).read_bytes()).hexdigest()
    assert two_at_once.is_set() and len(seen_threads) > 1
    assert counter.values["bytes_hashed"] == sum(s for _, s in files)


@pytest.mark.parametrize("size", [0, 1, 4095, 3 * 1024 + 7])
def test_mapped_and_read_hashing_agree_across_chunk_edges(tmp_path, monkeypatch, size):
    monkeypatch.setattr(hashing, "BUF_SIZE", 1024)  # many chunks, the last one partial
    path = tmp_path / "f"
    data = os.urandom(size)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    counter = hashing.Counter()
    try:
        mapped = hashing.sha256_fd(fd, mapped=True, counter=counter)
        read = hashing.sha256_fd(fd, counter=counter)  # after the mapped pass: reads from the start again
    finally:
        os.close(fd)
    assert mapped == read == hashlib.sha256(data).hexdigest()
    assert (counter.values["bytes_hashed"], counter.values["files_hashed"]) == (2 * size, 2)


def test_start_writeback_leaves_a_file_intact_and_tolerates_a_libc_without_it(tmp_path, monkeypatch):
    path = tmp_path / "f"
    with open(path, "wb") as fh:
        fh.write(b"x" * 70_000)
        fh.flush()
        fs.start_writeback(fh.fileno())
    assert path.read_bytes() == b"x" * 70_000
    monkeypatch.setattr(fs, "_SYNC_FILE_RANGE", [None])
    fd = os.open(path, os.O_RDONLY)
    try:
        fs.start_writeback(fd)  # nothing to call: no error
    finally:
        os.close(fd)


DROPS = pytest.mark.parametrize(
    "drop", ["", "file", "directory"], ids=["as-written", "no-file-fsync", "no-directory-fsync"]
)


@DROPS
def test_a_revision_and_the_current_switch_survive_a_power_cut(tmp_path, monkeypatch, drop):
    """A revision's files and names are on disk before revisions/<rev> and current can name it, and both names after."""
    src = make_model(tmp_path / "src")
    with durability.recorded(monkeypatch, drop=drop) as events:
        res = deploy(tmp_path, src)
    dest = tmp_path / "dest/m"
    revision = dest / "revisions" / res["revision"]
    assert len([f for f in revision.iterdir() if f.is_file()]) == len(list(src.iterdir()))
    lost = durability.lost_on_power_cut(events, str(revision)) + durability.lost_on_power_cut(
        events, str(dest / "current")
    )
    assert bool(lost) == bool(drop), lost


@DROPS
def test_a_file_written_whole_survives_a_power_cut(tmp_path, monkeypatch, drop):
    """fs.atomic_write: the sha256 cache and the command's files on the host (install)."""
    (tmp_path / "state").write_bytes(b"old")
    with durability.recorded(monkeypatch, drop=drop) as events:
        fs.atomic_write(str(tmp_path / "state"), b"new")
    assert (tmp_path / "state").read_bytes() == b"new"
    lost = durability.lost_on_power_cut(events, str(tmp_path / "state"))
    assert bool(lost) == bool(drop), lost


# ----------------------------------------------------------------- sync, switch, prune


def test_first_sync_then_noop_reads_nothing(tmp_path):
    src = make_model(tmp_path / "src")
    first = deploy(tmp_path, src)
    assert first["changed"] and first["switched"]
    dest = tmp_path / "dest/m"
    assert os.readlink(dest / "current") == f"revisions/{first['revision']}"
    assert first["stats"]["bytes_fetched"] == sum(f.stat().st_size for f in src.iterdir())
    for f in src.iterdir():
        assert (dest / "current" / f.name).read_bytes() == f.read_bytes()
        assert (dest / "current" / f.name).stat().st_mtime_ns == f.stat().st_mtime_ns
    second = deploy(tmp_path, src)
    assert second["changed"] is False and second["switched"] is False
    assert second["stats"]["bytes_hashed"] == 0 and second["stats"]["bytes_fetched"] == 0
    assert second["revision"] == first["revision"]


def test_check_mode_plans_without_writing(tmp_path):
    src = make_model(tmp_path / "src")
    res = engine(tmp_path, src, check=True).sync()
    assert res["changed"]
    assert {f["path"] for f in res["plan"]["fetch"]} == {f.name for f in src.iterdir()}
    assert not (tmp_path / "dest").exists() and not (tmp_path / "state").exists()
    shown = diff.diff_text(res, str(tmp_path / "dest/m"))
    assert "config.json" in shown["after"]


def test_revision_change_shares_unchanged_files_and_keeps_the_previous(tmp_path):
    src = make_model(tmp_path / "src")
    r1 = deploy(tmp_path, src)["revision"]
    write_shard(src / "model-00003-of-00003.safetensors", "w3", 200_003, 99)
    res = deploy(tmp_path, src)
    r2 = res["revision"]
    assert r2 != r1
    assert [f["path"] for f in res["plan"]["fetch"]] == ["model-00003-of-00003.safetensors"]
    revs = tmp_path / "dest/m/revisions"
    assert (revs / r1 / "model-00001-of-00003.safetensors").stat().st_ino == (
        revs / r2 / "model-00001-of-00003.safetensors"
    ).stat().st_ino
    assert (revs / r1 / "model-00003-of-00003.safetensors").read_bytes() != (
        revs / r2 / "model-00003-of-00003.safetensors"
    ).read_bytes()
    assert os.readlink(tmp_path / "dest/m/current") == f"revisions/{r2}"


def test_prune_keeps_n_previous_and_protected_revisions(tmp_path):
    src = make_model(tmp_path / "src")
    labels = []
    for seed in range(4):
        write_shard(src / "model-00001-of-00003.safetensors", "w1", 200_001, 50 + seed)
        protect = [str(tmp_path / f"dest/m/revisions/{labels[0]}")] if labels else []
        labels.append(deploy(tmp_path, src, keep=1, protect_paths=protect)["revision"])
    left = sorted(os.listdir(tmp_path / "dest/m/revisions"))
    assert left == sorted([labels[0], labels[2], labels[3]])


def test_explicit_revision_label(tmp_path):
    src = make_model(tmp_path / "src")
    res = deploy(tmp_path, src, revision="v1.0")
    assert res["revision"] == "v1.0" and (tmp_path / "dest/m/revisions/v1.0").is_dir()
    with pytest.raises(SyncError, match="not usable as a directory name"):
        engine(tmp_path, src, revision="../x").sync()


def test_corruption_with_mtime_change_is_repaired(tmp_path):
    src = make_model(tmp_path / "src")
    r1 = deploy(tmp_path, src)["revision"]
    shard = tmp_path / "dest/m/current/model-00002-of-00003.safetensors"
    with open(shard, "r+b") as fh:
        fh.seek(500)
        fh.write(b"garbage")
    res = deploy(tmp_path, src)
    assert res["revision"] == r1
    assert [r["path"] for r in res["plan"]["repair"]] == ["model-00002-of-00003.safetensors"]
    assert shard.read_bytes() == (src / shard.name).read_bytes()


def test_silent_rot_is_found_by_full_verification(tmp_path):
    src = make_model(tmp_path / "src")
    deploy(tmp_path, src)
    shard = tmp_path / "dest/m/current/model-00001-of-00003.safetensors"
    st = shard.stat()
    with open(shard, "r+b") as fh:
        fh.seek(700)
        fh.write(b"rot")
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert deploy(tmp_path, src)["changed"] is False  # cached mode cannot see it
    res = deploy(tmp_path, src, verify="full")
    assert res["plan"]["refetched"] == ["model-00001-of-00003.safetensors"]
    assert shard.read_bytes() == (src / shard.name).read_bytes()


def test_mirror_manifest_mismatch_names_the_file(tmp_path):
    src = make_model(tmp_path / "src")
    lines = subprocess.run("sha256sum *", shell=True, cwd=src, capture_output=True, text=True, check=True).stdout
    (src / "manifest.sha256").write_text(lines.replace(lines.split()[0], "0" * 64, 1))
    bad = lines.split()[1]
    with pytest.raises(SyncError, match=f"sha256 mismatch in {bad}"):
        deploy(tmp_path, src)
    assert not (tmp_path / "dest/m/current").exists()


def test_not_enough_disk_is_refused_before_copying(tmp_path):
    src = make_model(tmp_path / "src")
    with pytest.raises(SyncError) as exc:
        deploy(tmp_path, src, reserve_mib=1 << 40)
    msg = str(exc.value)
    assert "not enough disk space" in msg and "bytes" in msg and "nothing was copied" in msg
    assert not (tmp_path / "dest/m/.incoming").exists()


def test_source_without_config_json_is_refused_and_current_kept(tmp_path):
    src = make_model(tmp_path / "src")
    r1 = deploy(tmp_path, src)["revision"]
    (src / "config.json").unlink()
    with pytest.raises(SyncError, match="has no config.json"):
        deploy(tmp_path, src)
    assert os.readlink(tmp_path / "dest/m/current") == f"revisions/{r1}"


def test_controller_dir_mismatch_asks_for_a_refetch(tmp_path):
    """controller_dir: the role pushed into .incoming; a manifest mismatch removes the file."""
    src = make_model(tmp_path / "src")
    deploy(tmp_path, src)
    inc = tmp_path / "dest/m/.incoming"
    (inc / "manifest.sha256").write_text(f"{'0' * 64}  config.json\n")
    eng = Engine(
        str(tmp_path / "dest/m"),
        source={"type": "controller_dir", "path": "/nowhere"},
        state_dir=str(tmp_path / "state"),
        owner=engine(tmp_path, src).owner,
        group=engine(tmp_path, src).group,
        reserve_mib=0,
    )
    res = eng.sync()
    assert res["refetch"] == ["config.json"] and not (inc / "config.json").exists()


# ----------------------------------------------------------------- interruption and resume


def test_killed_copy_leaves_current_and_resumes(tmp_path):
    src = make_model(tmp_path / "src", shards=3, nbytes=3_000_000)
    r1 = deploy(tmp_path, src)["revision"]
    for i in range(1, 4):
        write_shard(src / f"model-{i:05d}-of-00003.safetensors", f"w{i}", 3_000_000 + i, 70 + i)
    # Kill the engine from inside the copy of the second shard (after some bytes are written).
    script = f"""
import os, sys, signal
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib import cli, fs, hashing
real = hashing.Counter.add
def add(self, key, n):
    real(self, key, n)
    if key == "bytes_fetched" and self.values["bytes_fetched"] > 4_000_000:
        os.kill(os.getpid(), signal.SIGKILL)
hashing.Counter.add = add
fs.COPY_CHUNK = 1 << 20
sys.exit(cli.cli(["deploy", {str(tmp_path / "dest/m")!r}, "--source-path", {str(src)!r},
                 "--state-dir", {str(tmp_path / "state")!r}, "--reserve-mib", "0", "--workers", "1",
                 "--owner", str(os.getuid()), "--group", str(os.getgid())]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    dest = tmp_path / "dest/m"
    assert os.readlink(dest / "current") == f"revisions/{r1}"
    tmp_files = [p for p in (dest / ".incoming").iterdir() if p.name.startswith(TMP_PREFIX)]
    assert tmp_files, "an interrupted copy leaves its temporary file"
    # The partial shard's file holds what was copied before the kill (the largest, should another be there).
    done_before = max(p.stat().st_size for p in tmp_files)
    assert done_before > 0, [(p.name, p.stat().st_size) for p in (dest / ".incoming").iterdir()]
    res = deploy(tmp_path, src)
    fetched = res["stats"]["bytes_fetched"]
    total = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    assert fetched < total, "complete shards and the partial one are not copied again"
    assert res["revision"] != r1 and res["switched"]
    for f in src.iterdir():
        assert (dest / "current" / f.name).read_bytes() == f.read_bytes()
    assert not [p for p in (dest / ".incoming").iterdir() if p.name.startswith(TMP_PREFIX)]


# ----------------------------------------------------------------- command line


def test_cli_launcher_deploys_and_verifies(tmp_path):
    src = make_model(tmp_path / "src")
    common = [
        "--state-dir",
        str(tmp_path / "state"),
        "--reserve-mib",
        "0",
        "--owner",
        str(os.getuid()),
        "--group",
        str(os.getgid()),
    ]
    out = subprocess.run(
        [str(LAUNCHER), "deploy", str(tmp_path / "d"), "--source-path", str(src)] + common,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    res = json.loads(out)
    assert res["changed"] and "config" not in res
    out = subprocess.run(
        [
            str(LAUNCHER),
            "verify",
            str(tmp_path / "d/current"),
            "--verify",
            "full",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["stats"]["files_hashed"] == 5
    bad = subprocess.run([str(LAUNCHER), "deploy", str(tmp_path / "d"), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown option --bogus" in bad.stderr


def test_cli_manifest_matches_sha256sum(tmp_path):
    src = make_model(tmp_path / "src")
    ours = subprocess.run([str(LAUNCHER), "manifest", str(src)], capture_output=True, text=True, check=True).stdout
    theirs = subprocess.run("sha256sum *", shell=True, cwd=src, capture_output=True, text=True, check=True).stdout
    assert sorted(ours.splitlines()) == sorted(theirs.splitlines())


# ----------------------------------------------------------------- the package on hosts


def test_engine_files_of_the_role_are_the_package_modules():
    """vars/main.yml names every module the install action writes (the converged record lists them)."""
    import yaml

    listed = yaml.safe_load((ROOT / "roles/model_sync/vars/main.yml").read_text())["_model_sync_engine_files"]
    assert sorted(listed) == sorted(install.package_sources())
    assert sorted(listed) == sorted(p.name for p in PACKAGE.glob("*.py"))


def test_install_writes_the_package_once_and_removes_the_single_file_engine(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "model_sync.py").write_text("# the engine of earlier versions\n")
    (lib / "model_sync_lib").mkdir()  # the package of earlier versions, under a name of its own
    (lib / "model_sync_lib" / "cli.py").write_text("# an earlier version\n")
    owner = {"owner": str(os.getuid()), "group": str(os.getgid()), "reserve_mib": 0}
    first = install.install_engine(Engine(str(lib), state_dir=str(tmp_path / "state"), **owner))
    assert first["changed"] and first["removed"] == [str(lib / "model_sync.py"), str(lib / "model_sync_lib")]
    assert not (lib / "model_sync_lib").exists()
    installed = lib / install.PACKAGE_DIR
    for path in PACKAGE.glob("*.py"):
        assert (installed / path.name).read_bytes() == path.read_bytes()
        assert (installed / path.name).stat().st_mode & 0o777 == 0o644
    again = install.install_engine(Engine(str(lib), state_dir=str(tmp_path / "state"), **owner))
    assert again == {"changed": False, "installed": [], "removed": []}
    (installed / "cli.py").chmod(0o600)
    checked = install.install_engine(Engine(str(lib), state_dir=str(tmp_path / "state"), check=True, **owner))
    assert checked["changed"] and (installed / "cli.py").stat().st_mode & 0o777 == 0o600
    # The launcher as on a host: copied beside the installed package and run through the
    # command's link (tasks/install.yml), so it imports the package from its own directory.
    shutil.copy2(LAUNCHER, lib / "model-sync")
    (tmp_path / "sbin").mkdir()
    (tmp_path / "sbin" / "model-sync").symlink_to(lib / "model-sync")
    (installed / "cli.py").write_text("def main():\n    print('the installed package')\n")
    out = subprocess.run(
        [sys.executable, "-SE", str(tmp_path / "sbin" / "model-sync"), "listing", str(PACKAGE)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert out == "the installed package\n"


def test_hub_helper_runs_as_its_source_and_does_nothing_on_import():
    """fetch_hub passes the helper file's source to python -c; importing it runs nothing."""
    assert fetch_hub.helper_source() == (PACKAGE / "hub_helper.py").read_text()
    proc = subprocess.run(
        [sys.executable, "-IS", "-c", fetch_hub.helper_source(), "info", "a/b", "main", "/x", "1"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "huggingface_hub" in proc.stderr.splitlines()[-1]


def test_the_hub_helper_imports_nothing_from_the_current_directory(tmp_path, monkeypatch):
    """Root runs the helper with python -c, which puts the current directory first on sys.path: a
    huggingface_hub planted there by whoever can write it must not be imported (issue 51, item 6)."""
    planted = tmp_path / "cwd" / "huggingface_hub"
    planted.mkdir(parents=True)
    marker = tmp_path / "ran-as-root"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(planted.parent)
    eng = type(
        "Eng",
        (),
        {"hub_python": sys.executable, "hf_token": None, "hub_endpoint": "http://127.0.0.1:9", "workers": 1,
         "source": {"repo_id": "a/b", "revision": "main"}, "incoming": str(tmp_path / "incoming")},
    )()  # fmt: skip
    with pytest.raises(SyncError):
        fetch_hub.run_hub_helper(eng, "info")
    assert not marker.exists(), "the helper imported the current directory's huggingface_hub"
