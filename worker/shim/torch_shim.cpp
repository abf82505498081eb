// What tch 0.24 does not expose, for zerobench-worker. Every function catches C++ exceptions and
// returns 0 on success or -1 on failure, with the message available from zb_last_error().
//
// * zb_backward: autograd backward from several outputs with given output gradients (tch's
//   run_backward hard-wires ones_like), so the engine can run backward segment by segment.
// * zb_run_in_backward: call a function from inside a backward pass, on the thread that runs the
//   device's backward passes (libtorch's autograd thread for a GPU; the caller for the CPU): the
//   trainer runs its backward segment by segment from there, each segment's backward a reentrant
//   one on that same thread, instead of handing every segment over to that thread and back.
// * zb_clear_grad: drop a parameter's .grad (tch's zero_grad keeps the memory).
// * zb_storage_set / zb_storage_release: point a tensor's storage at memory the engine owns, or at
//   nothing. ZeRO-3 frees a block's parameters between forward and backward this way: shape,
//   strides and the autograd version counter stay as they are, so saved tensors stay valid once the
//   storage points at the re-gathered parameters again.
// * zb_cuda_stats / zb_cuda_reset_peak / zb_cuda_empty_cache: the CUDA caching allocator's
//   statistics, and emptying its cache, through c10's device-allocator interface. Like everything
//   here they run on hosts without a GPU (libc10_cuda loads there; only calling into CUDA fails).
// * zb_store_*: c10d's TCPStore, the rendezvous of ranks launched with the environment convention
//   (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): rank 0 hosts it, every rank connects, and ranks
//   publish and wait for small values under keys, each wait bounded by the store's timeout.
// * zb_host_zeros: a CPU tensor of zeros whose memory (from 2 MiB up) is a fresh anonymous mapping
//   aligned to 2 MiB and advised into transparent huge pages, unmapped with the tensor: the kernel
//   gives it zeroed on first touch, so nothing writes it before offload page-locks it (see
//   runtime/pinned.rs for why).
// * zb_gloo_*: c10d's ProcessGroupGloo over that store, the CPU collectives of those ranks. Its
//   header needs Gloo's, which the wheel lacks: third_party/gloo holds them, and says why they
//   match the Gloo compiled into libtorch_cpu.
// * zb_residual_linear: res + a linear layer, as an autograd function whose bias gradient is the
//   worker's kernel.
// * zb_given_grads: a loss whose inputs' gradients were computed beside it (the LM head's), as an
//   autograd function that hands them back scaled by the upstream gradient.
// * zb_embedding: an embedding lookup whose backward adds its rows into the weight's gradient where
//   the engine placed it (zb_grad_into), beside what the tied LM head wrote there.
// * zb_set_node_kernels: the worker's own CUDA kernels for these nodes (layer norm forward and
//   backward, bias and GELU gradients, and matrix products with cuBLASLt's epilogues), called with
//   libtorch's current stream; without them, or where they decline the tensors, the nodes use
//   libtorch's operations.
// * zb_ln_linear / zb_residual_ln_gelu_mlp: a layer norm followed by a linear layer, and x plus a
//   layer norm followed by an MLP with tanh GELU, as autograd functions (tch has none) whose backward
//   recomputes the normalised input (in the layer norm's backward kernel on CUDA) and the GELU's
//   output instead of keeping them from the forward pass (model/recompute.rs says what that saves
//   and costs). zb_ln_linear gives its output as equal blocks of its columns (GPT-2's q, k and v),
//   whose gradients its backward joins with the bias gradient's column sums, and passes x on as its
//   last output, for the residual addition after it: that output's gradient reaches the node's
//   backward, which adds it to x's in the layer norm's backward kernel instead of leaving autograd
//   to sum the two.
// * zb_grad_into / zb_take_grads: where the nodes above write a parameter's gradient (a place in a
//   flat buffer of the engine's instead of a fresh tensor the engine then copies from:
//   zero/engine.rs, `place_grads`), and the move of a unit's gradients into that buffer, those
//   the nodes did not write in one launch.
// * zb_cuda_set_stream / zb_cuda_current_stream / zb_cuda_pool_*: libtorch's current stream on
//   this thread (set, and read where the worker's own kernels must run on it), and the CUDA
//   caching allocator's private pools: while a step is captured into a CUDA graph, everything the
//   capture stream allocates comes from a pool that nothing else uses, so the memory a replay
//   writes stays the graph's (what at::cuda::CUDAGraph does; that class lives in libtorch_cuda,
//   which the worker loads at run time, while libc10_cuda is linked like libc10).
// * zb_profiler_start / zb_profiler_stop: libtorch's own profiler (Kineto: every operator on the
//   host, every CUDA kernel and copy through CUPTI) around one step, saved as a Chrome trace.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {
thread_local std::string last_error;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `t` as a matrix of its last dimension's rows (a view where `t` is contiguous).
at::Tensor rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// `t`'s sizes with the last one replaced by `last`.
std::vector<int64_t> with_last(const at::Tensor& t, int64_t last) {
  auto sizes = t.sizes().vec();
  sizes.back() = last;
  return sizes;
}

