"""The Gluon decode's inline-PTX decoders with the E4M3 conversion, run on the CPU by a small interpreter of the
PTX they use.

The decoders run only on a GPU inside the kernel. Their arithmetic is checked here exhaustively instead: every E2M1
nibble in every byte position, every finite non-negative E4M3 scale. Checked: the fp32-scale (``CVT8``) decoders
give ``e2m1 * sf * 2^-8``; the lean ones (``DecodeConfig.lean``, the default: scales converted by
``cvt.rn.f16x2.e4m3x2``, duplicated by ``prmt``) give ``e2m1 * sf * 2^-6``; both exactly, in the same registers and
halves. The interpreter knows the few instructions these texts use, with PTX's semantics (``prmt``'s default mode,
``cvt.rn.f16x2.f32``'s operand order, the E4M3 format), and refuses any other.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

dg = pytest.importorskip("nvfp4compat.kernels.triton.decode_gluon")

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1(nibble: int) -> float:
    return (-1.0 if nibble & 8 else 1.0) * E2M1[nibble & 7]


def e4m3(byte: int) -> float:
    """The OCP E4M3 (fn) value of a byte: bias 7, subnormals, no infinities, 0x7F / 0xFF NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 7
    if exp == 0xF and man == 7:
        return float("nan")
    if exp == 0:
        return sign * man / 8 * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def f16_bits(x: float) -> int:
    return int(np.array(x, dtype=np.float16).view(np.uint16))


def f16(bits: int) -> float:
    return float(np.array(bits & 0xFFFF, dtype=np.uint16).view(np.float16))


def run_ptx(text: str, operands: dict[int, int]) -> dict[int, int]:
    """Run an inline-PTX block: ``operands`` are the ``$n`` inputs (32-bit integers); returns every ``$n``."""
    regs: dict[str, int] = {f"${n}": v & 0xFFFFFFFF for n, v in operands.items()}

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 0) & 0xFFFFFFFF if re.fullmatch(r"-?(0x[0-9A-Fa-f]+|\d+)", tok) else regs[tok]

    for raw in text.split(";"):
        line = raw.strip().strip("{}").strip()
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # split a 32-bit register into two 16-bit halves
            lo, hi, src = re.fullmatch(r"\{\s*(\S+),\s*(\S+)\s*\},\s*(\S+)", rest).groups()
            regs[lo], regs[hi] = val(src) & 0xFFFF, val(src) >> 16
            continue
        args = [a.strip() for a in rest.split(",")]
        d, srcs = args[0], args[1:]
        if op == "mov.b32":
            out = val(srcs[0])
        elif op == "shl.b32":
            out = val(srcs[0]) << val(srcs[1])
        elif op == "shr.b32":  # .b32: a logical shift
            out = val(srcs[0]) >> val(srcs[1])
        elif op == "mul.hi.u32":  # the high 32 bits of the 64-bit product
            out = (val(srcs[0]) * val(srcs[1])) >> 32
        elif op == "and.b32":
            out = val(srcs[0]) & val(srcs[1])
        elif op == "or.b32":
            out = val(srcs[0]) | val(srcs[1])
        elif op == "prmt.b32":  # default mode: selector nibble i picks byte (n & 7) of {b, a}; bit 3 replicates its sign
            pool = val(srcs[0]) | (val(srcs[1]) << 32)
            sel, out = val(srcs[2]), 0
            for i in range(4):
                n = (sel >> (4 * i)) & 0xF
                byte = (pool >> (8 * (n & 7))) & 0xFF
                if n & 8:
                    byte = 0xFF if byte & 0x80 else 0
                out |= byte << (8 * i)
        elif op == "cvt.rn.f16x2.e4m3x2":  # the 16-bit source's low byte to the low half, high byte to the high half
            s = val(srcs[0])
            out = f16_bits(e4m3(s & 0xFF)) | (f16_bits(e4m3((s >> 8) & 0xFF)) << 16)
        elif op == "cvt.rn.f16x2.f32":  # d = {cvt(a) in the upper half, cvt(b) in the lower half}
            a, b = (float(np.array(val(x), dtype=np.uint32).view(np.float32)) for x in srcs)
            out = f16_bits(b) | (f16_bits(a) << 16)
        elif op == "mul.rn.f16x2":
            x, y = val(srcs[0]), val(srcs[1])
            out = f16_bits(f16(x) * f16(y)) | (f16_bits(f16(x >> 16) * f16(y >> 16)) << 16)
        else:
            raise AssertionError(f"the interpreter does not know {op!r}: extend it with PTX's semantics")
        regs[d] = out & 0xFFFFFFFF
    return {int(k[1:]): v for k, v in regs.items() if k.startswith("$")}


