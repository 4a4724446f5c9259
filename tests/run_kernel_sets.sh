#!/usr/bin/env bash
# The parity tests (pytest -m parity) again under torch's other CPU kernel sets. torch picks its
# vector kernels by the CPU's features (AVX-512, AVX2, none), and reductions add in an order that
# depends on the lane width: a parity test that passes only on the kernels it was written on is
# broken for the next user. The main pytest run used the CPU's own set; this runs the portable
# one (default) and, where the CPU has AVX2 and its own set is wider, avx2. Each set is checked
# to be the one torch runs before its tests.
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
    echo "== parity tests under ATEN_CPU_CAPABILITY=$set (the CPU's own: $native) =="
    ATEN_CPU_CAPABILITY=$set python -m pytest -m parity -q -p no:cacheprovider "$@"
done
