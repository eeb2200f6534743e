"""Checks of a model directory: manifests, safetensors headers, the model check, labels."""

from __future__ import annotations

import os

from .common import INDEX_NAME, PARTIAL, SINGLE_NAME, SyncError, json_module


def read_manifest_file(path: str) -> dict[str, str]:
    """Parse a ``sha256sum``-style manifest (``<hex>  <path>``) into path -> sha256."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 1)
            if len(parts) != 2 or len(parts[0]) != 64:
                raise SyncError(f"{path} line {lineno} is not '<sha256>  <file>'; fix the mirror's manifest.")
            name = parts[1].lstrip("*").strip()
            if name.startswith("./"):
                name = name[2:]
            out[name] = parts[0].lower()
    return out


def safetensors_size(path: str) -> int | None:
    """File size implied by a safetensors header (8 + header + data), or None if unreadable."""
    import struct

    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                return None
            (n,) = struct.unpack("<Q", head)
            if n > 100 << 20:
                return None
            header = json_module().loads(fh.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return 8 + n + end
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _weights(root: str, files: dict[str, os.stat_result], what: str) -> tuple[list[str], int | None]:
    """The weight files of a model and the tensor bytes its index announces (None if unknown)."""
    if INDEX_NAME in files:
        try:
            with open(os.path.join(root, INDEX_NAME), encoding="utf-8") as fh:
                index = json_module().load(fh)
            weights = sorted(set(index["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SyncError(f"{INDEX_NAME} in {what} has no usable weight_map.") from None
        missing = [w for w in weights if w not in files]
        if missing:
            raise SyncError(
                f"{what} lacks {len(missing)} weight file(s) named in {INDEX_NAME}: {', '.join(missing[:5])}."
            )
        return weights, (index.get("metadata") or {}).get("total_size")
    if SINGLE_NAME in files:
        return [SINGLE_NAME], None
    raise SyncError(f"{what} has neither {INDEX_NAME} nor {SINGLE_NAME}; no weights to load.")


def check_model(root: str, files: dict[str, os.stat_result], rehashed: set[str], what: str) -> dict:
    """Check that ``files`` form a loadable model; returns config, weight files and notes.

    Raises SyncError naming the missing or wrong file.
    """
    notes: list[str] = []
    if "config.json" not in files:
        raise SyncError(
            f"{what} has no config.json, so it is not a model directory; "
            "point model_sync_source at the directory that holds config.json."
        )
    try:
        with open(os.path.join(root, "config.json"), encoding="utf-8") as fh:
            config = json_module().load(fh)
    except ValueError as exc:
        raise SyncError(f"config.json in {what} is not valid JSON ({exc}).") from None
    weights, total = _weights(root, files, what)
    for w in weights:
        if w in rehashed or total is not None:
            expect = safetensors_size(os.path.join(root, w)) if w in rehashed else None
            if w in rehashed and expect is None:
                raise SyncError(f"{w} in {what} has no readable safetensors header.")
            if expect is not None and expect != files[w].st_size:
                raise SyncError(
                    f"{w} in {what} is {files[w].st_size} bytes but its safetensors header says {expect}; "
                    "the file is truncated or corrupt."
                )
    weights_bytes = sum(files[w].st_size for w in weights)
    if total is not None and weights_bytes < int(total):
        raise SyncError(
            f"weight files in {what} hold {weights_bytes} bytes, less than the {total} bytes of tensors "
            f"{INDEX_NAME} announces."
        )
    return {"config": config, "weights": weights, "weights_bytes": weights_bytes, "notes": notes}


def revision_label(manifest: dict[str, list]) -> str:
    """Content-derived revision label: sha256 over sorted (path, size, sha256), 12 hex digits."""
    import hashlib

    h = hashlib.sha256()
    for rel in sorted(manifest):
        size, digest = manifest[rel]
        h.update(f"{rel}\0{size}\0{digest}\n".encode())
    return h.hexdigest()[:12]


def clean_label(label: str) -> str:
    """Refuse labels that are not a single safe path component."""
    if (
        not label
        or label in (".", "..")
        or "/" in label
        or label.startswith(".")
        or label.endswith(PARTIAL)
        or len(label) > 128
    ):
        raise SyncError(
            f"revision label '{label}' (model_sync_source.revision) is not usable as a directory name; "
            "use letters, digits, '-', '_' or '.'."
        )
    return label
