"""Every module and plugin of the roles carries documentation ansible-doc can read.

ansible-doc refuses a module whose DOCUMENTATION is not valid YAML (a ``: `` inside a plain
description line is enough), so each block is parsed here the way ansible-doc parses it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = sorted(
    p
    for pattern in ("roles/*/library/*.py", "roles/*/lookup_plugins/*.py", "filter_plugins/*.py")
    for p in ROOT.glob(pattern)
)


def doc_blocks(path: Path) -> dict[str, str]:
    """The DOCUMENTATION, EXAMPLES and RETURN strings of a plugin file."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                    found[target.id] = node.value.value
    return found


@pytest.mark.parametrize("path", [p for p in PLUGINS if "library" in p.parts], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_documents_itself_in_yaml_ansible_doc_reads(path):
    blocks = doc_blocks(path)
    assert set(blocks) >= {"DOCUMENTATION", "EXAMPLES", "RETURN"}, (
        f"{path.name} lacks {set(blocks) ^ {'DOCUMENTATION', 'EXAMPLES', 'RETURN'}}"
    )
    doc = yaml.safe_load(blocks["DOCUMENTATION"])
    assert doc["module"] == path.stem and doc["short_description"] and doc["description"]
    yaml.safe_load(blocks["EXAMPLES"])
    yaml.safe_load(blocks["RETURN"])


@pytest.mark.parametrize(
    "path", [p for p in PLUGINS if "library" not in p.parts], ids=lambda p: str(p.relative_to(ROOT))
)
def test_documentation_of_other_plugins_is_valid_yaml(path):
    for name, text in doc_blocks(path).items():
        assert yaml.safe_load(text) is not None, f"{path.name}: {name} is empty"