// The worker's own CUDA kernels for the nodes' layer norms and gradient reductions
// (model/recompute_cuda.rs), registered once by zb_set_node_kernels before any forward pass. Each
// gets libtorch's current stream and returns 0 when it computed its outputs, 1 when it does not take
// these tensors (the node then uses libtorch's operations), -1 on an error (its message written to
// `err`).
struct zb_node_kernels {
  int (*ln_forward)(at::Tensor* x, at::Tensor* gamma, at::Tensor* beta, double eps, at::Tensor* y, at::Tensor* mean,
                    at::Tensor* rstd, void* stream, char* err, size_t cap);
  // dres (may be null): a gradient added to dx (the residual's, where x is also the residual stream);
  // xn: gets the forward's output y again, from x and the forward's mean and rstd.
  int (*ln_backward)(at::Tensor* dy, at::Tensor* x, at::Tensor* mean, at::Tensor* rstd, at::Tensor* gamma,
                     at::Tensor* beta, at::Tensor* dres, at::Tensor* dx, at::Tensor* xn, at::Tensor* dgamma,
                     at::Tensor* dbeta, void* stream, char* err, size_t cap);
  int (*col_sum)(at::Tensor* x, at::Tensor* out, void* stream, char* err, size_t cap);
  int (*gelu_forward)(at::Tensor* h, at::Tensor* a, void* stream, char* err, size_t cap);
  // act gets gelu_tanh(h), and g is overwritten with gelu_tanh'(h) * g before its columns are summed.
  int (*gelu_backward_col_sum)(at::Tensor* g, at::Tensor* h, at::Tensor* act, at::Tensor* out, void* stream,
                               char* err, size_t cap);
  // x gets s0, s1 and s2 side by side (each rows of a third of x's), and out x's column sums.
  int (*join_col_sum)(at::Tensor* s0, at::Tensor* s1, at::Tensor* s2, at::Tensor* x, at::Tensor* out, void* stream,
                      char* err, size_t cap);
  // h = x·w1ᵀ + b1 and a = gelu_tanh(h) in one matrix product (cuBLASLt's GELU epilogue).
  int (*gelu_up)(at::Tensor* x, at::Tensor* w1, at::Tensor* b1, at::Tensor* h, at::Tensor* a, void* stream, char* err,
                 size_t cap);
  // out = res + x·wᵀ + b in one matrix product (cuBLASLt's bias epilogue with res as its C).
  int (*residual)(at::Tensor* res, at::Tensor* x, at::Tensor* w, at::Tensor* b, at::Tensor* out, void* stream,
                  char* err, size_t cap);
  // out = a·b (+ bias along its rows where bias is not null), by the fastest of cuBLASLt's
  // algorithms and libtorch's call, timed at the first product of each shape.
  int (*matmul)(at::Tensor* a, at::Tensor* b, at::Tensor* bias, at::Tensor* out, void* stream, char* err, size_t cap);
  // out = x·u in x's precision, u a one-element fp32 tensor read on the device.
  int (*scale)(at::Tensor* x, at::Tensor* u, at::Tensor* out, void* stream, char* err, size_t cap);
};
std::atomic<const zb_node_kernels*> node_kernels{nullptr};

// The registered kernels when there are any and `on` is a CUDA tensor (outputs are allocated for
// them only then).
const zb_node_kernels* kernels_for(const at::Tensor& on) {
  const auto* k = node_kernels.load();
  return k && on.is_cuda() ? k : nullptr;
}

// Calls kernel `f` of `k` with `args` on `on`'s current stream: whether it computed the outputs.
template <typename F, typename... A>
bool ran(const zb_node_kernels* k, F zb_node_kernels::*f, const at::Tensor& on, A... args) {
  if (!(k->*f)) return false;
  char err[512] = "";
  const int rc = (k->*f)(args..., c10::cuda::getCurrentCUDAStream(on.device().index()).stream(), err, sizeof err);
  if (rc < 0) throw std::runtime_error(std::string("a layer-norm or gradient kernel: ") + err);
  return rc == 0;
}

// The tanh GELU of the MLP's forward pass (rows).
at::Tensor gelu_tanh(at::Tensor h) {
  if (const auto* k = kernels_for(h)) {
    auto a = at::empty_like(h, at::MemoryFormat::Contiguous);
    if (ran(k, &zb_node_kernels::gelu_forward, h, &h, &a)) return a;
  }
  return at::gelu(h, "tanh");
}

// cuBLASLt's epilogues are asked for 16-bit tensors only (fp32 keeps the kernels and libtorch's
// operations).
bool half_width(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf; }

// a·b, plus bias along the rows where it is defined (a [r, k], b [k, c]; b is a weight's .t() view
// in the forward products), written to out: through the registered product (the fastest of
// cuBLASLt's algorithms and libtorch's call, timed at the first product of a shape) where it takes
// the tensors, else libtorch's.
void product_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias = at::Tensor()) {
  const auto* k = kernels_for(a);
  if (k && half_width(a)) {
    auto* pb = bias.defined() ? const_cast<at::Tensor*>(&bias) : nullptr;
    if (ran(k, &zb_node_kernels::matmul, a, const_cast<at::Tensor*>(&a), const_cast<at::Tensor*>(&b), pb, &out)) return;
  }
  if (bias.defined()) {
    at::addmm_out(out, bias, a, b);
  } else {
    at::mm_out(out, a, b);
  }
}

// product_into a new tensor.
at::Tensor product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias = at::Tensor()) {
  auto out = at::empty({a.size(0), b.size(1)}, a.options());
  product_into(out, a, b, bias);
  return out;
}

// res + x·wᵀ + b over rows (x [T, k], res [T, n]): the addition in the product's epilogue where the
// registered one takes the tensors, else libtorch's product with its bias and then the addition
// (in place on the product, so the same sum as res + product).
at::Tensor residual_addmm(const at::Tensor& res, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const auto* k = kernels_for(x);
  if (k && half_width(x)) {
    auto r = res.contiguous();
    auto xc = x.contiguous();
    auto out = at::empty({xc.size(0), w.size(0)}, xc.options());
    if (ran(k, &zb_node_kernels::residual, xc, &r, &xc, const_cast<at::Tensor*>(&w), const_cast<at::Tensor*>(&b), &out))
      return out;
  }
  return at::addmm(b, x, w.t()).add_(res);
}

