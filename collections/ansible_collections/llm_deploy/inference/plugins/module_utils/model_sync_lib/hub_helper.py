"""The Hugging Face Hub helper: run by ``fetch_hub`` as ``python -c <this file> ...`` in the target venv.

It is a program of its own: it needs ``huggingface_hub``, which only the target venv has, so
it imports nothing from the engine and the engine never runs it in its own interpreter.
Importing this module (AnsiballZ ships it because ``fetch_hub`` imports it) does nothing.

    python -c <source> info|download REPO_ID REVISION LOCAL_DIR WORKERS

``info`` prints ``{"sha": ..., "files": [{"path", "size", "sha256"}]}``; ``download`` runs
``snapshot_download`` into LOCAL_DIR. The token comes in ``MODEL_SYNC_HF_TOKEN`` (removed from
the environment at once). A failure prints one JSON line ``{"hub_error", "status", "message"}``
on stderr and exits 1.
"""


def main() -> None:
    """Answer ``info`` or ``download`` for the command line's repo and revision."""
    import json
    import os
    import sys

    from huggingface_hub import HfApi, snapshot_download

    mode, repo, rev, local_dir, workers = sys.argv[1:6]
    token = os.environ.pop("MODEL_SYNC_HF_TOKEN", None) or False
    try:
        if mode == "info":
            info = HfApi().model_info(repo, revision=rev, files_metadata=True, token=token)
            files = []
            for s in info.siblings or []:
                lfs = getattr(s, "lfs", None)
                sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
                files.append({"path": s.rfilename, "size": s.size, "sha256": sha})
            print(json.dumps({"sha": info.sha, "files": files}))
        else:
            snapshot_download(repo_id=repo, revision=rev, local_dir=local_dir, token=token, max_workers=int(workers))
    except Exception as exc:
        response = getattr(exc, "response", None)
        first = (str(exc).strip().splitlines() or [""])[0]
        error = {
            "hub_error": type(exc).__name__,
            "status": getattr(response, "status_code", None),
            "message": first[:300],
        }
        print(json.dumps(error), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
