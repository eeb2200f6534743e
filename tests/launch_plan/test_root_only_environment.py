"""deploytools.launch_plan.common.root_only_environment: the plan's environment for the engine's
check, which root runs, with every path into the service account's directories moved into a
root-only directory (issue 44, item 2; the check itself: tests/roles/test_check_caches.py)."""

from __future__ import annotations

from deploytools.launch_plan.common import cache_env, root_only_environment

DIRS = {"state": "/var/lib/inference-server", "cache": "/var/cache/inference-server"}


def test_every_cache_of_the_plan_moves_into_the_root_only_directory():
    env = {**cache_env("sglang", DIRS["cache"]), "HF_HUB_OFFLINE": "1"}
    moved = root_only_environment(env, "/tmp/check.x", DIRS)
    assert moved["HF_HOME"] == "/tmp/check.x/cache/huggingface"
    assert moved["XDG_CACHE_HOME"] == "/tmp/check.x/cache"
    assert moved["FLASHINFER_WORKSPACE_BASE"] == "/tmp/check.x/cache"
    assert moved["HF_HUB_OFFLINE"] == "1"
    assert not [value for value in moved.values() if "/var/" in value]


def test_a_list_a_nested_directory_and_a_lookalike():
    dirs = {**DIRS, "cache": "/var/lib/inference-server/cache/"}
    env = {
        "PYTHONPATH": "/opt/lib:/var/lib/inference-server/py:/var/lib/inference-server-deploy/x",
        "TRITON_CACHE_DIR": "/var/lib/inference-server/cache//triton",
        "HOME": "/var/lib/inference-server",
        "ESCAPE": "/var/lib/inference-server/../inference-server/py",
    }
    assert root_only_environment(env, "/tmp/c", dirs) == {
        "PYTHONPATH": "/opt/lib:/tmp/c/state/py:/var/lib/inference-server-deploy/x",
        "TRITON_CACHE_DIR": "/tmp/c/cache/triton",
        "HOME": "/tmp/c/state",
        "ESCAPE": "/tmp/c/state/py",
    }
