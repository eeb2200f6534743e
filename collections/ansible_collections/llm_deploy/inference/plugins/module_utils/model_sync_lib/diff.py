"""The Ansible ``diff`` of a result: the current link before, the plan after."""

from __future__ import annotations


def diff_text(result: dict, dest: str) -> dict:
    """Ansible ``diff`` of a result: the current link before and the plan after."""
    plan = result.get("plan") or {}
    sw = plan.get("switch") or {}
    before = f"current -> {sw.get('from')}\n" if sw else ""
    lines = []
    if plan.get("fetch"):
        lines.append(f"fetch {len(plan['fetch'])} file(s), {plan.get('fetch_bytes', 0)} bytes:")
        lines += [f"  + {f['path']} ({f['size']} bytes)" for f in plan["fetch"]]
    lines += [f"  ~ repair {r['path']} ({r['why']})" for r in plan.get("repair", [])]
    lines += [f"  - remove {r}" for r in plan.get("remove", [])]
    if plan.get("link"):
        lines.append(f"stage revisions/{result.get('revision') or '?'} ({len(plan['link'])} hard links)")
    if sw:
        lines.append(f"current -> {sw.get('to')}")
    lines += [f"  - prune {p}" for p in plan.get("prune", [])]
    return {
        "before_header": f"{dest} (before)",
        "after_header": f"{dest} (after)",
        "before": before,
        "after": "\n".join(lines) + ("\n" if lines else ""),
    }
