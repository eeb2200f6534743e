"""Let PyPI's torchvision import beside a CPU-only torch, in the SGLang check venv only.

Why: ``import sglang`` imports ``torchvision.io.decode_jpeg`` at module level
(sglang/srt/utils/common.py). PyPI ships torchvision only as a CUDA build; its C++
extension (``torchvision/_C.so``) links ``libtorch_cuda.so`` and ``libc10_cuda.so``, which
the CPU torch from /opt/wheels lacks, so torchvision falls back to Python-only mode
(``torchvision.extension._has_ops()`` is False). torchvision 0.28's
``_meta_registrations.py`` then registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms`` without checking ``_has_ops()``, and torch 2.13 refuses a fake kernel
for an operator that was never defined: ``RuntimeError: operator torchvision::nms does
not exist``. No CPU build of torchvision is reachable (download.pytorch.org is not), and
the CUDA torch that would load the extension weighs about 3 GB with its NVIDIA libraries.

What: before torchvision is first imported, and only if its ``_C`` extension cannot be
loaded, declare the schemas of those two operators (exactly as torchvision's C++ code
declares them) without any kernel. torchvision's own Python code then imports unchanged;
its C++ ops stay unavailable, as they would on any host where ``_C`` fails to load.
Nothing SGLang's argument validation runs touches torchvision.

How: ``tools/build-sglang-check-venv`` copies this file into the check venv's
site-packages and adds a ``.pth`` line that calls :func:`install`. The finder costs
nothing until ``torchvision`` is imported. Production venvs never get it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

_KEEP: list[object] = []
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


def _declare_missing_ops(package_dir: Path) -> None:
    """Declare torchvision's unguarded operator schemas when its extension cannot load."""
    import torch

    extension = next(package_dir.glob("_C*.so"), None)
    if extension is not None:
        try:
            torch.ops.load_library(str(extension))
            return  # the real extension works: nothing to do
        except (OSError, RuntimeError):
            pass
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS:
        try:
            library.define(schema)
        except RuntimeError:  # already declared (by a newer torchvision, for example)
            pass
    _KEEP.append(library)  # the declarations live as long as the Library object


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    """Runs :func:`_declare_missing_ops` once, just before ``torchvision`` is imported."""

    done = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """Never finds a module itself; only prepares torch for torchvision."""
        if fullname != "torchvision" or self.done:
            return None
        type(self).done = True
        spec = importlib.machinery.PathFinder.find_spec("torchvision")
        if spec is not None and spec.submodule_search_locations:
            _declare_missing_ops(Path(next(iter(spec.submodule_search_locations))))
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionFinder())
