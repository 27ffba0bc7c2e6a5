"""Test stand-in for a CUDA-only torchvision wheel on a CPU-only torch (loaded from a .pth file).

PyPI's torchvision 0.28.0 is a CUDA build. On a CPU-only build of torch its compiled operators cannot
load, and importing it fails with ``operator torchvision::nms does not exist``. SGLang imports
torchvision at start-up (multimodal configs) and never runs a vision op on these tests' text model. So,
on a CPU-only torch, just before torchvision is first imported, the two operator schemas its import
checks are declared (no implementation: calling them would fail).

On PyPI's default torch (a CUDA build, which also runs on a machine without a GPU) torchvision's own
operators load and define those schemas themselves; declaring them first would make that second
definition abort the process. There the stand-in steps aside.

A .pth file rather than ``sitecustomize``, because ``opentelemetry-instrument`` puts its own
``sitecustomize`` first on the path. Installed into the SGLang test virtualenv only.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_libraries: list[Any] = []  # a torch.library.Library unregisters its ops when collected


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Declares the schemas when torchvision is about to be imported; imports nothing otherwise."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            if torch.version.cuda is not None:
                return None  # torchvision's compiled operators load on this torch
            lib = torch.library.Library("torchvision", "FRAGMENT")
            for schema in _SCHEMAS:
                lib.define(schema)
            _libraries.append(lib)
        return None  # the regular finders import the real module


def install() -> None:
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
