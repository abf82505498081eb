// What tch 0.24 does not expose, for zerobench-worker. Every function catches C++ exceptions and
// returns 0 on success or -1 on failure, with the message available from zb_last_error().
//
// * zb_backward: autograd backward from several outputs with given output gradients (tch's
//   run_backward hard-wires ones_like), so the engine can run backward segment by segment.
// * zb_clear_grad: drop a parameter's .grad (tch's zero_grad keeps the memory).
// * zb_storage_set / zb_storage_release: point a tensor's storage at memory the engine owns, or at
//   nothing. ZeRO-3 frees a block's parameters between forward and backward this way: shape,
//   strides and the autograd version counter stay as they are, so saved tensors stay valid once the
//   storage points at the re-gathered parameters again.
// * zb_cuda_*: the CUDA caching allocator's statistics, through c10's device-allocator interface,
//   so this file needs only libc10 at link time and runs on hosts without CUDA.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/version.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {
thread_local std::string last_error;

template <typename F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return -1;
}
}  // namespace

extern "C" {

const char* zb_last_error() { return last_error.c_str(); }

const char* zb_torch_version() { return TORCH_VERSION; }

int zb_backward(at::Tensor** outputs, at::Tensor** grads, int n) {
  return guarded([&] {
    std::vector<at::Tensor> outs, gs;
    outs.reserve(n);
    gs.reserve(n);
    for (int i = 0; i < n; ++i) {
      outs.push_back(*outputs[i]);
      gs.push_back(*grads[i]);
    }
    torch::autograd::backward(outs, gs, /*retain_graph=*/false, /*create_graph=*/false);
  });
}

int zb_clear_grad(at::Tensor* t) {
  return guarded([&] { t->mutable_grad().reset(); });
}

int zb_storage_set(at::Tensor* t, void* data, size_t nbytes) {
  return guarded([&] {
    c10::StorageImpl* impl = t->storage().unsafeGetStorageImpl();
    // A DataPtr without a deleter: the engine owns the memory and outlives every use.
    impl->set_data_ptr_noswap(at::DataPtr(data, t->device()));
    impl->set_nbytes(nbytes);
  });
}

int zb_storage_release(at::Tensor* t) {
  return guarded([&] {
    c10::StorageImpl* impl = t->storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(at::DataPtr(nullptr, t->device()));
    impl->set_nbytes(0);
  });
}

struct zb_cuda_stats {
  int64_t allocated;
  int64_t peak_allocated;
  int64_t reserved;
  int64_t peak_reserved;
  int64_t alloc_retries;
  int64_t ooms;
};

int zb_cuda_stats(int device, zb_cuda_stats* out) {
  return guarded([&] {
    auto* alloc = c10::getDeviceAllocator(c10::kCUDA);
    auto s = alloc->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated = s.allocated_bytes[all].current;
    out->peak_allocated = s.allocated_bytes[all].peak;
    out->reserved = s.reserved_bytes[all].current;
    out->peak_reserved = s.reserved_bytes[all].peak;
    out->alloc_retries = s.num_alloc_retries;
    out->ooms = s.num_ooms;
  });
}

int zb_cuda_reset_peak(int device) {
  return guarded([&] { c10::getDeviceAllocator(c10::kCUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(device)); });
}

}  // extern "C"
