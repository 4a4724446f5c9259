#!/usr/bin/env bash
# Install Debian's Open MPI: mpirun for launch.executor=mpi, and the library mpi4py (the [mpi]
# extra, in [test]) loads at import. Idempotent: does nothing when both are there. Needs root.
set -euo pipefail

if command -v mpirun >/dev/null 2>&1 && ldconfig -p | grep -q 'libmpi\.so '; then
  echo "install_mpi: Open MPI present ($(mpirun --version 2>/dev/null | head -1))"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# Only refresh the package lists when apt does not know Open MPI (lists absent or pruned).
if ! apt-cache policy openmpi-bin 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  echo "install_mpi: apt-get update"
  apt-get update -q
fi
apt-get install -y -q openmpi-bin libopenmpi-dev
command -v mpirun >/dev/null
echo "install_mpi: $(mpirun --version | head -1) installed"