// The MLP's first layer and GELU, h = x·w1ᵀ + b1 and gelu_tanh(h), from the rows of its normalised
// input: in one product where the registered epilogue takes the tensors, else a product and the
// GELU's kernel.
std::pair<at::Tensor, at::Tensor> mlp_up(const at::Tensor& xn, const at::Tensor& w1, const at::Tensor& b1) {
  const auto* k = kernels_for(xn);
  if (k && half_width(xn)) {
    auto x = xn.contiguous();
    auto h = at::empty({x.size(0), w1.size(0)}, x.options());
    auto a = at::empty_like(h);
    if (ran(k, &zb_node_kernels::gelu_up, x, &x, const_cast<at::Tensor*>(&w1), const_cast<at::Tensor*>(&b1), &h, &a))
      return {h, a};
  }
  auto h = at::addmm(b1, xn, w1.t());
  return {h, gelu_tanh(h)};
}

// A layer norm's output (rows of x's last dimension) with its per-row mean and reciprocal standard
// deviation, and whether the worker's kernel computed them.
struct Normed {
  at::Tensor y, mean, rstd;
  bool kernel;
};

Normed norm(at::Tensor x, at::Tensor gamma, at::Tensor beta, double eps) {
  if (const auto* k = kernels_for(x)) {
    auto y = at::empty_like(x, at::MemoryFormat::Contiguous);
    auto mean = at::empty(with_last(x, 1), x.options().dtype(at::kFloat));
    auto rstd = at::empty(with_last(x, 1), x.options().dtype(at::kFloat));
    if (ran(k, &zb_node_kernels::ln_forward, x, &x, &gamma, &beta, eps, &y, &mean, &rstd))
      return {y, mean, rstd, true};
  }
  auto [y, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, gamma, beta, eps);
  return {y, mean, rstd, false};
}

// What a layer norm's node keeps from its forward pass: its input (which the residual stream keeps
// anyway), its parameters and, small beside x, the mean and reciprocal deviation, not the output.
struct LnSaved {
  at::Tensor x, gamma, beta, mean, rstd;
  double eps;
  bool kernel;
};

// Gradients written in place (zb_grad_into): for a parameter, the flat buffer and the
// element where its gradient goes, whether the gradient adds to what is there (a later
// micro-step's) or replaces it, and whether a node has written it. Keyed by the parameter's
// TensorImpl: a node's saved leaf is the parameter itself. Registered and taken on the thread
// that runs backward; the lock keeps a stray caller safe.
struct GradInto {
  at::Tensor buf;
  int64_t offset;
  bool accumulate;
  bool taken;
};
std::mutex grad_into_mutex;
std::unordered_map<const c10::TensorImpl*, GradInto> grad_into;

// Where the engine placed p's gradient, and what is there already: earlier micro-steps' sum
// (accumulate), or another use's gradient from earlier in this backward (taken: a tied weight's).
struct Place {
  at::Tensor dest;
  bool accumulate;
  bool taken;
  bool add() const { return accumulate || taken; }
};

// p's place, now taken; none where the engine placed nothing, or, with fresh_only, where something
// is there already (left untaken then).
std::optional<Place> take_place(const at::Tensor& p, bool fresh_only = false) {
  std::lock_guard<std::mutex> lock(grad_into_mutex);
  auto it = grad_into.find(p.unsafeGetTensorImpl());
  if (it == grad_into.end()) return std::nullopt;
  auto& g = it->second;
  if (fresh_only && (g.accumulate || g.taken)) return std::nullopt;
  Place place{g.buf.narrow(0, g.offset, p.numel()).view(p.sizes()), g.accumulate, g.taken};
  g.taken = true;
  return place;
}

// Where the engine placed p's gradient and nothing is there to add to (the micro-step's first
// write, not accumulated): that place, now taken, for a kernel to write into; else undefined.
at::Tensor fresh_place(const at::Tensor& p) {
  auto place = take_place(p, /*fresh_only=*/true);
  return place ? place->dest : at::Tensor();
}

// Where a node computes the gradient of a vector parameter (a bias, a layer norm's scale or shift):
// its place in the engine's buffer when fresh_place gives one, else a fresh tensor. The node
// returns no gradient for a placed parameter, so autograd leaves its .grad alone and the engine
// copies nothing for it.
struct GradOut {
  at::Tensor t;
  bool placed;
  at::Tensor returned() const { return placed ? at::Tensor() : t; }
  // A gradient computed elsewhere (libtorch's), as this output: copied into the place, or itself.
  at::Tensor returned(const at::Tensor& computed) const {
    if (!placed) return computed;
    t.copy_(computed);
    return at::Tensor();
  }
};

GradOut grad_out(const at::Tensor& p) {
  auto place = fresh_place(p);
  if (place.defined()) return {place, true};
  return {at::empty_like(p, at::MemoryFormat::Contiguous), false};
}

// The gradient of bias `b` of a linear layer whose output gradient is `gy` (rows).
at::Tensor bias_grad(const at::Tensor& b, at::Tensor gy) {
  auto out = grad_out(b);
  const auto* k = kernels_for(gy);
  if (!(k && ran(k, &zb_node_kernels::col_sum, gy, &gy, &out.t))) at::sum_out(out.t, gy, {0});
  return out.returned();
}

// The output gradient (rows) of a linear layer whose output went on as `parts` equal blocks of
// its columns, from the blocks' gradients, and the gradient of its bias `b`. Three blocks (GPT-2's
// q, k and v) are joined on CUDA by a kernel that sums the columns as it copies them, where
// autograd's join of a split and a column sum would read the joined gradient again.
std::pair<at::Tensor, at::Tensor> joined_grad_and_bias(const at::Tensor& b, const variable_list& parts) {
  if (parts.size() == 1) {
    auto gy = rows(parts[0]);
    return {gy, bias_grad(b, gy)};
  }
  std::vector<at::Tensor> blocks;
  for (const auto& g : parts) blocks.push_back(rows(g).contiguous());
  auto out = grad_out(b);
  if (const auto* k = blocks.size() == 3 ? kernels_for(blocks[0]) : nullptr) {
    auto gy = at::empty({blocks[0].size(0), b.numel()}, blocks[0].options());
    if (ran(k, &zb_node_kernels::join_col_sum, gy, &blocks[0], &blocks[1], &blocks[2], &gy, &out.t))
      return {gy, out.returned()};
  }
  auto gy = at::cat(blocks, 1);
  at::sum_out(out.t, gy, {0});
  return {gy, out.returned()};
}

