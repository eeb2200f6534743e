"""inference_server's tasks/validate.yml runs the engine's check as root: nothing it runs may come
from a directory the service account can write (issue 44, item 2).

The real check on the CPU: the role's plan.yml and validate.yml through ansible-playbook on localhost (in
check mode, which runs the check and keeps its record out of the shared CPU venv), with a plan
of the CPU profile (``transformers serve``, trust_remote_code) for a copy of the tiny model whose
config.json names its own config class (``auto_map``). The service account (``nobody``) owns the
cache and state directories the plan points the caches at, and has put there:

* in ``HF_HOME/modules``, where transformers copies the model's code before importing it, a file
  of the same name, size and modification time as the model's, which transformers' shallow
  comparison takes for the same, so it imports the account's instead;
* under the state directory, a ``sitecustomize.py`` where ``PYTHONPATH`` (from
  ``inference_server_environment``) points, which Python imports when it starts.

Either writes a marker that only root can write. Neither may appear; the check must still pass.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
from rehearsal_engine import CACHE, MODEL
from role_files import run_role_tasks, task_results

CPU_VENV = CACHE / "venvs" / "transformers-cpu"
SERVICE_IDS = (65534, 65534)  # nobody:nogroup
MODEL_NAME = "tinyremote"  # a Python identifier: transformers names its module cache after it
GENUINE = (
    "from transformers import PretrainedConfig\n\n\nclass RemoteConfig(PretrainedConfig):\n"
    '    """The model\'s own config class (auto_map)."""\n\n    model_type = "qwen3_5_text"\n'
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as the deploy runs the check")


@pytest.fixture
def base(searchable_tmp: Path) -> Path:
    """A directory every account can search: the model (root's), the service's state and cache (nobody's)."""
    for name in ("state", "cache"):
        (searchable_tmp / name).mkdir(mode=0o750)
        os.chown(searchable_tmp / name, *SERVICE_IDS)
    (searchable_tmp / "controller").mkdir()
    return searchable_tmp


def remote_code_model(base: Path) -> Path:
    """A copy of the tiny model whose config.json names its own config class (auto_map)."""
    model = base / "models" / MODEL_NAME
    shutil.copytree(MODEL, model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "remote_config.RemoteConfig"}
    (model / "config.json").write_text(json.dumps(config, indent=2))
    (model / "remote_config.py").write_text(GENUINE)
    return model


def as_the_service(path: Path, text: str, top: Path) -> None:
    """Write ``text`` at ``path`` as the service account would: the file and each directory up to ``top``, nobody's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    for made in [path, *path.parents]:
        os.chown(made, *SERVICE_IDS)
        if made == top:
            break


def plant(base: Path, model: Path) -> tuple[Path, Path]:
    """The service account's two traps; the markers they would write (as root only could)."""
    modules, imported = base / "marker-modules", base / "marker-sitecustomize"
    module_copy = base / "cache" / "huggingface" / "modules" / "transformers_modules" / MODEL_NAME / "remote_config.py"
    trap = f"import pathlib\npathlib.Path({str(modules)!r}).write_text('root ran the account code')\n" + GENUINE
    genuine = model / "remote_config.py"
    padding = len(GENUINE) + 200 - len(trap)
    genuine.write_text(GENUINE + "#" * 199 + "\n")
    as_the_service(module_copy, trap + "#" * (padding - 1) + "\n", base / "cache")
    st = genuine.stat()
    os.utime(module_copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert module_copy.stat().st_size == st.st_size, "the trap must look like the model's file to a shallow compare"
    sitecustomize = f"import pathlib\npathlib.Path({str(imported)!r}).write_text('root imported the account code')\n"
    as_the_service(base / "state" / "python" / "sitecustomize.py", sitecustomize, base / "state")
    return modules, imported


def test_the_engines_check_runs_no_code_the_service_account_put_in_its_directories(base):
    model = remote_code_model(base)
    markers = plant(base, model)
    unit = f"check-caches-{uuid.uuid4().hex[:8]}"
    variables = {
        "inference_server_engine": "transformers",
        "inference_server_unit_name": unit,
        "inference_server_trust_remote_code": True,
        "inference_server_environment": {"PYTHONPATH": str(base / "state" / "python")},
        "inference_server_state_dir": str(base / "state"),
        "inference_server_cache_dir": str(base / "cache"),
        "ml_env_venv_dir": str(CPU_VENV),
        "ml_env_engine_version": "5.6.0",
        "model_sync_model_dir": str(model),
        "model_sync_config": json.loads((model / "config.json").read_text()),
        "preflight_gpus": [],
    }
    run = run_role_tasks(
        base / "controller", variables, ["plan.yml", "validate.yml"], check_mode=True, json_output=True
    )
    ran = [marker.name for marker in markers if marker.exists()]
    assert not ran, f"root ran code the service account put in its directories: {ran}"
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    checked = dict(task_results(run))[
        "inference_server : Check the launch plan with the engine's own parser in the target venv"
    ]
    assert json.loads(checked["stdout"])["status"] == "passed", checked
    assert json.loads(checked["stdout"])["resolved"]["trust_remote_code"] is True
    assert not glob.glob(f"/tmp/{unit}*"), "the check's root-only caches were not removed"
