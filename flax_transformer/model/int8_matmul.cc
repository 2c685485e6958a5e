// The int8 product of `model.quantization` through oneDNN, as an XLA FFI handler for the CPU.
//
//   FtInt8Matmul(x int8 [*b, M, K], w int8 [*b, K, N]) -> int32 [*b, M, N]
//
// Leading (batch) axes broadcast where one side has size 1 (jax.ffi.ffi_call's
// vmap_method="expand_dims" gives an unbatched operand size-1 axes). Integer products are exact,
// so the result equals XLA's dot_general with preferred_element_type=int32 bit for bit, on
// every CPU where oneDNN's kernel does not saturate: `FtInt8Exact` says whether this one is such
// a CPU (VNNI or AMX: vpdpbusd and the tile products accumulate in int32; without VNNI,
// oneDNN's int8 kernels pass through vpmaddubsw's saturating int16 pairs).
//
// `variant` 0 runs oneDNN's matmul primitive (brgemm: AMX tiles where the CPU has them, VNNI
// elsewhere), its plans cached per shape; 1 runs the BLAS-like dnnl_gemm_s8s8s32 (no plan).
//
//   FtInt8MatmulPacked(x int8 [*b, M, K], packed uint8 [*1, P]; k, n) -> int32 [*b, M, N]
//
// runs the matmul primitive on weights packed once into its own layout (`FtInt8Pack`, when a
// model is loaded), the same int32 products without the repacking of every call.
//
// Where the weights have no batch of their own (every leading axis of w is 1, and always for
// packed weights), x's batch is folded into its rows: one product of [b x M, K], not b products
// of M rows. Under the engine's vmap over slots a dense layer's x is [G slots, rows, K], and a
// product of each slot's few rows (a beam's 4) alone costs oneDNN's per-call overhead G times.
// The int32 results are exact either way.
// Built and loaded by flax_transformer/model/int8_kernel.py.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One matmul plan per (M, K, N), created once: a primitive's creation costs far more than a
// small product. Its scratchpad is the caller's (scratchpad_mode::user): XLA calls the handler
// from several threads at once (a device each), and oneDNN's own scratchpad is shared between
// primitives run concurrently unless oneDNN was built with DNNL_ENABLE_CONCURRENT_EXEC.
struct MatmulPlan {
  dnnl::matmul::primitive_desc desc;
  dnnl::matmul primitive;
};

const MatmulPlan& Plan(int64_t m, int64_t k, int64_t n) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<MatmulPlan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto& plan = plans[{m, k, n}];
  if (!plan) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    dnnl::memory::desc x_desc({m, k}, dt::s8, tag::ab);
    dnnl::memory::desc w_desc({k, n}, dt::s8, tag::ab);
    dnnl::memory::desc y_desc({m, n}, dt::s32, tag::ab);
    dnnl::primitive_attr attributes;
    attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc desc(Engine(), x_desc, w_desc, y_desc, attributes);
    plan = std::make_unique<MatmulPlan>(MatmulPlan{desc, dnnl::matmul(desc)});
  }
  return *plan;
}

void Run(const MatmulPlan& plan, const dnnl::memory& x, const dnnl::memory& w,
         const dnnl::memory& y) {
  thread_local std::vector<uint8_t> scratch;  // This thread's, grown to the largest plan's.
  const dnnl::memory::desc scratch_desc = plan.desc.scratchpad_desc();
  scratch.resize(std::max(scratch.size(), scratch_desc.get_size()));
  dnnl::memory scratch_memory(scratch_desc, Engine(), scratch.data());
  dnnl::stream stream(Engine());
  plan.primitive.execute(stream, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y},
                                  {DNNL_ARG_SCRATCHPAD, scratch_memory}});
  stream.wait();
}

void Product(const int8_t* x, const int8_t* w, int32_t* y, int64_t m, int64_t k, int64_t n,
             int64_t variant) {
  if (variant == 1) {
    const int32_t zero = 0;
    dnnl_gemm_s8s8s32('N', 'N', 'F', m, n, k, 1.0f, x, k, 0, w, n, 0, 0.0f, y, n, &zero);
    return;
  }
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  dnnl::memory x_memory({{m, k}, dt::s8, tag::ab}, Engine(), const_cast<int8_t*>(x));
  dnnl::memory w_memory({{k, n}, dt::s8, tag::ab}, Engine(), const_cast<int8_t*>(w));
  dnnl::memory y_memory({{m, n}, dt::s32, tag::ab}, Engine(), y);
  Run(Plan(m, k, n), x_memory, w_memory, y_memory);
}