// From the GELU's output gradient `g` (rows, a temporary it may overwrite) and input `h`: the
// GELU's output recomputed (as `gelu_tanh` computes it), its input gradient, and the gradient of
// bias `b1` of the linear layer that computed `h`; on CUDA in one pass over `h`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gelu_recompute_backward_and_bias(at::Tensor g, at::Tensor h,
                                                                                const at::Tensor& b1) {
  auto out = grad_out(b1);
  if (const auto* k = kernels_for(g)) {
    auto act = at::empty_like(h, at::MemoryFormat::Contiguous);
    if (ran(k, &zb_node_kernels::gelu_backward_col_sum, g, &g, &h, &act, &out.t)) return {act, g, out.returned()};
  }
  auto gh = at::gelu_backward(g, h, "tanh");
  at::sum_out(out.t, gh, {0});
  return {gelu_tanh(h), gh, out.returned()};
}

// A layer norm's input, weight and bias gradients from its output's gradient `gxn`, with
// `residual` (the gradient of a residual stream that is also the layer norm's input) added to the
// input gradient, and its output again (`xn`, which the weight gradient of the product after it
// takes). Where the forward pass ran the worker's kernel, one kernel computes all of them from
// the forward's mean and deviation, and so the forward's bits of `xn`; elsewhere the output is
// recomputed and libtorch's backward runs, the residual added after it.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ln_backward(at::Tensor gxn, const LnSaved& ln,
                                                                       const at::Tensor& residual = at::Tensor()) {
  auto x = ln.x, gamma = ln.gamma, beta = ln.beta, mean = ln.mean, rstd = ln.rstd;
  auto ggamma = grad_out(gamma), gbeta = grad_out(beta);
  const auto* k = ln.kernel ? kernels_for(x) : nullptr;
  if (k) {
    auto gx = at::empty_like(x, at::MemoryFormat::Contiguous);
    auto xn = at::empty_like(x, at::MemoryFormat::Contiguous);
    auto res = residual.defined() ? residual.contiguous() : at::Tensor();
    auto* dres = res.defined() ? &res : nullptr;
    if (ran(k, &zb_node_kernels::ln_backward, x, &gxn, &x, &mean, &rstd, &gamma, &beta, dres, &gx, &xn, &ggamma.t,
            &gbeta.t))
      return {gx, ggamma.returned(), gbeta.returned(), xn};
  }
  auto xn = norm(x, gamma, beta, ln.eps).y;
  auto [gx, gg, gb] =
      at::native_layer_norm_backward(gxn, x, {x.size(-1)}, mean, rstd, gamma, beta, {true, true, true});
  if (residual.defined()) gx.add_(residual);
  return {gx, ggamma.returned(gg), gbeta.returned(gb), xn};
}

// Saves what ln_backward needs of the layer norm `normed` of x in ctx.
void save_ln(AutogradContext* ctx, const Normed& normed, double eps) {
  ctx->saved_data["eps"] = eps;
  ctx->saved_data["kernel"] = normed.kernel;
  ctx->saved_data["mean"] = normed.mean;
  ctx->saved_data["rstd"] = normed.rstd;
}

LnSaved saved_ln(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta) {
  return {x,
          gamma,
          beta,
          ctx->saved_data["mean"].toTensor(),
          ctx->saved_data["rstd"].toTensor(),
          ctx->saved_data["eps"].toDouble(),
          ctx->saved_data["kernel"].toBool()};
}

// w's gradient a·b. Where the engine placed it, the product goes straight there (added by a later
// use of w in the same backward, or where the engine accumulates) and the node returns no
// gradient for w, so autograd leaves w's .grad alone; elsewhere a fresh tensor, as autograd's.
at::Tensor weight_grad(const at::Tensor& w, const at::Tensor& a, const at::Tensor& b) {
  auto place = take_place(w);
  if (!place) return product(a, b);
  if (place->add()) {
    place->dest.addmm_(a, b);
  } else {
    product_into(place->dest, a, b);
  }
  return at::Tensor();
}

// res + linear(x) = res + x·wᵀ + b: a sub-block's output projection and its residual addition
// (residual_addmm), whose bias gradient goes through bias_grad (the worker's column sum on CUDA:
// libtorch's bias reductions ran at about two fifths of the memory's bandwidth on gpt2,
// docs/results/one-gpu.md). The residual's gradient is the output's, passed on.
struct ResidualLinear : torch::autograd::Function<ResidualLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& res, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b) {
    ctx->save_for_backward({x, w, b});
    return residual_addmm(rows(res), rows(x), w, b).view(res.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const auto &x = s[0], &w = s[1], &b = s[2];
    auto gy = rows(grads[0]);
    return {grads[0], product(gy, w).view(x.sizes()), weight_grad(w, gy.t(), rows(x)), bias_grad(b, gy)};
  }
};

