"""Hashed locks in the tools, without network: tools/lock-profile writes the sha256 of the
file pip picked per target from a recorded ``pip install --dry-run --report`` (smg 1.13.0 for
CPython 3.10 and 3.12 on manylinux_2_17_x86_64, tests/tools/fixtures/lock_profile/), and adds
hashes to a lock as it is (``--hash-only``); tools/build-bundle reads hashed locks, downloads
them with ``--require-hashes`` and keeps only wheels whose sha256 the lock lists."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploytools import build_bundle as bb
from deploytools import lock_profile as lp

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lock_profile"
H = {c: "sha256:" + c * 64 for c in "abcdef"}


def recorded() -> dict[str, dict[str, Any]]:
    """The recorded pip reports, by target Python."""
    return {
        py: json.loads((FIXTURES / f"smg-1.13.0-cp{py.replace('.', '')}.json").read_text()) for py in ("3.10", "3.12")
    }


def report_hash(report: dict[str, Any], name: str) -> str:
    item = next(i for i in report["install"] if i["metadata"]["name"] == name)
    return "sha256:" + item["download_info"]["archive_info"]["hashes"]["sha256"]


def test_merge_writes_the_hash_of_each_file_pip_picked_per_target() -> None:
    reports = recorded()
    lines = lp.merge(reports)
    text = lp.render(
        "t", ["smg==1.13.0"], ["3.10", "3.12"], ["manylinux_2_17_x86_64"], "https://x.invalid", lines, Path("x")
    )
    lp.check(text, reports)
    grpcio = next(line for line in lines if line.startswith("grpcio=="))
    cp310, cp312 = report_hash(reports["3.10"], "grpcio"), report_hash(reports["3.12"], "grpcio")
    assert cp310 != cp312  # a binary wheel per Python: the line carries both, sorted
    assert (
        grpcio
        == "\n".join(["grpcio==1.85.3 \\", *(f"    --hash={h} \\" for h in sorted([cp310, cp312]))]).removesuffix(" \\")
        + "\n    # via grpcio-health-checking, smg"
    )
    # A pure wheel (and smg's abi3 one) is the same file for both: one hash.
    assert next(line for line in lines if line.startswith("typing_extensions==")).count("--hash=") == 1
    assert next(line for line in lines if line.startswith("smg==")).endswith("\n    # requested")
    entries = {e.key: e for e in bb.parse_lock_text(text)}
    assert set(entries["grpcio"].hashes) == {cp310, cp312}
    assert entries["grpcio"].via == ("grpcio-health-checking", "smg") and entries["smg"].via == ()
    # The self-check fails when a line lacks the hash of a file pip picks.
    with pytest.raises(bb.BundleError, match=r"grpcio==1\.85\.3 lacks the hash of the file pip picks for Python 3\.12"):
        lp.check(text.replace(cp312, H["a"]), reports)


def test_a_report_without_a_sha256_is_refused_and_a_local_file_is_read(tmp_path: Path) -> None:
    item = {
        "metadata": {"name": "x"},
        "download_info": {"url": "https://x.invalid/x-1-py3-none-any.whl", "archive_info": {}},
    }
    with pytest.raises(bb.BundleError, match="gives no sha256"):
        lp.file_hashes(item)
    wheel = tmp_path / "x-1+cpu-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    item["download_info"] = {"url": wheel.as_uri().replace("+", "%2B"), "archive_info": {}}
    assert lp.file_hashes(item) == {"sha256:" + hashlib.sha256(b"wheel").hexdigest()}
    item["download_info"] = {"url": "https://x.invalid/x", "archive_info": {"hash": "sha256=" + "1" * 64}}
    assert lp.file_hashes(item) == {"sha256:" + "1" * 64}


HASHED = f"""\
# title: sample
# python: 3.10 3.12
app==1.0 \\
    --hash={H["a"]}
    # requested
helper==0.1 ; python_version < "3.11" \\
    --hash={H["b"]} \\
    --hash={H["c"]}
    # via app
helper==0.2 ; python_version >= "3.11" --hash={H["d"]}  # via app
solo==3.0 \\
    --hash {H["e"]}
