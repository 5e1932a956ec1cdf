"""nvfp4compat: NVFP4 KV-cache compatibility for vLLM and FlashInfer.

A declarative capability matrix (``matrix/*.yaml``), a pure resolver that binds one
implementation (native, FlashInfer, Triton) per operation, and a vLLM plugin that applies the
plan.

Public API::

    import nvfp4compat
    plan = nvfp4compat.query(arch="sm_90", flashinfer="0.6.14", vllm="0.26.0")
    print(plan.render_text())
    plan = nvfp4compat.resolve(nvfp4compat.load_matrix(), nvfp4compat.detect())
"""

from nvfp4compat._version import __version__
from nvfp4compat.api import query
from nvfp4compat.facts import SystemFacts, detect
from nvfp4compat.loader import MatrixError, load_matrix
from nvfp4compat.plan import Binding, Plan, TraceEntry, VllmPlan
from nvfp4compat.resolver import ResolutionError, resolve
from nvfp4compat.versions import VersionError

__all__ = [
    "Binding",
    "MatrixError",
    "Plan",
    "ResolutionError",
    "SystemFacts",
    "TraceEntry",
    "VersionError",
    "VllmPlan",
    "__version__",
    "detect",
    "load_matrix",
    "query",
    "resolve",
]
