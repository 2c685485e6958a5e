// oneDNN's int8 matmul at a decode step's row counts, with the weights as our int8 product passes
// them (plain [K, N], repacked by oneDNN on every call: model/int8_matmul.cc's matmul primitive)
// against the same weights packed once into the primitive's own blocked layout (what a packing
// of the kernels at load time would give). GOP/s over about 96 MB of distinct weights, the
// median of 9 alternating passes; it also says whether the packed layout is one for every row
// count, and checks that both give the same int32 products.
//
// Build against the [cpu-int8] extra's oneDNN and run (R: the environment's prefix), one JSON
// line per shape:
//   R=.venv; g++ -O2 -std=c++17 benchmarks/speed/int8_packed_weights.cc -I$R/include
//     -L$R/lib -l:libdnnl.so.3 -Wl,-rpath,$R/lib -o /tmp/int8_packed_weights
//   /tmp/int8_packed_weights 16 1024 4096   # rows, contracted, features

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ROWS CONTRACTED FEATURES\n", argv[0]);
    return 2;
  }
  const int64_t m = std::atoll(argv[1]), k = std::atoll(argv[2]), n = std::atoll(argv[3]);
  const int64_t count = std::max<int64_t>(2, (int64_t{96} << 20) / (k * n));
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::mt19937 rng(0);
  auto draw = [&](std::vector<int8_t>& values) {
    for (auto& v : values) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  };
  std::vector<std::vector<int8_t>> weights(count, std::vector<int8_t>(k * n));
  for (auto& w : weights) draw(w);
  std::vector<int8_t> x(m * k);
  draw(x);
  std::vector<int32_t> y_plain(m * n), y_packed(m * n);

  const dnnl::memory::desc x_desc({m, k}, dt::s8, tag::ab), w_desc({k, n}, dt::s8, tag::ab);
  const dnnl::memory::desc y_desc({m, n}, dt::s32, tag::ab), any_desc({k, n}, dt::s8, tag::any);
  const dnnl::matmul::primitive_desc plain_desc(engine, x_desc, w_desc, y_desc);
  const dnnl::matmul::primitive_desc packed_desc(engine, x_desc, any_desc, y_desc);
  const dnnl::matmul plain(plain_desc), packed(packed_desc);
  bool one_layout = true;  // The layout oneDNN picks for these weights at other row counts.
  for (int64_t rows : {1, 4, 48, 64, 256, 1000}) {
    const dnnl::memory::desc other({rows, k}, dt::s8, tag::ab), out({rows, n}, dt::s32, tag::ab);
    one_layout &= dnnl::matmul::primitive_desc(engine, other, any_desc, out).weights_desc() ==
                  packed_desc.weights_desc();
  }
  std::vector<dnnl::memory> packed_weights;
  for (auto& w : weights) {
    dnnl::memory source(w_desc, engine, w.data()), target(packed_desc.weights_desc(), engine);
    dnnl::reorder(source, target).execute(stream, source, target);
    packed_weights.push_back(target);
  }
  stream.wait();
  dnnl::memory x_memory(x_desc, engine, x.data());
  dnnl::memory plain_out(y_desc, engine, y_plain.data()), packed_out(y_desc, engine, y_packed.data());
  auto pass = [&](bool use_packed) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < count; ++i) {
      if (use_packed) {
        packed.execute(stream, {{DNNL_ARG_SRC, x_memory}, {DNNL_ARG_WEIGHTS, packed_weights[i]},
                                {DNNL_ARG_DST, packed_out}});
      } else {
        dnnl::memory w_memory(w_desc, engine, weights[i].data());
        plain.execute(stream, {{DNNL_ARG_SRC, x_memory}, {DNNL_ARG_WEIGHTS, w_memory},
                               {DNNL_ARG_DST, plain_out}});
      }
    }
    stream.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  pass(false);
  pass(true);
  std::vector<double> plain_s, packed_s;
  for (int round = 0; round < 9; ++round) {  // Alternating: a noisy moment hits both.
    plain_s.push_back(pass(false));
    packed_s.push_back(pass(true));
  }
  std::sort(plain_s.begin(), plain_s.end());
  std::sort(packed_s.begin(), packed_s.end());
  const double operations = 2.0 * m * k * n * count;
  std::printf("{\"rows\": %ld, \"contracted\": %ld, \"features\": %ld, \"weights\": %ld, "
              "\"plain_gop_per_s\": %.0f, \"packed_gop_per_s\": %.0f, \"packed_bytes\": %zu, "
              "\"one_layout_for_every_row_count\": %s, \"same_products\": %s, "
              "\"implementation\": \"%s\"}\n",
              static_cast<long>(m), static_cast<long>(k), static_cast<long>(n),
              static_cast<long>(count), operations / plain_s[4] / 1e9,
              operations / packed_s[4] / 1e9, packed_desc.weights_desc().get_size(),
              one_layout ? "true" : "false", y_plain == y_packed ? "true" : "false",
              packed_desc.impl_info_str());
  return y_plain == y_packed ? 0 : 1;
}