def scale_fp32_bits(byte: int) -> int:
    """What the default decoders take as their fp32 scale (``_scale_biased(byte, CVT8=True)``): ``sf * 2^-2``."""
    return int(np.array(e4m3(byte) * 2.0**-2, dtype=np.float32).view(np.uint32))


SCALES = list(range(0x7F))  # every finite non-negative E4M3 byte (0x7F is NaN)
RNG = np.random.default_rng(7)
WORDS = [0x76543210, 0xFEDCBA98, 0x0F1E2D3C] + [int(w) for w in RNG.integers(0, 2**32, 13, dtype=np.uint64)]


def halves(regs: dict[int, int], outs: range) -> list[float]:
    return [f16(regs[o] >> sh) for o in outs for sh in (0, 16)]


def k_expected(word: int, sf: float, power: int) -> list[float]:
    """The K decoders' order: $0 / $1 = low nibbles of bytes (0, 1) / (2, 3), $2 / $3 = the high nibbles."""
    b = [(word >> (8 * i)) & 0xFF for i in range(4)]
    order = [b[0] & 15, b[1] & 15, b[2] & 15, b[3] & 15, b[0] >> 4, b[1] >> 4, b[2] >> 4, b[3] >> 4]
    return [e2m1(n) * sf * 2.0**power for n in order]


@pytest.mark.parametrize("word", WORDS, ids=[f"{w:08x}" for w in WORDS])
def test_k_decoders_default_and_lean(word):
    for lo_byte, hi_byte in zip(SCALES, reversed(SCALES), strict=True):
        default = [run_ptx(dg._ASM_K_CVT8, {4: word, 5: scale_fp32_bits(b)}) for b in (lo_byte, hi_byte)]
        pair = run_ptx(dg._ASM_KS_PAIR, {2: lo_byte | (hi_byte << 8) | 0xFFFF0000})  # int16 sign-extended
        lean = [run_ptx(dg._ASM_K_CVT8_S, {4: word, 5: pair[i]}) for i in (0, 1)]
        default_shr = [run_ptx(dg._ASM_K_CVT8_SHR, {4: word, 5: scale_fp32_bits(b)}) for b in (lo_byte, hi_byte)]
        lean_shr = [run_ptx(dg._ASM_K_CVT8_S_SHR, {4: word, 5: pair[i]}) for i in (0, 1)]
        for b, d, le in zip((lo_byte, hi_byte), default, lean, strict=True):
            assert halves(d, range(4)) == k_expected(word, e4m3(b), -8)
            assert halves(le, range(4)) == k_expected(word, e4m3(b), -6)
        # IMAD_SHR: the same bits in every output register
        assert [{o: r[o] for o in range(4)} for r in default_shr] == [{o: r[o] for o in range(4)} for r in default]
        assert [{o: r[o] for o in range(4)} for r in lean_shr] == [{o: r[o] for o in range(4)} for r in lean]


def v_expected(wa: int, wb: int, sa: float, sb: float, power: int) -> list[float]:
    """The V decoders' order: register 2m / 2m + 1 = low / high nibble of byte m, key a in the low half."""
    out = []
    for m in range(4):
        ba, bb = (wa >> (8 * m)) & 0xFF, (wb >> (8 * m)) & 0xFF
        out += [e2m1(ba & 15) * sa * 2.0**power, e2m1(bb & 15) * sb * 2.0**power]
        out += [e2m1(ba >> 4) * sa * 2.0**power, e2m1(bb >> 4) * sb * 2.0**power]
    return out