// Weights packed once (`FtInt8Pack`, when a model is loaded) into the layout oneDNN's matmul
// primitive picks for int8 [K, N] weights on this CPU (`format_tag::any`): the primitive then
// reads them as they are, where plain [K, N] weights are repacked on every call (1.8-2.3x the
// plain call's speed at 16 rows on AMD EPYC Zen 4). oneDNN picks one layout for every row count,
// so the packed weights are planned once, from a 16-row product, and every plan of any row
// count is made with that explicit layout: it is exact whatever oneDNN would have picked there.
const dnnl::memory::desc& PackedDesc(int64_t k, int64_t n) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t>, dnnl::memory::desc> descs;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = descs.find({k, n});
  if (found == descs.end()) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    dnnl::matmul::primitive_desc desc(Engine(), {{16, k}, dt::s8, tag::ab},
                                      {{k, n}, dt::s8, tag::any}, {{16, n}, dt::s32, tag::ab});
    found = descs.emplace(std::make_tuple(k, n), desc.weights_desc()).first;
  }
  return found->second;
}

const MatmulPlan& PackedPlan(int64_t m, int64_t k, int64_t n) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<MatmulPlan>> plans;
  const dnnl::memory::desc& w_desc = PackedDesc(k, n);
  std::lock_guard<std::mutex> lock(mutex);
  auto& plan = plans[{m, k, n}];
  if (!plan) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    dnnl::primitive_attr attributes;
    attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc desc(Engine(), {{m, k}, dt::s8, tag::ab}, w_desc,
                                      {{m, n}, dt::s32, tag::ab}, attributes);
    plan = std::make_unique<MatmulPlan>(MatmulPlan{desc, dnnl::matmul(desc)});
  }
  return *plan;
}

// x int8 [*b, M, K] times packed weights (uint8 [P], `FtInt8Pack`'s) of int8 [K, N] -> int32
// [*b, M, N]; the weights have no batch axes (every row of the batch uses them).
ffi::Error Int8MatmulPacked(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::U8> packed,
                            ffi::ResultBuffer<ffi::S32> y, int64_t k, int64_t n) {
  auto x_dims = x.dimensions();
  auto y_dims = y->dimensions();
  const size_t rank = x_dims.size();
  auto packed_dims = packed.dimensions();  // [P], or [1, ..., P] under vmap's expand_dims.
  if (rank < 2 || y_dims.size() != rank || packed_dims.size() < 1 ||
      !std::all_of(packed_dims.begin(), packed_dims.end() - 1, [](int64_t d) { return d == 1; })) {
    return ffi::Error::InvalidArgument(
        "int8 packed matmul: x [*b, M, K], packed weights [*1, P] and y [*b, M, N] only");
  }
  const int64_t m = x_dims[rank - 2];
  if (x_dims[rank - 1] != k || y_dims[rank - 2] != m || y_dims[rank - 1] != n) {
    return ffi::Error::InvalidArgument("int8 packed matmul: shapes [*b, M, K] -> [*b, M, N] only");
  }
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (x_dims[i] != y_dims[i]) {
      return ffi::Error::InvalidArgument("int8 packed matmul: x's and y's batch axes differ");
    }
    batch *= y_dims[i];
  }
  if (batch == 0 || m == 0 || n == 0) return ffi::Error::Success();
  try {
    const dnnl::memory::desc& w_desc = PackedDesc(k, n);
    if (static_cast<int64_t>(packed.element_count()) != static_cast<int64_t>(w_desc.get_size())) {
      return ffi::Error::InvalidArgument(
          "int8 packed matmul: the packed weights were not packed for this [K, N] on this CPU");
    }
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const int64_t rows = batch * m;  // x's batch folded into its rows (x is row-major).
    dnnl::memory w_memory(w_desc, Engine(), const_cast<uint8_t*>(packed.typed_data()));
    dnnl::memory x_memory({{rows, k}, dt::s8, tag::ab}, Engine(),
                          const_cast<int8_t*>(x.typed_data()));
    dnnl::memory y_memory({{rows, n}, dt::s32, tag::ab}, Engine(), y->typed_data());
    Run(PackedPlan(rows, k, n), x_memory, w_memory, y_memory);
  } catch (const dnnl::error& error) {
    return ffi::Error::Internal(std::string("int8 packed matmul (oneDNN): ") + error.what());
  }
  return ffi::Error::Success();
}