// linear(layer_norm(x)) as `parts` equal blocks of its columns (views of one output: GPT-2's q, k
// and v), and x itself: keeps x (which the residual stream keeps anyway), not the normalised x,
// which the layer norm's backward recomputes. The blocks' gradients come back here apart and are
// joined with the bias gradient's column sums (joined_grad_and_bias), not by autograd's join of a
// split. The last output is x passed on (autograd makes it a view of x with this node as its
// origin) for the residual addition after the sub-block: its gradient comes back here and the
// layer norm's backward adds it to x's, as the MLP's node adds its own residual's, where autograd
// would otherwise sum the two in a kernel of its own.
struct LnLinear : torch::autograd::Function<LnLinear> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma,
                               const at::Tensor& beta, const at::Tensor& w, const at::Tensor& b, double eps,
                               int64_t parts) {
    TORCH_CHECK(parts >= 1 && w.size(0) % parts == 0, "ln_linear: ", w.size(0), " outputs in ", parts, " parts");
    auto normed = norm(x, gamma, beta, eps);
    ctx->save_for_backward({x, gamma, beta, w, b});
    save_ln(ctx, normed, eps);
    ctx->saved_data["parts"] = parts;
    auto y = product(rows(normed.y), w.t(), b).view(with_last(x, w.size(0)));
    variable_list outs = parts == 1 ? variable_list{y} : y.split(w.size(0) / parts, -1);
    outs.push_back(x);
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const auto &x = s[0], &gamma = s[1], &beta = s[2], &w = s[3], &b = s[4];
    const auto parts = ctx->saved_data["parts"].toInt();
    auto [gy, gb] = joined_grad_and_bias(b, variable_list(grads.begin(), grads.begin() + parts));
    auto gxn = product(gy, w).view(x.sizes());
    // The passed-on x's gradient (zeros, as autograd materialises it, where nothing used it).
    auto [gx, ggamma, gbeta, xn] = ln_backward(gxn, saved_ln(ctx, x, gamma, beta), grads[parts]);
    gxn.reset();
    auto gw = weight_grad(w, gy.t(), rows(xn));
    return {gx, ggamma, gbeta, gw, gb, at::Tensor(), at::Tensor()};
  }
};

// x + w2·gelu_tanh(w1·layer_norm(x) + b1) + b2, the MLP sub-block with its residual addition: keeps
// x and the GELU's input, not the normalised x or the GELU's output (four times x's size).
struct ResidualLnGeluMlp : torch::autograd::Function<ResidualLnGeluMlp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                            const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2,
                            double eps) {
    auto normed = norm(x, gamma, beta, eps);
    auto [h, a] = mlp_up(rows(normed.y), w1, b1);
    auto y = residual_addmm(rows(x), a, w2, b2);
    a.reset();
    ctx->save_for_backward({x, gamma, beta, w1, w2, h, b1, b2});
    save_ln(ctx, normed, eps);
    return y.view(with_last(x, w2.size(0)));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const auto &x = s[0], &gamma = s[1], &beta = s[2], &w1 = s[3], &w2 = s[4], &h = s[5], &b1 = s[6], &b2 = s[7];
    auto gy = rows(grads[0]);
    auto gb2 = bias_grad(b2, gy);
    auto [act, gh, gb1] = gelu_recompute_backward_and_bias(product(gy, w2), rows(h), b1);
    auto gw2 = weight_grad(w2, gy.t(), act);
    act.reset();
    auto gxn = product(gh, w1).view(x.sizes());
    // The residual's gradient joins the layer norm's (what autograd's sum of the two did).
    auto [gx, ggamma, gbeta, xn] = ln_backward(gxn, saved_ln(ctx, x, gamma, beta), grads[0]);
    gxn.reset();
    auto gw1 = weight_grad(w1, gh.t(), rows(xn));
    return {gx, ggamma, gbeta, gw1, gb1, gw2, gb2, at::Tensor()};
  }
};

// x·u in x's precision, u the upstream gradient (a 0-dim fp32 tensor: the trainer's loss multiplier):
// the fp32 product, rounded once. libtorch's mul of a 16-bit x by u would round u to 16 bits first
// (1/3 off in bf16; an fp16 loss scale of 2^16 infinite), and its kernel for mixed element types is
// not vectorized (0.31 ms for the head's two gradients in a gpt2-xl step): on CUDA the worker's
// kernel, elsewhere the product taken in fp32. Written to out (x's shape, contiguous).
void scaled_into(const at::Tensor& x, const at::Tensor& u, at::Tensor out) {
  if (const auto* k = kernels_for(x)) {
    auto xc = x, uc = u;
    if (ran(k, &zb_node_kernels::scale, x, &xc, &uc, &out)) return;
  }
  if (x.scalar_type() == at::kFloat) {
    at::mul_out(out, x, u);
  } else {
    out.copy_(x.to(at::kFloat).mul_(u));
  }
}

at::Tensor scaled(const at::Tensor& x, const at::Tensor& u) {
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  scaled_into(x, u, out);
  return out;
}

// The LM head's loss, whose gradients the forward pass already computed (model/lm_head.rs):
// returns `loss` (a value without history), and its backward gives h and w the gradients gh and
// gw times the upstream gradient, one product each, instead of autograd deriving them from a
// surrogate expression over h and w. Where the engine placed w's gradient and nothing is there
// yet, w's product is written there (GPT-2's tied weight: the embedding's backward then adds to
// it, see Embedding), not into a tensor autograd hands on.
struct GivenGrads : torch::autograd::Function<GivenGrads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& loss, const at::Tensor& h, const at::Tensor& w,
                            const at::Tensor& gh, const at::Tensor& gw) {
    TORCH_CHECK(gh.sizes() == h.sizes() && gw.sizes() == w.sizes(),
                "given gradients: their shapes are not those of the inputs");
    // Kept as values, not saved variables: nothing else holds or changes them. w (a leaf, so no
    // cycle) is kept for its place.
    ctx->saved_data["gh"] = gh;
    ctx->saved_data["gw"] = gw;
    ctx->saved_data["w"] = w;
    return loss.detach().clone();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto gh = ctx->saved_data["gh"].toTensor();
    auto gw = ctx->saved_data["gw"].toTensor();
    auto out = grad_out(ctx->saved_data["w"].toTensor());
    scaled_into(gw, grads[0], out.t);
    return {at::Tensor(), scaled(gh, grads[0]), out.returned(), at::Tensor(), at::Tensor()};
  }
};

