"""The Hub's refusals as one sentence naming model_sync_hf_token (model_sync's hub_failure).

The helper that talks to the Hub (huggingface_hub in the target venv) prints its error as
one JSON line on stderr; these are the lines huggingface_hub's exceptions produce for a gated
repo (401 ``X-Error-Code: GatedRepo``), an unknown or private repo, a wrong revision and a
network failure. tests/model_sync/test_model_sync_role.py and the molecule scenario ``reliability`` run
the helper for real against local stand-ins of the Hub.
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib.fetch_hub import hub_failure

REPO, REV, INCOMING = "Qwen/Qwen3.6-27B", "a" * 40, "/srv/models/q/.incoming"


def line(kind: str, status, message: str = "boom") -> str:
    """The helper's last stderr line."""
    return json.dumps({"hub_error": kind, "status": status, "message": message})


@pytest.mark.parametrize(
    "kind, status, token, mode, expected",
    [
        (
            "GatedRepoError",
            401,
            False,
            "info",
            f"the Hub refused {REPO}@{REV} (HTTP 401, a gated repo) and model_sync_hf_token is empty: "
            f"put a token whose account has been granted access to {REPO} in model_sync_hf_token (vaulted); "
            "nothing was downloaded.",
        ),
        (
            "GatedRepoError",
            403,
            True,
            "info",
            f"the Hub refused {REPO}@{REV} (HTTP 403, a gated repo) with the token in model_sync_hf_token: grant that "
            f"token's account access to {REPO} on the Hub, or use another token; nothing was downloaded.",
        ),
        (
            "RepositoryNotFoundError",
            401,
            False,
            "download",
            f"the Hub refused {REPO}@{REV} (HTTP 401, not found, private or gated) and model_sync_hf_token "
            f"is empty: put a token whose account has been granted access to {REPO} in model_sync_hf_token "
            f"(vaulted); partial downloads stay in {INCOMING} and the next run resumes.",
        ),
        (
            "RevisionNotFoundError",
            404,
            True,
            "info",
            f"the Hub has no revision {REV} of {REPO}: set model_sync_source.revision to a commit of it; nothing was "
            "downloaded.",
        ),
        (
            "ConnectionError",
            None,
            False,
            "info",
            f"huggingface_hub could not read the file list of {REPO}@{REV}: boom; nothing was downloaded.",
        ),
    ],
)
def test_each_refusal_is_one_sentence(kind, status, token, mode, expected):
    assert hub_failure(line(kind, status), REPO, REV, mode, token, INCOMING) == expected


def test_a_line_that_is_not_json_is_quoted():
    got = hub_failure("Traceback: something odd", REPO, REV, "download", False, INCOMING)
    assert got == (
        f"huggingface_hub could not download {REPO}@{REV}: Traceback: something odd; partial downloads "
        f"stay in {INCOMING} and the next run resumes."
    )
