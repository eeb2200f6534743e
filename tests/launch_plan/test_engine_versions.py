"""Engine versions as data (tools/deploytools/launch_plan/engines.py and .json): the plan for each
supported SGLang version, known-bad versions refused, and a flag a version renamed written the
way that version spells it.

The flag tables are the versions' own parsers' (test_sglang_validation.py proves each against
its check venv); these tests read the committed tables and the facts file, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from typing import Any

import pytest
from launch_plan_cases import REPO

FLAG_TABLES = REPO / "tools" / "deploytools" / "launch_plan" / "flags"
FACTS = json.loads((REPO / "tools" / "deploytools" / "launch_plan" / "engines.json").read_text())
SUPPORTED = sorted(FACTS["sglang"]["supported"], key=lambda v: tuple(map(int, v.split("."))))


def _plan(launch_plan: Any, qwen_config: dict[str, Any], kwargs: dict[str, Any], version: str) -> dict[str, Any]:
    return launch_plan.build_plan(qwen_config, **dict(kwargs, engine_version=version))


def _flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_every_supported_version_has_its_own_flag_table_and_lock() -> None:
    for version, entry in FACTS["sglang"]["supported"].items():
        table = json.loads((FLAG_TABLES / f"sglang-{version}.json").read_text())
        assert table["version"] == version, f"sglang-{version}.json was dumped from SGLang {table['version']}"
        assert (REPO / "roles" / "ml_env" / "files" / "locks" / f"{entry['lock']}.txt").is_file(), entry["lock"]


@pytest.mark.parametrize("version", ["0.5.13", "0.5.14", "0.5.14.post1"])
def test_known_bad_versions_are_refused_naming_the_upstream_issue(launch_plan, qwen_config, ct129_kwargs, version):
    with pytest.raises(launch_plan.PlanError) as refused:
        _plan(launch_plan, qwen_config, ct129_kwargs, version)
    message = str(refused.value)
    assert message.startswith(f"ml_env_lock gives sglang {version}, which is known to crash with a TypeError in ")
    assert "sgl-project/sglang#27325" in message and "fixed by sgl-project/sglang#27998 in 0.5.15" in message
    assert message.endswith(f"use a supported version ({', '.join(SUPPORTED)}).")
    assert message.count(". ") == 0, "one sentence"


def test_a_known_bad_version_is_refused_only_for_the_launch_it_breaks(launch_plan, qwen_config, ct129_kwargs):
    """0.5.13's crash needs a hybrid model with speculative decoding: without it, the version plans."""
    settings = {k: v for k, v in ct129_kwargs["settings"].items() if not k.startswith("speculative_")}
    plan = _plan(launch_plan, qwen_config, dict(ct129_kwargs, settings=settings), "0.5.13")
    assert "--speculative-algorithm" not in plan["argv"]
    assert any("sglang 0.5.13 is not a version the project tests" in note for note in plan["notes"])


@pytest.mark.parametrize("version", ["0.5.12", "0.5.15"])
def test_the_versions_around_the_known_bad_range_are_not_refused(launch_plan, qwen_config, ct129_kwargs, version):
    plan = _plan(launch_plan, qwen_config, ct129_kwargs, version)
    assert plan["argv"][1] == "serve"


@pytest.mark.parametrize("version", SUPPORTED)
def test_each_supported_version_gets_its_own_environment_and_flag_names(
    launch_plan, qwen_config, ct129_kwargs, version
):
    """SGLANG_ENABLE_SPEC_V2 is wanted before 0.5.15 and gone after; the mamba strategy flag is
    spelled as the version's own table spells it (read from the table, not from this test)."""
    plan = _plan(launch_plan, qwen_config, ct129_kwargs, version)
    table = json.loads((FLAG_TABLES / f"sglang-{version}.json").read_text())["flags"]
    old = table.get("--mamba-scheduler-strategy")
    # Renamed with the old name kept as a deprecated alias (0.5.15-0.5.22), or dropped (0.5.23).
    renamed = old is None or (old["deprecated"] and old["replacement"] in table)
    wanted = "--mamba-radix-cache-strategy" if renamed else "--mamba-scheduler-strategy"
    assert wanted in table
    assert _flag_value(plan["argv"], wanted) == "extra_buffer"
    assert not renamed or "--mamba-scheduler-strategy" not in plan["argv"]
    removed = "SGLANG_ENABLE_SPEC_V2" in sum(
        (c.get("removes_environment", []) for c in FACTS["sglang"]["changes"] if _v(c["since"]) <= _v(version)), []
    )
    assert ("SGLANG_ENABLE_SPEC_V2" in plan["env"]) is not removed
    assert any(note.startswith(f"sglang {version} is a supported version; memory budget: ") for note in plan["notes"])
    for flag in plan["argv"]:
        if flag.startswith("--"):
            assert flag in table and not table[flag]["deprecated"], f"{flag} is not a current flag of {version}"


