#!/usr/bin/env bash
# The parity tests (pytest -m parity) again under torch's other CPU kernel sets. torch picks its
# vector kernels by the CPU's features (AVX-512, AVX2, none), and reductions add in an order that
# depends on the lane width: a parity test that passes only on the kernels it was written on is
# broken for the next user. The main pytest run used the CPU's own set; this runs the portable
# one (default) and, where the CPU has AVX2 and its own set is wider, avx2. Each set is checked
# to be the one torch runs before its tests. Under each only the tests that compare in float32
# run again (at 1e-5, where the lane width's summation order could move a loss): a float64
# comparison at 1e-10 sits six orders above its rounding (1e-16) on any kernel set, so it is
# skipped there (tests/parity.py's FP32_ONLY; each skip is listed, with its reason). Every one
# of the 126 passed under default when this pass still ran them all (CI, 2026-11-26);
# SCALESUITE_PARITY_ALL=1 runs them all again under every set.
set -euo pipefail
cd "$(dirname "$0")/.."
native=$(python -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
sets=(default)
if grep -qw avx2 /proc/cpuinfo && [ "$native" != "AVX2" ]; then
    sets+=(avx2)
fi
for set in "${sets[@]}"; do
    got=$(ATEN_CPU_CAPABILITY=$set python -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
    if [ "${got,,}" != "$set" ]; then
        echo "run_kernel_sets: ATEN_CPU_CAPABILITY=$set gave $got; torch did not honour it" >&2
        exit 1
    fi
    only=1
    if [ -n "${SCALESUITE_PARITY_ALL:-}" ]; then only=""; fi
    echo "== parity tests under ATEN_CPU_CAPABILITY=$set (the CPU's own: $native)${only:+; float32 ones only} =="
    SCALESUITE_PARITY_FP32_ONLY=$only ATEN_CPU_CAPABILITY=$set python -m pytest -m parity -q -p no:cacheprovider "$@"
done
