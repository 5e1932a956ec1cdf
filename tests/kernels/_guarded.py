"""Guard buffers for the memory-safety tests (test_bad_metadata, test_fuzz_metadata).

Every tensor a kernel reads or writes is a view into a larger buffer whose extra rows hold a
sentinel: a write outside the view changes sentinel bytes (checked byte for byte), and a read
outside it picks up values that poison the result (NaN query rows, E4M3 NaN block scales 0x7F),
which the finite-and-equal-to-the-reference checks then catch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4compat.kernels import reference_attention as ra

PAD = 3  # guard rows on each side (pages for the cache, tokens for query/out)
OUT_SENTINEL = 0xA5  # byte pattern of the guard rows of outputs
DATA_SENTINEL = 0x77  # E2M1 codes of the guard pages
SF_SENTINEL = 0x7F  # E4M3 NaN: a guard page that is read makes the output NaN


@dataclass
class Guarded:
    """A view ``t`` of rows ``[PAD, PAD + n)`` of ``big``; ``snapshot`` is ``big``'s bytes at creation."""

    t: torch.Tensor
    big: torch.Tensor
    snapshot: torch.Tensor

    def guards_intact(self) -> bool:
        n = self.t.shape[0]
        now = self.big.view(torch.uint8) if self.big.dtype != torch.uint8 else self.big
        then = self.snapshot
        return torch.equal(now[:PAD], then[:PAD]) and torch.equal(now[PAD + n :], then[PAD + n :])

    def all_bytes(self) -> torch.Tensor:
        return self.big.view(torch.uint8) if self.big.dtype != torch.uint8 else self.big


def guarded(t: torch.Tensor, fill_byte: int | None = None, fill_value: float | None = None) -> Guarded:
    """Copy ``t`` into the middle of a buffer with ``PAD`` sentinel rows on each side (dim 0)."""
    big = torch.empty((t.shape[0] + 2 * PAD, *t.shape[1:]), dtype=t.dtype, device=t.device)
    raw = big.view(torch.uint8) if big.dtype != torch.uint8 else big
    if fill_value is not None:
        big.fill_(fill_value)
    else:
        raw.fill_(OUT_SENTINEL if fill_byte is None else fill_byte)
    big[PAD : PAD + t.shape[0]] = t
    return Guarded(big[PAD : PAD + t.shape[0]], big, raw.clone())


@dataclass
class GuardedCache:
    """A paged case whose cache tensors (tuple form) sit inside guard pages."""

    case: ra.PagedCase
    parts: list[Guarded]  # k_data, v_data, k_sf, v_sf

    @property
    def cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.parts[0].t, self.parts[1].t)

    @property
    def sf(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.parts[2].t, self.parts[3].t)

    def untouched(self) -> bool:
        """No byte of the cache or its guards changed (the attention kernels only read)."""
        return all(torch.equal(p.all_bytes(), p.snapshot) for p in self.parts)


def guard_cache(case: ra.PagedCase) -> GuardedCache:
    """Move a tuple-form case's cache into guard pages (data 0x77, scales 0x7F = NaN)."""
    k, v = case.paged_kv_cache
    ks, vs = case.kv_cache_sf
    parts = [
        guarded(k, DATA_SENTINEL),
        guarded(v, DATA_SENTINEL),
        guarded(ks.view(torch.uint8), SF_SENTINEL),
        guarded(vs.view(torch.uint8), SF_SENTINEL),
    ]
    parts[2].t = parts[2].t.view(torch.float8_e4m3fn)
    parts[3].t = parts[3].t.view(torch.float8_e4m3fn)
    return GuardedCache(case, parts)


def close_to(out: torch.Tensor, ref: torch.Tensor, tol: float = 2e-2) -> bool:
    """Finite and within ``tol`` (relative to the reference's largest magnitude, at least 1)."""
    out = out.double()
    ref = ref.double()
    if not torch.isfinite(out).all():
        return False
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    return float((out - ref).abs().max()) <= tol * scale if ref.numel() else True
