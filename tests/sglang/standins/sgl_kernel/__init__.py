"""A test stand-in for SGLang's ``sgl_kernel`` on CPUs without AMX (not the real package).

PyPI has only CUDA builds of ``sgl_kernel``. With ``SGLANG_USE_CPU_ENGINE=1`` SGLang 0.5.23 imports it
for one kernel on this machine type (AMD EPYC, AVX-512, no AMX), where every model layer takes SGLang's
plain-torch path: ``assign_req_to_token_pool_cpu``, written here in torch. SGLang imports a few more
names at module level; any other name is a function that raises NotImplementedError when called, so a
code path that needs a real kernel fails loudly instead of computing nonsense.
"""

from __future__ import annotations

from typing import Any

import torch

STAND_IN = True  # the tests check this, so a run never mistakes the stand-in for the real kernels


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For each request row, write its new KV-cache locations into ``req_to_token[row, start:end]``.

    ``out_cache_loc`` holds the new locations of all rows back to back, in row order.
    """
    del pool_len  # the row length of req_to_token; torch's slicing checks the bounds itself
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name}: the test stand-in implements only assign_req_to_token_pool_cpu"
        )

    missing.__name__ = name
    return missing
