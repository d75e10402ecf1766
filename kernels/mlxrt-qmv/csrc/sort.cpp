// The sort primitive (sort.h): a stable least-significant-digit radix sort of each row, three
// passes of 11 bits over keys that order the floats as MLX's comparator does.
#include "sort.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace mlxrt_qmv {

namespace {

// An unsigned key in the order of MLX's NaN-aware less: negative floats reversed below the
// positive ones, -0 keyed as +0 (they compare equal, so a stable sort keeps their order), every
// NaN the largest key (last, in their order).
inline uint32_t key_of(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int BITS = 11;
constexpr uint32_t BUCKETS = 1u << BITS;

} // namespace

void sort_rows(const float* in, float* out, int64_t rows, int64_t n) {
  thread_local std::vector<uint32_t> keys, keys2, vals, vals2, count; // kept between calls
  keys.resize(n);
  keys2.resize(n);
  vals.resize(n);
  vals2.resize(n);
  count.resize(BUCKETS);
  for (int64_t r = 0; r < rows; ++r, in += n, out += n) {
    std::memcpy(vals.data(), in, sizeof(float) * n);
    for (int64_t i = 0; i < n; ++i) keys[i] = key_of(vals[i]);
    for (int shift = 0; shift < 32; shift += BITS) {
      std::fill(count.begin(), count.end(), 0u);
      for (int64_t i = 0; i < n; ++i) ++count[(keys[i] >> shift) & (BUCKETS - 1)];
      uint32_t at = 0;
      for (uint32_t b = 0; b < BUCKETS; ++b) {
        const uint32_t c = count[b];
        count[b] = at;
        at += c;
      }
      for (int64_t i = 0; i < n; ++i) { // in order: equal digits keep their order (stable)
        const uint32_t to = count[(keys[i] >> shift) & (BUCKETS - 1)]++;
        keys2[to] = keys[i];
        vals2[to] = vals[i];
      }
      keys.swap(keys2);
      vals.swap(vals2);
    }
    std::memcpy(out, vals.data(), sizeof(float) * n);
  }
}

mx::array sort(const mx::array& x, mx::StreamOrDevice s) {
  const bool ok = mx::to_stream(s).device == mx::Device::cpu && x.dtype() == mx::float32 && x.ndim() >= 1 &&
      x.shape(-1) > 1 && x.size() > 0;
  if (!ok) return mx::sort(x, -1, s);
  return mx::array(x.shape(), mx::float32, std::make_shared<Sort>(mx::to_stream(s)), {mx::contiguous(x, false, s)});
}

void Sort::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  const int64_t n = x.shape(-1), rows = static_cast<int64_t>(x.size()) / n;
  encoder.dispatch([ip = x.data<float>(), op = out.data<float>(), rows, n]() {
    parallel_for(static_cast<int>(rows), static_cast<size_t>(rows * n) * 24, [&](int r0, int r1) {
      sort_rows(ip + r0 * n, op + r0 * n, r1 - r0, n);
    }, rows == 1);
  });
}

} // namespace mlxrt_qmv