def test_a_renamed_flag_given_by_its_old_name_in_overrides_is_refused_with_the_new_one(
    launch_plan, qwen_config, ct129_kwargs
):
    tables = {v: json.loads((FLAG_TABLES / f"sglang-{v}.json").read_text())["flags"] for v in SUPPORTED}
    aliased = [v for v in SUPPORTED if tables[v].get("--mamba-scheduler-strategy", {}).get("deprecated")]
    dropped = [v for v in SUPPORTED if "--mamba-scheduler-strategy" not in tables[v]]
    assert aliased and dropped, "no supported version renames --mamba-scheduler-strategy: nothing to check"
    overrides = {"--mamba-scheduler-strategy": "extra_buffer"}
    with pytest.raises(launch_plan.PlanError, match=r"deprecated in sglang .*, use --mamba-radix-cache-strategy"):
        _plan(launch_plan, qwen_config, dict(ct129_kwargs, overrides=overrides), aliased[0])
    with pytest.raises(launch_plan.PlanError) as gone:
        _plan(launch_plan, qwen_config, dict(ct129_kwargs, overrides=overrides), dropped[0])
    assert str(gone.value) == (
        f"inference_server_overrides['--mamba-scheduler-strategy']: sglang {dropped[0]} has no flag "
        "--mamba-scheduler-strategy, which became --mamba-radix-cache-strategy: use that name."
    )


def test_an_environment_variable_a_version_removed_is_named_in_the_notes(launch_plan, qwen_config, ct129_kwargs):
    newest = SUPPORTED[-1]
    kwargs = dict(ct129_kwargs, environment={"SGLANG_ENABLE_SPEC_V2": "1"})
    plan = _plan(launch_plan, qwen_config, kwargs, newest)
    assert (
        f"inference_server_environment sets SGLANG_ENABLE_SPEC_V2, which SGLang {newest} no longer reads: remove it"
        in (plan["notes"])
    )


def test_the_origin_flags_on_a_version_whose_auto_strategy_is_extra_buffer_are_refused_for_the_trio_only(
    launch_plan, qwen_config, ct129_kwargs
):
    """From 0.5.17 no strategy means extra_buffer; the seed's lone --speculative-num-draft-tokens 1
    is still refused (0.5.17 stops with a bare AssertionError there)."""
    from launch_plan_cases import ORIGIN_OVERRIDES

    kwargs = dict(ct129_kwargs, settings={}, overrides=ORIGIN_OVERRIDES)
    with pytest.raises(launch_plan.PlanError) as old:
        _plan(launch_plan, qwen_config, kwargs, "0.5.11")
    assert "needs --mamba-scheduler-strategy extra_buffer and SGLANG_ENABLE_SPEC_V2=1" in str(old.value)
    with pytest.raises(launch_plan.PlanError) as new:
        _plan(launch_plan, qwen_config, kwargs, "0.5.17")
    assert "without --speculative-num-steps and --speculative-eagle-topk" in str(new.value)


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


# --------------------------------------------------------------------------------------
# tools/launch-plan HOST --engine-version: the candidate beside the running plan
# --------------------------------------------------------------------------------------


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "tools" / "launch-plan"), *args], capture_output=True, text=True, check=False, env=dict(os.environ)
    )


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_tool_prints_each_supported_candidate_beside_the_running_plan(version):
    proc = _tool("ct129", "--engine-version", version, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    running, candidate, diff = result["running"]["plan"], result["candidate"]["plan"], result["diff"]
    lock = FACTS["sglang"]["supported"][version]["lock"]
    lock_sha = hashlib.sha256((REPO / "roles/ml_env/files/locks" / f"{lock}.txt").read_bytes()).hexdigest()[:12]
    assert candidate["argv"][0] == f"/opt/ml-env.d/{lock_sha}/bin/sglang"
    # Every flag that differs is one of the two plans' own words, nothing else.
    for flag, (old, new) in diff["flags"].items():
        assert (old is None) == (flag not in running["argv"]) and (new is None) == (flag not in candidate["argv"])
    assert ("SGLANG_ENABLE_SPEC_V2" in diff["env"]) == (("SGLANG_ENABLE_SPEC_V2" in candidate["env"]) is False)
    for key, (old, new) in diff["budget"].items():
        assert old == running["budget"].get(key) and new == candidate["budget"].get(key)
    assert any(f"sglang {version} is a supported version" in note for note in diff["notes"]) == (version != "0.5.11")


@pytest.mark.parametrize("version", ["0.5.13", "0.5.14"])
def test_the_tool_refuses_a_known_bad_candidate(version):
    proc = _tool("ct129", "--engine-version", version)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"launch-plan: SGLang {version} is not a supported version")
    assert lines[1].startswith(
        f"launch-plan: ct129 (the candidate plan): ml_env_lock gives sglang {version}, which is "
    )
    assert "sgl-project/sglang#27998" in lines[1]
    assert proc.stdout == ""


def test_the_tool_prints_the_differences_for_a_person():
    proc = _tool("ct129", "--engine-version", "0.5.17")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("ct129: candidate SGLang 0.5.17 (lock sglang-0.5.17) beside the running plan\n")
    assert "  --mamba-scheduler-strategy: extra_buffer -> (absent)\n" in out
    assert "  --mamba-radix-cache-strategy: (absent) -> extra_buffer\n" in out
    assert "  SGLANG_ENABLE_SPEC_V2: 1 -> (absent)\n" in out
    assert "Memory budget per GPU" in out and "effective running requests" in out
