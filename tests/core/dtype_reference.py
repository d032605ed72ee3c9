"""Reference tables for tests/core/dtype_test.cpp, computed with numpy and ml_dtypes only.

Usage: dtype_reference.py OUT_DIR

Writes raw little-endian arrays, named with the safetensors dtype spellings:
  OUT_DIR/src_<FROM>.bin        the source values of type FROM
  OUT_DIR/ref_<FROM>_<TO>.bin   those values converted to TO (every float TO other than FROM)

Sources: every bit pattern of BF16, F16, F8_E4M3, F8_E5M2 and F8_E8M0; for F32 and F64 every finite value
of each narrow type, every tie between neighbours, values next to the ties, values around
overflow and underflow, zeros, infinities, NaNs (all with both signs), plus random bit patterns
with a fixed seed.

How each reference value is obtained:
  * narrow -> F32, F32 -> anything: ml_dtypes' astype (numpy's for F16).
  * narrow -> anything else: widen to F32 (exact), then as above. For F16 -> F64 this differs
    from numpy's direct cast only for signalling NaNs: numpy keeps them signalling, the F32 ->
    F64 step (hardware, as in GroupLin and in ml_dtypes' BF16/F8 casts) sets the quiet bit.
  * F64 -> F16: numpy's astype, which rounds once, directly from F64.
  * F64 -> BF16 / F8: ml_dtypes (0.5.1) converts F64 by way of F32, rounding twice; GroupLin
    rounds once. The reference rounds F64 to F32 with round-to-odd (truncate; set the lowest
    bit when inexact), then uses ml_dtypes. Round-to-odd into a format with at least two more
    bits than the target makes the second rounding exact (Boldo & Melquiond, 2008); F32 has 24
    bits, the targets at most 11. This script checks the method against numpy's direct F64 -> F16
    and against a few values worked out by hand, and exits non-zero if it disagrees.
  * NaN: numpy's F16 cast keeps a truncated NaN payload; ml_dtypes (BF16, F8) and GroupLin return
    the canonical quiet NaN with the input's sign (F8_E8M0, unsigned: 0xFF). F16 NaN results are
    set to that (0x7E00 | sign)
    so that the C++ test can compare every bit.
"""

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

NARROW = {
    "BF16": (ml_dtypes.bfloat16, np.uint16),
    "F16": (np.float16, np.uint16),
    "F8_E4M3": (ml_dtypes.float8_e4m3fn, np.uint8),
    "F8_E5M2": (ml_dtypes.float8_e5m2, np.uint8),
    "F8_E8M0": (ml_dtypes.float8_e8m0fnu, np.uint8),  # ml_dtypes >= 0.5
}
WIDE = {"F32": (np.float32, np.uint32), "F64": (np.float64, np.uint64)}
ALL = {**NARROW, **WIDE}
RANDOM_F32 = 1 << 20
RANDOM_F64 = 1 << 18


def all_patterns(name):
    float_type, bits_type = NARROW[name]
    return np.arange(1 << (8 * np.dtype(bits_type).itemsize), dtype=np.uint64).astype(bits_type).view(float_type)


def finite_values(name):
    """Sorted distinct finite values of a narrow type, as F64."""
    v = all_patterns(name).astype(np.float64)
    return np.unique(v[np.isfinite(v)])


def special_values(name, wide):
    """Values that probe the rounding to `name`, as the wide numpy type."""
    values = finite_values(name)
    ties = (values[:-1] + values[1:]) / 2  # exact in F64, and in F32 (the targets are narrow)
    if name == "BF16" and wide == np.float64:
        # BF16's 254 binades all round alike; keep the subnormal and lowest normal ones, those
        # around 1 and the top ones, to keep the F64 set small.
        def keep(v):
            m = np.abs(v)
            return (m < 2.0**-120) | ((m > 2.0**-4) & (m < 2.0**4)) | (m > 2.0**120)

        values, ties = values[keep(values)], ties[keep(ties)]
    top, step = values[-1], values[-1] - values[-2]
    tiny = values[values > 0][0]
    edges = np.array([top + step / 2, top + step, 2 * top, top * 1024, tiny / 2, tiny / 4, tiny * 0.75])
    base = np.concatenate([values, ties, edges]).astype(wide)
    finfo = np.finfo(wide)
    extra = np.array([0.0, np.inf, finfo.max, finfo.tiny, finfo.smallest_subnormal], dtype=wide)
    probes = [base, np.nextafter(base, wide(np.inf)), np.nextafter(base, wide(-np.inf)), extra]
    if wide == np.float64:
        # Ties nudged by far less than an F32 ulp: they round to the tie in F32, so a conversion
        # that goes by way of F32 rounds them the wrong way.
        probes += [base * (1 + 2.0**-30), base * (1 - 2.0**-30)]
    s = np.concatenate(probes)
    return np.concatenate([s, -s])


def nan_patterns(bits_type):
    if bits_type == np.uint32:
        pats = [0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000, 0x7FC00001]
    else:
        pats = [0x7FF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF, 0x7FF0000020000000]
    sign = 1 << (8 * np.dtype(bits_type).itemsize - 1)
    return np.array(pats + [p | sign for p in pats], dtype=bits_type)


