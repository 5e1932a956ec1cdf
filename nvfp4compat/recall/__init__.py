"""Needle recall with a small trained model: the task, the torch model, the evaluation.

- :mod:`nvfp4compat.recall.task` (pure Python): vocabulary layout, needle prompts, training batches,
  exact-match scoring. The single source of truth for ``scripts/train_recall_model.py``, the torch
  evaluation and the vLLM job.
- :mod:`nvfp4compat.recall.model` (torch): a Qwen3ForCausalLM with a pluggable attention core.
- :mod:`nvfp4compat.recall.evaluate` (torch, kernels): recall dense (bf16), through the paged NVFP4
  kernels (``triton`` / ``flashinfer``), or through the reference codec (``nvfp4-fake``).
- ``python -m nvfp4compat.recall --model DIR ...``: the command line (see ``docs/recall.md``).

Importing this package imports no torch: only :mod:`~nvfp4compat.recall.task` is loaded here.
"""

from __future__ import annotations

from nvfp4compat.recall.task import (
    DEPTHS,
    NeedlePrompt,
    VocabLayout,
    exact_match,
    make_needle_prompts,
    score,
)

__all__ = ["DEPTHS", "NeedlePrompt", "VocabLayout", "exact_match", "make_needle_prompts", "score"]
