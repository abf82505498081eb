# Source on a GPU host that has torch 2.11 in its python3 but no cargo: makes the carried
# zerobench binaries find libtorch (torch's own lib folder), NCCL (the library torch loads, under
# the name `libnccl.so` that cudarc looks for), NVRTC and the CUDA runtime, and keeps NVLink
# multicast off, as the shared hosts require.
#
#   . bench/gpu/host-env.sh
_zb_py=$(command -v python3)
TORCH_LIB=$("$_zb_py" -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')
# The NCCL that torch itself loads.
_zb_nccl=$("$_zb_py" -c 'import torch; torch.cuda.nccl.version(); print(next(l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l))')
mkdir -p /tmp/zerobench-libs
ln -sf "$_zb_nccl" /tmp/zerobench-libs/libnccl.so
# The CUDA libraries of torch's wheels (cuda-toolkit 13: nvidia/cu13/lib; older: nvidia/*/lib).
_zb_nv=$("$_zb_py" -c 'import site, glob; print(":".join(sorted(set(d for s in site.getsitepackages() for d in glob.glob(s + "/nvidia/*/lib")))))')
export LD_LIBRARY_PATH="/tmp/zerobench-libs:$TORCH_LIB:${_zb_nv}:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
unset _zb_py _zb_nccl _zb_nv
