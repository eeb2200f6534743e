"""Fetcher of a pinned Hugging Face Hub revision, through ``hub_helper`` in the target venv."""

from __future__ import annotations

import os

from . import hub_helper
from .common import SyncError, json_module
from .fs import scan

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing pulls in re (start-up time)
if TYPE_CHECKING:
    from .base import EngineBase


def helper_source() -> str:
    """The helper program's source, from wherever this package was loaded (a directory or AnsiballZ's zip)."""
    source = hub_helper.__loader__.get_source(hub_helper.__name__)
    if not source:
        raise SyncError(f"the source of {hub_helper.__name__} is not readable; reinstall the model_sync engine.")
    return source


def run_hub_helper(eng: EngineBase, mode: str) -> str:
    """Run the huggingface_hub helper in the target venv; the token travels in its environment."""
    import subprocess

    python = eng.hub_python or "python3"
    if not os.path.exists(python):
        raise SyncError(
            f"model_sync_hub_python {python} does not exist; "
            "install the venv (ml_env) first or set model_sync_hub_python."
        )
    env = dict(os.environ)
    env.pop("HF_TOKEN", None)
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if eng.hf_token:
        env["MODEL_SYNC_HF_TOKEN"] = eng.hf_token
    if eng.hub_endpoint:
        env["HF_ENDPOINT"] = eng.hub_endpoint
    src = eng.source
    revision = str(src.get("revision") or "main")
    # -I: root runs it, so nothing from the current directory (first on sys.path for -c), PYTHON*
    # variables or a user's site-packages may be imported in place of huggingface_hub.
    argv = [python, "-I", "-c", helper_source(), mode, src["repo_id"], revision, eng.incoming, str(eng.workers)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no error output"]
        msg = tail[0]
        if eng.hf_token:
            msg = msg.replace(eng.hf_token, "********")
        raise SyncError(
            hub_failure(msg, src["repo_id"], str(src.get("revision")), mode, bool(eng.hf_token), eng.incoming)
        )
    return proc.stdout


def fetch_hub(eng: EngineBase) -> tuple[str, dict[str, str]]:
    """Download a pinned Hub revision into .incoming; returns the commit sha and expected sha256."""
    info = json_module().loads(run_hub_helper(eng, "info"))
    have = scan(eng.incoming)
    expected = {f["path"]: f["sha256"] for f in info["files"] if f.get("sha256")}
    pending = {}
    for f in info["files"]:
        st = have.get(f["path"])
        if st is None or st.st_size != f["size"] or (f.get("sha256") and eng.state.lookup(st) != f["sha256"]):
            pending[f["path"]] = {"size": f["size"]}
    eng.plan_fetch(pending)
    eng.check_space(eng.plan["fetch_bytes"])
    eng.remove_extra({f["path"] for f in info["files"]})
    if not eng.check and pending:
        eng.makedirs(eng.incoming)
        run_hub_helper(eng, "download")
        eng.counter.add("bytes_fetched", eng.plan["fetch_bytes"])
        eng.changed = True
    return info.get("sha") or "", expected


def hub_failure(line: str, repo: str, revision: str, mode: str, have_token: bool, incoming: str) -> str:
    """One sentence for a failed Hub call, from the helper's last stderr line.

    A refusal (HTTP 401/403, a gated or unknown repo) names model_sync_hf_token and what to
    do with it; anything else quotes huggingface_hub's own first line.
    """
    try:
        err = json_module().loads(line)
    except ValueError:
        err = None
    if not isinstance(err, dict) or "hub_error" not in err:
        err = {"hub_error": "", "status": None, "message": line}
    kind, status, text = err.get("hub_error") or "", err.get("status"), err.get("message") or "no error output"
    after = (
        "nothing was downloaded" if mode == "info" else f"partial downloads stay in {incoming} and the next run resumes"
    )
    where = f"{repo}@{revision}"
    if kind == "RevisionNotFoundError":
        return (
            f"the Hub has no revision {revision} of {repo}: set model_sync_source.revision to a commit of it; {after}."
        )
    refused = kind in ("GatedRepoError", "RepositoryNotFoundError") or status in (401, 403)
    if refused:
        why = (f"HTTP {status}, " if status else "") + (
            "a gated repo" if kind == "GatedRepoError" else "not found, private or gated"
        )
        if not have_token:
            return (
                f"the Hub refused {where} ({why}) and model_sync_hf_token is empty: put a token whose account "
                f"has been granted access to {repo} in model_sync_hf_token (vaulted); {after}."
            )
        return (
            f"the Hub refused {where} ({why}) with the token in model_sync_hf_token: grant that token's account "
            f"access to {repo} on the Hub, or use another token; {after}."
        )
    what = "read the file list of" if mode == "info" else "download"
    return f"huggingface_hub could not {what} {where}: {text[-400:]}; {after}."
