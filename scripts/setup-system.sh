#!/usr/bin/env bash
# Install the Debian packages zerobench builds and tests with, when they are missing.
# Idempotent: packages already installed are not touched and apt is not run at all.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config unzip ca-certificates
  libclang-dev clang          # bindgen, for rsmpi's mpi-sys
  libopenmpi-dev openmpi-bin  # MPI for the worker (pulls libpmix2 for srun --mpi=pmix)
  slurm-wlm munge             # the local test cluster (slurm/local-cluster.sh)
  pdsh                        # the DeepSpeed-style launch method
  openssh-server openssh-client  # pdsh over ssh, tested against a private sshd on a free port
  python3 python3-pip         # pip download of the libtorch wheels
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A pip that is not Debian's (pyenv, venv) is as good as python3-pip.
if [[ " ${missing[*]} " == *" python3-pip "* ]] && python3 -m pip --version >/dev/null 2>&1; then
  missing=("${missing[@]/python3-pip/}")
fi
if [[ " ${missing[*]} " == *" python3 "* ]] && command -v python3 >/dev/null; then
  missing=("${missing[@]/python3/}")
fi
read -r -a missing <<<"${missing[*]}"
if [ ${#missing[@]} -eq 0 ]; then
  echo "[setup-system] all packages present" >&2
  exit 0
fi

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
echo "[setup-system] installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