@pytest.mark.parametrize("word", WORDS[:6], ids=[f"{w:08x}" for w in WORDS[:6]])
def test_v_decoders_default_and_lean(word):
    other = (word * 2654435761) & 0xFFFFFFFF
    for sa, sb in zip(SCALES, reversed(SCALES), strict=True):
        default = run_ptx(dg._ASM_V_CVT8, {8: word, 9: other, 10: scale_fp32_bits(sa), 11: scale_fp32_bits(sb)})
        sv = run_ptx(dg._ASM_VS_PAIR, {1: sa, 2: sb})[0]
        lean = run_ptx(dg._ASM_V_CVT8_S, {8: word, 9: other, 10: sv})
        assert halves(default, range(8)) == v_expected(word, other, e4m3(sa), e4m3(sb), -8)
        assert halves(lean, range(8)) == v_expected(word, other, e4m3(sa), e4m3(sb), -6)
        default_shr = run_ptx(dg._ASM_V_CVT8_SHR, {8: word, 9: other, 10: scale_fp32_bits(sa), 11: scale_fp32_bits(sb)})
        lean_shr = run_ptx(dg._ASM_V_CVT8_S_SHR, {8: word, 9: other, 10: sv})
        assert [default_shr[o] for o in range(8)] == [default[o] for o in range(8)]
        assert [lean_shr[o] for o in range(8)] == [lean[o] for o in range(8)]


def test_imad_shr_decoders_shift_by_a_multiply():
    """``IMAD_SHR``'s texts have no right shift (ptxas would emit an SHF on the ALU pipe) and a multiplier that is not
    a power of two (ptxas turns one back into the shift); ``mul.hi.u32`` of the masked bytes is the shift for every
    value they can take."""
    for text in (dg._ASM_K_CVT8_SHR, dg._ASM_V_CVT8_SHR, dg._ASM_K_CVT8_S_SHR, dg._ASM_V_CVT8_S_SHR):
        assert "shr." not in text and "mul.hi.u32" in text and "0x40000001" in text
    for text in (dg._ASM_K_CVT8, dg._ASM_V_CVT8, dg._ASM_K_CVT8_S, dg._ASM_V_CVT8_S):
        assert "shr.b32" in text and "mul.hi" not in text
    masked = np.arange(2**16, dtype=np.uint64)
    a = (masked | (masked << 16)) & 0x70707070
    assert np.array_equal((a * 0x40000001) >> 32, a >> 2)


def test_decoder_texts_reach_the_kernel_cache_key(monkeypatch):
    """A changed decoder text gives the kernel a new Triton cache key (so no binary built from the old text is
    reused): the texts are one constexpr, whose value Triton hashes, read by the constexpr function that picks them."""
    from triton.runtime.jit import JITCallable

    def key() -> str:
        for obj in vars(dg).values():
            if isinstance(obj, JITCallable):
                obj.hash = None
                # the globals each function read when it was last hashed (triton 3.6 refuses a changed value there)
                obj.__dict__.get("used_global_vals", {}).clear()
        return dg.gluon_decode_kernel.cache_key

    before = key()
    changed = dict(dg._DECODER_PTX.value, k_lean=dg._ASM_K_CVT8_S + "\n// changed\n")
    monkeypatch.setattr(dg, "_DECODER_PTX", type(dg._DECODER_PTX)(changed))
    assert key() != before
    monkeypatch.undo()
    assert key() == before
    assert dg._decoder_text.fn(False, True, True, None) == dg._ASM_K_CVT8_S
    assert dg._decoder_text.fn(True, True, True, None, True) == dg._ASM_V_CVT8_S_SHR
    assert dg._decoder_text.fn(True, False, True, None, True) == dg._ASM_V_CVT8_SHR


def test_the_interpreter_refuses_what_it_does_not_know():
    with pytest.raises(AssertionError, match="does not know 'add.u32'"):
        run_ptx("add.u32 $0, $1, 1;", {1: 2})
