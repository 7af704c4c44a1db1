"""The CPU float kernels an x86 machine picks, emulated on one machine (tests and benchmarks only).

torch's own vectorised kernels (``ATEN_CPU_CAPABILITY``), its BLAS (MKL: ``MKL_ENABLE_INSTRUCTIONS``), its oneDNN
(``ONEDNN_MAX_CPU_ISA``) and numpy's OpenBLAS (``OPENBLAS_CORETYPE``) each choose their code path from the CPU they
run on: the same code then groups float sums differently and gives other last bits. Each library reads its
variable once, when it loads, so a profile applies to a fresh process:

    env $(python -m fedrapp_app.testing.kernels default) python -m pytest -m kernels

A profile can only step down from what the CPU has: ``avx512`` on an AVX2 machine falls back to AVX2.
"""

from __future__ import annotations

import sys

#: Per profile, the variables that make every library take that instruction set's code path.
PROFILES: dict[str, dict[str, str]] = {
    "default": {  # SSE4.2: what torch calls its default (no AVX) kernels
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "OPENBLAS_CORETYPE": "Nehalem",
    },
    "avx2": {  # an AVX2 machine without AVX-512 (e.g. AMD EPYC before Zen 4, Intel before Skylake-SP)
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell",
    },
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "OPENBLAS_CORETYPE": "SkylakeX",
    },
}


def environment(profile: str) -> dict[str, str]:
    """The variables of ``profile``; ``ValueError`` naming the profiles for any other name."""
    if profile not in PROFILES:
        raise ValueError(f"no kernel profile {profile!r}: choose one of {', '.join(PROFILES)}")
    return dict(PROFILES[profile])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python -m fedrapp_app.testing.kernels {{{'|'.join(PROFILES)}}}")
    try:
        print(" ".join(f"{k}={v}" for k, v in environment(sys.argv[1]).items()))
    except ValueError as err:
        raise SystemExit(str(err)) from None