ffi::Error Int8Matmul(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w,
                      ffi::ResultBuffer<ffi::S32> y, int64_t variant) {
  auto x_dims = x.dimensions();
  auto w_dims = w.dimensions();
  auto y_dims = y->dimensions();
  const size_t rank = x_dims.size();
  if (rank < 2 || w_dims.size() != rank || y_dims.size() != rank) {
    return ffi::Error::InvalidArgument("int8 matmul: x, w and y must have one rank >= 2");
  }
  const int64_t m = x_dims[rank - 2], k = x_dims[rank - 1], n = w_dims[rank - 1];
  if (w_dims[rank - 2] != k || y_dims[rank - 2] != m || y_dims[rank - 1] != n) {
    return ffi::Error::InvalidArgument("int8 matmul: shapes [*b, M, K] x [*b, K, N] only");
  }
  // The batch: y's leading axes; x's and w's are equal to them or 1 (broadcast).
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if ((x_dims[i] != y_dims[i] && x_dims[i] != 1) || (w_dims[i] != y_dims[i] && w_dims[i] != 1)) {
      return ffi::Error::InvalidArgument("int8 matmul: batch axes must match or be 1");
    }
    batch *= y_dims[i];
  }
  if (batch == 0 || m == 0 || n == 0) return ffi::Error::Success();
  if (k == 0) {
    std::fill_n(y->typed_data(), batch * m * n, 0);
    return ffi::Error::Success();
  }
  const auto one = [](int64_t d) { return d == 1; };
  const bool shared = std::all_of(w_dims.begin(), w_dims.end() - 2, one);
  const bool whole = std::equal(x_dims.begin(), x_dims.end() - 2, y_dims.begin());
  try {
    if (shared && whole) {  // One set of weights for every batch row: one product of b x M rows.
      Product(x.typed_data(), w.typed_data(), y->typed_data(), batch * m, k, n, variant);
      return ffi::Error::Success();
    }
    for (int64_t b = 0; b < batch; ++b) {
      // b's index along each leading axis (the last varies fastest), and the operands' offsets.
      int64_t rest = b, x_offset = 0, w_offset = 0, x_stride = 1, w_stride = 1;
      for (size_t i = rank - 2; i-- > 0;) {
        const int64_t index = rest % y_dims[i];
        rest /= y_dims[i];
        if (x_dims[i] != 1) x_offset += index * x_stride;
        if (w_dims[i] != 1) w_offset += index * w_stride;
        x_stride *= x_dims[i];
        w_stride *= w_dims[i];
      }
      Product(x.typed_data() + x_offset * m * k, w.typed_data() + w_offset * k * n,
              y->typed_data() + b * m * n, m, k, n, variant);
    }
  } catch (const dnnl::error& error) {
    return ffi::Error::Internal(std::string("int8 matmul (oneDNN): ") + error.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FtInt8Matmul, Int8Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("variant"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(FtInt8MatmulPacked, Int8MatmulPacked,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("n"));

// The bytes of int8 [k, n] weights packed for this CPU (`FtInt8Pack`), or -1 on an error.
extern "C" int64_t FtInt8PackedSize(int64_t k, int64_t n) {
  try {
    return static_cast<int64_t>(PackedDesc(k, n).get_size());
  } catch (const dnnl::error&) {
    return -1;
  }
}

// Packs int8 weights [k, n] (row-major) into `packed` (FtInt8PackedSize(k, n) bytes): 0, or -1
// on an error.
extern "C" int FtInt8Pack(const int8_t* w, int64_t k, int64_t n, uint8_t* packed) {
  try {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    dnnl::memory source({{k, n}, dt::s8, tag::ab}, Engine(), const_cast<int8_t*>(w));
    dnnl::memory target(PackedDesc(k, n), Engine(), packed);
    dnnl::stream stream(Engine());
    dnnl::reorder(source, target).execute(stream, source, target);
    stream.wait();
    return 0;
  } catch (const dnnl::error&) {
    return -1;
  }
}

// 1 where oneDNN's int8 kernels on this CPU accumulate without saturating (VNNI or AMX), else 0.
extern "C" int FtInt8Exact() {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const bool avx2_vnni = (isa & 0x8u) != 0;  // avx2_vnni 0xf, avx2_vnni_2 0x1f.
  const unsigned avx512_vnni = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_vnni);
  return (avx2_vnni || (isa & avx512_vnni) == avx512_vnni) ? 1 : 0;
}

// oneDNN's version, as "major.minor.patch", and the ISA its kernels use (dnnl_cpu_isa_t).
extern "C" const char* FtInt8Version() {
  static std::string text;
  const dnnl_version_t* version = dnnl_version();
  text = std::to_string(version->major) + "." + std::to_string(version->minor) + "." +
         std::to_string(version->patch);
  return text.c_str();
}

extern "C" int FtInt8Isa() { return static_cast<int>(dnnl_get_effective_cpu_isa()); }