// w[indices] (an embedding lookup) as an autograd node whose backward adds the output gradient's
// rows (index_put_ with accumulate: sorted by index, each row added in a fixed order) to w's
// gradient where it already lies: into .grad where another use left it there (the tied LM head's,
// handed to autograd), else into the place the engine gave w (after the head's product, which
// the head's node wrote there; zeroed first where nothing is), and hands autograd nothing. Either
// way the head's gradient gets the rows added to it in the same order, so the bits do not depend
// on whether the engine placed w (an offloaded unit's are not). Where neither holds the head's
// gradient and the place holds earlier micro-steps' (or there is no place), the rows are summed
// into a gradient of their own that autograd hands on, as its embedding backward would. Autograd's
// embedding backward instead fills a w-sized tensor with zeros, sums the rows into it, and leaves
// AccumulateGrad to add it to the head's gradient, which the engine then copies to the place: for
// GPT-2's tied 50257-row weight three passes over it a step (the fill, the addition, the copy).
struct Embedding : torch::autograd::Function<Embedding> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, const at::Tensor& indices) {
    ctx->saved_data["w"] = w;
    ctx->save_for_backward({indices});
    return at::embedding(w, indices);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto w = ctx->saved_data["w"].toTensor();
    auto indices = ctx->get_saved_variables()[0];
    auto add_rows = [&](at::Tensor target) {
      c10::List<std::optional<at::Tensor>> rows;
      rows.push_back(indices.reshape({-1}));
      // Unchecked: the forward's lookup already checked the indices against w's rows
      // (index_put_'s check is four more kernels a call, its range reduced and asserted on the
      // device).
      at::_index_put_impl_(target, rows, grads[0].reshape({-1, w.size(1)}), /*accumulate=*/true, /*unsafe=*/true);
    };
    // Where the rows go to .grad the place stays untaken: the engine moves .grad into it.
    if (w.grad().defined()) {
      add_rows(w.mutable_grad());
      return {at::Tensor(), at::Tensor()};
    }
    auto place = take_place(w);
    if (place && !place->accumulate) {
      if (!place->taken) place->dest.zero_();
      add_rows(place->dest);
      return {at::Tensor(), at::Tensor()};
    }
    auto own = at::zeros_like(w, at::MemoryFormat::Contiguous);
    add_rows(own);
    return {own, at::Tensor()};
  }
};

typedef int (*zb_in_backward_fn)(void* data);

// x -> x.clone(), whose backward calls fn(data) with gradients on and passes the gradient
// through. fn's failure becomes an exception, which autograd carries back to the thread that called
// backward.
struct InBackward : torch::autograd::Function<InBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t fn, int64_t data) {
    ctx->saved_data["fn"] = fn;
    ctx->saved_data["data"] = data;
    return x.clone();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto fn = reinterpret_cast<zb_in_backward_fn>(ctx->saved_data["fn"].toInt());
    // Backward runs its nodes with gradients off; fn builds graphs (the loss scaling) and runs
    // backward passes of its own, as the caller's thread would, with them on.
    at::AutoGradMode grad_mode(true);
    if (fn(reinterpret_cast<void*>(ctx->saved_data["data"].toInt())) != 0) {
      throw std::runtime_error("the function run inside backward failed");
    }
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

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

int zb_run_in_backward(int device, zb_in_backward_fn fn, void* data) {
  return guarded([&] {
    auto opts = at::TensorOptions().dtype(at::kFloat);
    opts = device < 0 ? opts.device(at::kCPU) : opts.device(at::Device(at::kCUDA, device));
    auto x = at::zeros({1}, opts).requires_grad_(true);
    auto y = InBackward::apply(x, reinterpret_cast<int64_t>(fn), reinterpret_cast<int64_t>(data));
    torch::autograd::backward({y}, {at::ones_like(y)}, /*retain_graph=*/false, /*create_graph=*/false);
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

// Gives the allocator's cached free blocks back to CUDA, after waiting for the frees still pending
// on any stream: the self-check reads what a forward pass leaves allocated once every free has
// settled.
int zb_cuda_empty_cache() {
  return guarded([&] { c10::getDeviceAllocator(c10::kCUDA)->emptyCache(); });
}

// libtorch's current stream on the calling thread becomes `stream` (a CUstream of this process's
// context on device `device`): its operators run there from now on.
int zb_cuda_set_stream(void* stream, int device) {
  return guarded([&] {
    c10::cuda::setCurrentCUDAStream(
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), static_cast<c10::DeviceIndex>(device)));
  });
}

// libtorch's current stream on the calling thread for device `device`, into `out` (a CUstream).
int zb_cuda_current_stream(int device, void** out) {
  return guarded([&] {
    *out = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  });
}

// From now on, what libtorch allocates on `stream` comes from private pool `pool` (created on first
// use, one more use each call) until zb_cuda_pool_end.
int zb_cuda_pool_begin(int device, uint64_t pool, void* stream) {
  return guarded([&] {
    const auto s = static_cast<cudaStream_t>(stream);
    c10::cuda::CUDACachingAllocator::beginAllocateToPool(
        static_cast<c10::DeviceIndex>(device), {0, pool}, [s](cudaStream_t t) { return t == s; });
  });
}

int zb_cuda_pool_end(int device, uint64_t pool) {
  return guarded([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(static_cast<c10::DeviceIndex>(device), {0, pool}); });
}

// Gives up one use of pool `pool`; after the last, its free blocks return to the allocator.
int zb_cuda_pool_release(int device, uint64_t pool) {
  return guarded([&] { c10::cuda::CUDACachingAllocator::releasePool(static_cast<c10::DeviceIndex>(device), {0, pool}); });
}

// Starts libtorch's profiler on this thread (the autograd engine carries it into its device
// threads): host operators, plus CUDA kernels and copies when `cuda` is set.
int zb_profiler_start(int cuda) {
  return guarded([&] {
    namespace prof = torch::profiler::impl;
    std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
    if (cuda) activities.insert(prof::ActivityType::CUDA);
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  });
}

// Stops the profiler started by zb_profiler_start and writes its Chrome trace to `path`.
int zb_profiler_stop(const char* path) {
  return guarded([&] { torch::autograd::profiler::disableProfiler()->save(path); });
}

int zb_cuda_reset_peak(int device) {
  return guarded([&] { c10::getDeviceAllocator(c10::kCUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(device)); });
}

// The store is handed to Rust as an owning pointer to its intrusive_ptr; zb_store_close drops it.
using StorePtr = c10::intrusive_ptr<c10d::TCPStore>;

int zb_store_open(const char* host, uint16_t port, int is_server, int world, int64_t timeout_ms, void** out) {
  // c10d logs every failed connection attempt with a stack trace before it throws, and the
  // worker reports the exception itself: unless TORCH_CPP_LOG_LEVEL asks for libtorch's logs,
  // only fatal ones are printed from here on.
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) {
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 3);
  }
  return guarded([&] {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    opts.numWorkers = static_cast<size_t>(world);
    // The server's constructor returns once every rank has connected, or throws at the timeout:
    // a rank that never arrives fails rank 0 instead of leaving it waiting.
    opts.waitWorkers = true;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    *out = new StorePtr(c10::make_intrusive<c10d::TCPStore>(std::string(host), opts));
  });
}

