#!/usr/bin/env bash
# Fetch libtorch 2.11.0 (what tch 0.24 is built against) from the PyPI wheels and unpack it into
# the project's git-ignored cache. No internet is needed beyond the package registries.
#
#   scripts/setup-libtorch.sh [CACHE_DIR]      (default: $ZEROBENCH_CACHE or <repo>/.cache)
#
# Result (idempotent; a finished unpack is marked by $CACHE/libtorch/.complete):
#   $CACHE/libtorch/{lib,include}   libtorch: LIBTORCH points here
#   $CACHE/libtorch/lib also holds libcudart.so.13 and libcupti.so.13, which libtorch_cpu.so needs
#   even on CPU-only hosts (from nvidia-cuda-runtime / nvidia-cuda-cupti), and NVRTC
#   (nvidia-cuda-nvrtc), with which the tests compile the worker's CUDA kernels without a GPU.
#   $CACHE/libtorch/cuda-include    the CUDA runtime's headers (nvidia-cuda-runtime, and the crt/
#   ones they include from nvidia-cuda-crt), which the headers of libc10_cuda include (the
#   worker's shim uses its streams and caching allocator).
set -euo pipefail

TORCH_VERSION=2.11.0
CUDART_VERSION=13.0.96
CUPTI_VERSION=13.0.85
NVRTC_VERSION=13.0.88
CRT_VERSION=13.0.88
# What a finished unpack holds; a cache made before NVRTC or the CUDA headers were added is
# unpacked again.
COMPLETE="$TORCH_VERSION nvrtc-$NVRTC_VERSION cuda-include-$CUDART_VERSION-$CRT_VERSION"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${1:-${ZEROBENCH_CACHE:-$repo/.cache}}
dest=$cache/libtorch
wheels=$cache/wheels

log() { printf '[setup-libtorch] %s\n' "$*" >&2; }

if [ -f "$dest/.complete" ] && [ "$(cat "$dest/.complete")" = "$COMPLETE" ]; then
  log "libtorch $TORCH_VERSION already unpacked in $dest"
  exit 0
fi

command -v python3 >/dev/null || { log "python3 is required (for pip download)"; exit 1; }
command -v unzip >/dev/null || { log "unzip is required (make setup installs it)"; exit 1; }
mkdir -p "$wheels"

# pip resolves the wheel for this interpreter's ABI; libtorch inside is the same for every ABI tag.
log "downloading torch==$TORCH_VERSION and the CUDA runtime wheels into $wheels"
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" \
  "torch==$TORCH_VERSION" "nvidia-cuda-runtime==$CUDART_VERSION" "nvidia-cuda-cupti==$CUPTI_VERSION" \
  "nvidia-cuda-nvrtc==$NVRTC_VERSION" "nvidia-cuda-crt==$CRT_VERSION"

tmp=$(mktemp -d "$cache/unpack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
torch_whl=$(ls "$wheels"/torch-"$TORCH_VERSION"-*.whl | head -n1)
log "unpacking $(basename "$torch_whl")"
unzip -q "$torch_whl" 'torch/lib/*' 'torch/include/*' -d "$tmp"
for w in "$wheels"/nvidia_cuda_runtime-"$CUDART_VERSION"-*.whl "$wheels"/nvidia_cuda_cupti-"$CUPTI_VERSION"-*.whl \
  "$wheels"/nvidia_cuda_nvrtc-"$NVRTC_VERSION"-*.whl; do
  unzip -q -o "$w" '*.so*' -d "$tmp/nv"
done
# The CUDA wheels keep their libraries under nvidia/cu13/lib (or nvidia/*/lib): flatten them beside libtorch.
find "$tmp/nv" -name '*.so*' -type f -exec cp -n {} "$tmp/torch/lib/" \;
for w in "$wheels"/nvidia_cuda_runtime-"$CUDART_VERSION"-*.whl "$wheels"/nvidia_cuda_crt-"$CRT_VERSION"-*.whl; do
  unzip -q -o "$w" '*/include/*' -d "$tmp/nvinc"
done
inc=$(dirname "$(find "$tmp/nvinc" -name cuda_runtime_api.h | head -n1)")
for h in cuda_runtime_api.h crt/host_defines.h; do
  [ -f "$inc/$h" ] || { log "missing $h after unpacking the CUDA header wheels"; exit 1; }
done
mv "$inc" "$tmp/torch/cuda-include"
for lib in libcudart.so.13 libcupti.so.13 libnvrtc.so.13; do
  [ -e "$tmp/torch/lib/$lib" ] || { log "missing $lib after unpacking the CUDA wheels"; exit 1; }
done

rm -rf "$dest"
mv "$tmp/torch" "$dest"
echo "$COMPLETE" > "$dest/.complete"
log "libtorch $TORCH_VERSION ready in $dest ($(du -sh "$dest" | cut -f1))"