def round_to_odd_f32(x):
    """F64 -> F32 rounded to odd: truncate towards zero, set the lowest bit if inexact."""
    f = x.astype(np.float32)
    away = np.abs(f.astype(np.float64)) > np.abs(x)  # went away from zero (incl. to infinity)
    f = np.where(away, np.nextafter(f, np.float32(0)), f).astype(np.float32)
    inexact = (f.astype(np.float64) != x) & ~np.isnan(x)
    return (f.view(np.uint32) | inexact.astype(np.uint32)).view(np.float32)


def canonical_f16_nan(bits):
    bits = bits.copy()
    nan = (bits & 0x7FFF) > 0x7C00
    bits[nan] = (bits[nan] & 0x8000) | 0x7E00
    return bits


def convert(x, src, dst):
    """x (numpy array of type src) converted to dst, as the raw bits of dst."""
    dst_float, dst_bits = ALL[dst]
    if src == "F64" and dst in NARROW and dst != "F16":
        y = round_to_odd_f32(x).astype(dst_float)
    elif src in NARROW:
        y = x.astype(np.float32).astype(dst_float)
    else:
        y = x.astype(dst_float)
    bits = y.view(dst_bits)
    return canonical_f16_nan(bits) if dst == "F16" else bits


def check(condition, what):
    if not condition:
        sys.exit("dtype_reference.py: self-check failed: " + what)


def self_check(f64_sources):
    # Round-to-odd + F32 -> F16 must agree with numpy's direct F64 -> F16.
    direct = canonical_f16_nan(f64_sources.astype(np.float16).view(np.uint16))
    via_odd = canonical_f16_nan(round_to_odd_f32(f64_sources).astype(np.float16).view(np.uint16))
    bad = np.nonzero(direct != via_odd)[0]
    check(bad.size == 0, "round-to-odd disagrees with numpy F64->F16 at %s" % f64_sources[bad[:5]])
    # Hand-worked values: just above a tie, where rounding via F32 would go down.
    hand = [
        ("BF16", 1 + 2.0**-8 + 2.0**-30, 0x3F81),
        ("F16", 1 + 2.0**-11 + 2.0**-40, 0x3C01),
        ("F8_E4M3", 1 + 2.0**-4 + 2.0**-40, 0x39),
        ("F8_E5M2", 1 + 2.0**-3 + 2.0**-40, 0x3D),
        ("F8_E4M3", 464.0, 0x7E),  # tie between 448 and 480 (NaN pattern): even, 448
        ("F8_E8M0", 1.5 - 2.0**-40, 0x7F),  # just below 1.5: 2^0
        ("F8_E8M0", 1.5 + 2.0**-40, 0x80),  # just above: 2^1
        ("F8_E8M0", 0.0, 0xFF),  # no zero: NaN
    ]
    for dst, value, expected in hand:
        got = int(convert(np.array([value]), "F64", dst)[0])
        check(got == expected, "%r -> %s gave 0x%X, expected 0x%X" % (value, dst, got, expected))


def write(path, bits):
    bits.astype(bits.dtype.newbyteorder("<")).tofile(path)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: dtype_reference.py OUT_DIR")
    out = Path(sys.argv[1])
    np.seterr(all="ignore")  # overflow and NaN are inputs on purpose
    rng = np.random.default_rng(20240611)

    sources = {name: all_patterns(name) for name in NARROW}
    f32 = [special_values(n, np.float32) for n in NARROW]
    f32 += [nan_patterns(np.uint32).view(np.float32)]
    f32 += [rng.integers(0, 1 << 32, RANDOM_F32, dtype=np.uint64).astype(np.uint32).view(np.float32)]
    sources["F32"] = np.concatenate(f32)

    f64 = [special_values(n, np.float64) for n in NARROW]
    f64 += [nan_patterns(np.uint64).view(np.float64)]
    # Random F32 patterns widened to F64 with random bits below F32 precision, so that many sit
    # close to ties of the narrow types; and some raw random F64 patterns.
    f32_bits = rng.integers(0, 1 << 32, RANDOM_F64, dtype=np.uint64).astype(np.uint32)
    widened = f32_bits.view(np.float32).astype(np.float64)
    low = rng.integers(0, 1 << 29, RANDOM_F64, dtype=np.uint64)
    mixed = np.where(np.isfinite(widened), widened.view(np.uint64) | low, widened.view(np.uint64))
    f64 += [mixed.view(np.float64)]
    f64 += [rng.integers(0, 1 << 63, RANDOM_F64 // 4, dtype=np.uint64).view(np.float64)]
    sources["F64"] = np.concatenate(f64)

    self_check(sources["F64"])

    for src, values in sources.items():
        write(out / f"src_{src}.bin", values.view(ALL[src][1]))
        for dst in ALL:
            if dst == src:
                continue  # a plain copy: the test compares with src_<FROM>.bin
            write(out / f"ref_{src}_{dst}.bin", convert(values, src, dst))


if __name__ == "__main__":
    main()