int zb_store_set(void* store, const char* key, const uint8_t* data, size_t len) {
  return guarded([&] { (*static_cast<StorePtr*>(store))->set(key, std::vector<uint8_t>(data, data + len)); });
}

// Waits (up to the store's timeout) for `key`, then copies its value into `buf` if it fits; `len`
// gets the value's length either way.
int zb_store_get(void* store, const char* key, uint8_t* buf, size_t cap, size_t* len) {
  return guarded([&] {
    std::vector<uint8_t> v = (*static_cast<StorePtr*>(store))->get(key);
    *len = v.size();
    if (v.size() > cap) {
      throw std::runtime_error("store value of " + std::string(key) + " is " + std::to_string(v.size()) +
                               " bytes, more than the " + std::to_string(cap) + " expected");
    }
    std::memcpy(buf, v.data(), v.size());
  });
}

void zb_store_close(void* store) { delete static_cast<StorePtr*>(store); }

int zb_host_zeros(int64_t n, int scalar_type, void** out) {
  return guarded([&] {
    const auto dtype = static_cast<at::ScalarType>(scalar_type);
    const size_t bytes = static_cast<size_t>(n) * c10::elementSize(dtype);
    constexpr size_t kHuge = size_t{2} << 20;
    if (bytes < kHuge) {
      *out = new at::Tensor(at::zeros({n}, at::TensorOptions().dtype(dtype)));
      return;
    }
    // One huge page of slack so that an aligned start exists; the slack is given back at once.
    const size_t span = bytes + kHuge;
    void* map = span < bytes ? MAP_FAILED
                             : mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
      // The words of libtorch's CPU allocator, which the worker reports as an out-of-memory result.
      throw std::runtime_error("zb_host_zeros: can't allocate memory: you tried to allocate " + std::to_string(bytes) +
                               " bytes");
    }
    // The mapping's own length, whole pages: the slack after it starts on a page boundary.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t len = (bytes + page - 1) / page * page;
    const auto start = reinterpret_cast<uintptr_t>(map);
    const uintptr_t aligned = (start + kHuge - 1) & ~(kHuge - 1);
    if (aligned > start) munmap(map, aligned - start);
    if (start + span > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), start + span - (aligned + len));
    void* p = reinterpret_cast<void*>(aligned);
    // Advice only: where huge pages are off the memory stays in 4 KiB pages and works the same.
    (void)madvise(p, len, MADV_HUGEPAGE);
    *out = new at::Tensor(
        at::from_blob(p, {n}, [len](void* q) { munmap(q, len); }, at::TensorOptions().dtype(dtype)));
  });
}

// A process group is handed to Rust like the store; zb_gloo_close drops it (and its connections).
using GlooPtr = c10::intrusive_ptr<c10d::ProcessGroupGloo>;

static c10d::ProcessGroupGloo& group_of(void* pg) { return **static_cast<GlooPtr*>(pg); }

// The group of `size` ranks (this one `rank`) that meet under `prefix` in `store`, each listening
// on `host`'s address. Connecting is bounded by `connect_ms`, every collective after it by
// `op_ms`.
int zb_gloo_open(void* store, const char* prefix, const char* host, int rank, int size, int64_t connect_ms,
                 int64_t op_ms, void** out) {
  return guarded([&] {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, *static_cast<StorePtr*>(store));
    auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(connect_ms));
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
    // The worker waits for each collective before it issues the next: one thread runs them all.
    opts->threads = 1;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
    pg->setTimeout(std::chrono::milliseconds(op_ms));
    *out = new GlooPtr(std::move(pg));
  });
}

int zb_gloo_all_reduce(void* pg, at::Tensor* buf) {
  return guarded([&] {
    std::vector<at::Tensor> v{*buf};
    group_of(pg).allreduce(v)->wait();
  });
}

// `output` may be this rank's slice of `input`.
int zb_gloo_reduce_scatter(void* pg, at::Tensor* input, at::Tensor* output) {
  return guarded([&] {
    at::Tensor in = *input, out = *output;
    group_of(pg)._reduce_scatter_base(out, in)->wait();
  });
}

// `input` may be this rank's slice of `output`.
int zb_gloo_all_gather(void* pg, at::Tensor* input, at::Tensor* output) {
  return guarded([&] {
    at::Tensor in = *input, out = *output;
    group_of(pg)._allgather_base(out, in)->wait();
  });
}

int zb_gloo_broadcast(void* pg, at::Tensor* buf, int root) {
  return guarded([&] {
    std::vector<at::Tensor> v{*buf};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    group_of(pg).broadcast(v, opts)->wait();
  });
}

