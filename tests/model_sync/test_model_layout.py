"""tools/deploytools/model_layout.py: the one derivation of where model_sync serves a model from."""

from __future__ import annotations

import pytest
from deploytools.model_layout import model_current_link, model_serving_path


@pytest.mark.parametrize(
    ("source", "root", "name", "link", "serving"),
    [
        ({"type": "hub", "repo_id": "Qwen/Qwen3.6-27B"}, "/srv/models", "qwen", "/srv/models/qwen/current", None),
        ({"type": "mirror", "host": "m"}, "/srv/models///", "qwen", "/srv/models/qwen/current", None),
        ({"type": "controller_dir", "path": "/c/m"}, "/", "tiny", "/tiny/current", None),
        ({"type": "host_path", "path": "/data/qwen"}, "/srv/models", "qwen", "", "/data/qwen"),
        ({}, "/srv/models", "", "", ""),
    ],
)
def test_serving_path_is_the_current_link_unless_the_source_is_used_where_it_is(
    source: dict, root: str, name: str, link: str, serving: str | None
) -> None:
    assert model_current_link(source, root, name) == link
    assert model_serving_path(source, root, name) == (link if serving is None else serving)


def test_a_synced_source_without_a_root_or_a_name_is_refused() -> None:
    with pytest.raises(ValueError, match="model_sync_root"):
        model_current_link({"type": "hub"}, "", "qwen")