"""


def test_parse_reads_continued_lines_hashes_markers_and_via() -> None:
    entries = bb.parse_lock_text(HASHED)
    assert [(e.pin, e.marker, e.hashes, e.via) for e in entries] == [
        ("app==1.0", "", (H["a"],), ()),
        ("helper==0.1", 'python_version < "3.11"', (H["b"], H["c"]), ("app",)),
        ("helper==0.2", 'python_version >= "3.11"', (H["d"],), ("app",)),
        ("solo==3.0", "", (H["e"],), ()),
    ]
    # An indented '# via' line after an unhashed pin (the gateway's hand lock) is read too.
    smg = bb.parse_lock_text("grpcio==1.85.3\n    # via smg, grpcio-health-checking\nsmg==1.13.0\n")
    assert smg[0].via == ("smg", "grpcio-health-checking") and smg[1].via == ()
    with pytest.raises(bb.BundleError, match="only option a lock line takes"):
        bb.parse_lock_text("app==1.0 --index-url https://x.invalid\n")
    with pytest.raises(bb.BundleError, match="not --hash=sha256"):
        bb.parse_lock_text("app==1.0 --hash=md5:abc\n")
    with pytest.raises(bb.BundleError, match="not pinned with =="):
        bb.parse_lock_text(f"app>=1.0 \\\n    --hash={H['a']}\n")


def test_with_hashes_changes_nothing_but_the_hashes() -> None:
    hand = (
        "# A hand-written lock.\naccelerate==1.15.0\ntorch==2.13.0+cpu  # the CPU build\n\nsmg==1.13.0\n    # via x\n"
    )
    files = {("accelerate", "1.15.0"): {H["b"], H["a"]}, ("torch", "2.13.0+cpu"): {H["c"]}, ("smg", "1.13.0"): {H["d"]}}
    text = lp.with_hashes(hand, files, "hand.txt")
    assert text == (
        "# A hand-written lock.\n"
        f"accelerate==1.15.0 \\\n    --hash={H['a']} \\\n    --hash={H['b']}\n"
        f"torch==2.13.0+cpu \\\n    --hash={H['c']}\n    # the CPU build\n"
        "\n"
        f"smg==1.13.0 \\\n    --hash={H['d']}\n    # via x\n"
    )
    assert [e.pin for e in bb.parse_lock_text(text)] == [e.pin for e in bb.parse_lock_text(hand)]
    # Run again, the hashes are replaced, not added to.
    assert lp.with_hashes(text, {**files, ("smg", "1.13.0"): {H["e"]}}, "hand.txt") == text.replace(H["d"], H["e"])
    with pytest.raises(bb.BundleError, match="no target of this lock installs smg==1.13.0"):
        lp.with_hashes(hand, {k: v for k, v in files.items() if k[0] != "smg"}, "hand.txt")


def test_hash_only_hashes_a_hand_lock_for_this_machine_and_its_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "smg.txt"
    lock.write_text("# Hand lock.\n# platform: manylinux_2_17_x86_64\ngrpcio==1.85.3\n    # via smg\nsmg==1.13.0\n")
    calls: list[list[str]] = []

    def fake_report(interpreter: str, args: list[str], workdir: Path, what: str, env: Any = None) -> dict[str, Any]:
        calls.append(args)
        native = "--platform" not in args
        pins = Path(args[args.index("-r") + 1]).read_text().split()
        assert pins == ["grpcio==1.85.3", "smg==1.13.0"] and "--no-deps" in args
        files = {"grpcio": H["a"] if native else H["b"], "smg": H["c"]}
        return {
            "install": [
                {
                    "metadata": {"name": p.split("==")[0], "version": p.split("==")[1]},
                    "download_info": {
                        "url": "https://x.invalid/f.whl",
                        "archive_info": {"hashes": {"sha256": files[p.split("==")[0]][7:]}},
                    },
                }
                for p in pins
            ]
        }

    monkeypatch.setattr(lp, "run_report", fake_report)
    assert lp.main(["--hash-only", str(lock)]) == 0
    assert len(calls) == 2 and "--platform" not in calls[0] and "manylinux_2_17_x86_64" in calls[1]
    assert "--index-url" not in calls[0]  # a lock without '# index:' is hashed with this machine's pip configuration
    entries = {e.key: e for e in bb.parse_lock_text(lock.read_text())}
    assert entries["grpcio"].hashes == (H["a"], H["b"]) and entries["smg"].hashes == (H["c"],)
    assert entries["grpcio"].via == ("smg",)


def test_keep_pins_refuses_a_resolution_that_moves_a_version() -> None:
    old = bb.parse_lock_text(HASHED)
    reports = {
        "3.10": {
            "install": [
                {"metadata": {"name": "app", "version": "1.0"}},
                {"metadata": {"name": "helper", "version": "0.1"}},
                {"metadata": {"name": "solo", "version": "3.0"}},
            ]
        },
        "3.12": {
            "install": [
                {"metadata": {"name": "app", "version": "1.0"}},
                {"metadata": {"name": "helper", "version": "0.3"}},
                {"metadata": {"name": "solo", "version": "3.0"}},
            ]
        },
    }
    with pytest.raises(
        bb.BundleError, match=r"other versions for Python 3\.12: \[\('helper', '0\.2'\), \('helper', '0\.3'\)\]"
    ):
        lp.held_pins(old, reports, "lock.txt")
    reports["3.12"]["install"][1]["metadata"]["version"] = "0.2"
    lp.held_pins(old, reports, "lock.txt")


# --------------------------------------------------------------------------------------
# build-bundle
# --------------------------------------------------------------------------------------


def test_build_bundle_downloads_a_hashed_lock_with_require_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen["cmd"] = cmd
        seen["requirements"] = Path(cmd[cmd.index("-r") + 1]).read_text() if "-r" in cmd else None
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bb.subprocess, "run", fake_run)
    entries = bb.entries_for_target(bb.parse_lock_text(HASHED), "3.10")
    bb.download(entries, tmp_path, "3.10", ["manylinux_2_34_x86_64"])
    assert "--require-hashes" in seen["cmd"]
    assert seen["requirements"] == (
        f"app==1.0 --hash={H['a']}\nhelper==0.1 --hash={H['b']} --hash={H['c']}\nsolo==3.0 --hash={H['e']}\n"
    )
    bb.download([bb.LockEntry("app", "1.0")], tmp_path, None, [])
    assert "--require-hashes" not in seen["cmd"] and seen["cmd"][-1] == "app==1.0"
    with pytest.raises(bb.BundleError, match="pins solo==3.0 without --hash while other lines have hashes"):
        bb.download([entries[0], bb.LockEntry("solo", "3.0")], tmp_path, None, [], source="lock.txt")

    def refused(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            cmd, 1, "", "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE."
        )

    monkeypatch.setattr(bb.subprocess, "run", refused)
    with pytest.raises(bb.BundleError, match=r"pip refused wheels whose sha256 is not in lock\.txt"):
        bb.download(entries, tmp_path, "3.10", [], source="lock.txt")


def test_wheels_for_keeps_the_file_whose_hash_the_lock_lists(tmp_path: Path) -> None:
    good, other = (
        tmp_path / "app-1.0-cp310-cp310-manylinux_2_17_x86_64.whl",
        tmp_path / "app-1.0-cp310-cp310-linux_x86_64.whl",
    )
    good.write_bytes(b"good")
    other.write_bytes(b"other")
    good_hash = "sha256:" + hashlib.sha256(b"good").hexdigest()
    assert bb.wheels_for([bb.LockEntry("app", "1.0", hashes=(good_hash,))], tmp_path) == [good]
    assert bb.wheels_for([bb.LockEntry("app", "1.0")], tmp_path) == [other]  # unhashed: the first by name
    with pytest.raises(bb.BundleError, match="holds wheels whose sha256 the lock does not list"):
        bb.wheels_for([bb.LockEntry("app", "1.0", hashes=(H["a"],))], tmp_path)
    bb.write_selection(tmp_path, [bb.LockEntry("app", "1.0", hashes=(good_hash,))], [good], Path("l.txt"), "3.10", [])
    assert (tmp_path / "requirements.txt").read_text().splitlines()[1] == f"app==1.0 --hash={good_hash}"