void zb_gloo_close(void* pg) { delete static_cast<GlooPtr*>(pg); }

// Registers the nodes' kernels (copied; nullptr members stay libtorch's operations).
int zb_set_node_kernels(const zb_node_kernels* k) {
  return guarded([&] { node_kernels.store(new zb_node_kernels(*k)); });
}

int zb_residual_linear(at::Tensor* res, at::Tensor* x, at::Tensor* w, at::Tensor* b, void** out) {
  return guarded([&] { *out = new at::Tensor(ResidualLinear::apply(*res, *x, *w, *b)); });
}

int zb_given_grads(at::Tensor* loss, at::Tensor* h, at::Tensor* w, at::Tensor* gh, at::Tensor* gw, void** out) {
  return guarded([&] { *out = new at::Tensor(GivenGrads::apply(*loss, *h, *w, *gh, *gw)); });
}

int zb_embedding(at::Tensor* w, at::Tensor* indices, void** out) {
  return guarded([&] {
    TORCH_CHECK(w->dim() == 2, "an embedding's weight is a matrix");
    *out = new at::Tensor(Embedding::apply(*w, *indices));
  });
}

int zb_ln_linear(at::Tensor* x, at::Tensor* gamma, at::Tensor* beta, at::Tensor* w, at::Tensor* b, double eps,
                 int64_t parts, void** out, void** passed) {
  return guarded([&] {
    auto outs = LnLinear::apply(*x, *gamma, *beta, *w, *b, eps, parts);
    for (int64_t i = 0; i < parts; ++i) out[i] = new at::Tensor(outs[i]);
    *passed = new at::Tensor(outs[parts]);
  });
}

int zb_residual_ln_gelu_mlp(at::Tensor* x, at::Tensor* gamma, at::Tensor* beta, at::Tensor* w1, at::Tensor* b1,
                            at::Tensor* w2, at::Tensor* b2, double eps, void** out) {
  return guarded(
      [&] { *out = new at::Tensor(ResidualLnGeluMlp::apply(*x, *gamma, *beta, *w1, *b1, *w2, *b2, eps)); });
}

// From now until zb_take_grads, the nodes write `param`'s gradient into `buf[offset ..]` (a flat
// buffer of the parameter's kind and device), adding to what is there when `accumulate`.
int zb_grad_into(at::Tensor* param, at::Tensor* buf, int64_t offset, int accumulate) {
  return guarded([&] {
    TORCH_CHECK(buf->dim() == 1 && buf->is_contiguous(), "a gradient's place: the buffer is not flat");
    TORCH_CHECK(buf->scalar_type() == param->scalar_type() && buf->device() == param->device(),
                "a gradient's place: the buffer's kind or device is not the parameter's");
    TORCH_CHECK(offset >= 0 && offset + param->numel() <= buf->numel(),
                "a gradient's place: elements ", offset, " + ", param->numel(), " lie past the buffer's ",
                buf->numel());
    std::lock_guard<std::mutex> lock(grad_into_mutex);
    grad_into[param->unsafeGetTensorImpl()] = GradInto{*buf, offset, accumulate != 0, false};
  });
}

// Moves the gradients of a unit's n parameters into `buf`, parameter i's from element offsets[i]
// on, added to what is there when `add` (a later micro-step), and ends their places
// (zb_grad_into). Those the nodes wrote stay, plus whatever other uses left in .grad; the rest
// come from .grad (zeros where a parameter got none): in one cat where they are neighbours (every
// parameter of a unit nothing was placed in, as before places), else in one multi-tensor copy,
// not a launch each. Every .grad is dropped. `*placed` counts the parameters the nodes wrote.
int zb_take_grads(at::Tensor** params, const int64_t* offsets, int n, at::Tensor* buf, int add, int* placed) {
  return guarded([&] {
    // The parameters to copy from .grad (zeros where there is none), in order. Their places in
    // `buf` are cut only where they are not one run: a unit nothing was placed in takes one
    // narrow, as before places, not one per parameter.
    std::vector<int> rest;
    std::vector<at::Tensor> srcs;
    bool one_run = true;
    *placed = 0;
    {
      std::lock_guard<std::mutex> lock(grad_into_mutex);
      for (int i = 0; i < n; ++i) {
        at::Tensor& p = *params[i];
        auto it = grad_into.find(p.unsafeGetTensorImpl());
        const bool taken = it != grad_into.end() && it->second.taken;
        if (it != grad_into.end()) grad_into.erase(it);
        const at::Tensor& g = p.grad();
        if (taken) {
          *placed += 1;
          if (g.defined()) buf->narrow(0, offsets[i], p.numel()).add_(g.reshape({-1}));
          continue;
        }
        if (!rest.empty() && offsets[i] != offsets[rest.back()] + params[rest.back()]->numel()) one_run = false;
        rest.push_back(i);
        srcs.push_back(g.defined() ? g.reshape({-1}) : at::zeros({p.numel()}, buf->options()));
      }
    }
    if (one_run && !rest.empty()) {
      const int last = rest.back();
      auto dst = buf->narrow(0, offsets[rest.front()], offsets[last] + params[last]->numel() - offsets[rest.front()]);
      if (add) {
        dst.add_(at::cat(srcs));
      } else {
        at::cat_out(dst, srcs);
      }
    } else if (!rest.empty()) {
      std::vector<at::Tensor> dsts;
      dsts.reserve(rest.size());
      for (int i : rest) dsts.push_back(buf->narrow(0, offsets[i], params[i]->numel()));
      if (add) {
        at::_foreach_add_(dsts, srcs);
      } else {
        at::_foreach_copy_(dsts, srcs);
      }
    }
    for (int i = 0; i < n; ++i) params[i]->mutable_grad().reset();
  });
}

}  // extern "C"
