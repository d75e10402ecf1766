// Weight-row prefetching the x86-64 8-bit kernels share (kernel_avx2_q8.cpp,
// kernel_avx512_vnni.cpp). Include only from x86-64 files: _mm_prefetch is SSE.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdlib>

#include "kernels.h"

namespace mlxrt_qmv {

// Weight rows are asked for ahead of the ones being multiplied: the hardware prefetcher alone left a
// decode step's products waiting on DRAM (SmolLM2's 211 products on one thread, the AVX2 kernel: 10.0
// ms a step without, 8.7 with 2-6 rows ahead, 9.0 with 8-12). PREFETCH_ROWS is the AVX2 loops'
// distance and the least of the AVX-512 ones'.
constexpr int PREFETCH_ROWS = 4;

// The AVX-512 loops' distance for one to seven rows of x (a decode step), in bytes of weights:
// their tiles consume a row several times faster than the AVX2 ones, and four rows ahead (2.5 KB
// of Gemma 3's 640-byte rows, 1.1 KB of SmolLM2's 4-bit 288) was less than DRAM's latency times
// its bandwidth. Bare decode loops, ms a token, medians of 9 (quiet machine, Zen 4, 2026-12-06):
// SmolLM2 Q4_1 5.65 (four rows) -> 4.82 (8 KiB) / 4.81 (16) / 5.15 (32); Gemma 3 270M 11.08 ->
// 10.56 / 10.71 / 10.73. MLXRT_QMV_PREFETCH_BYTES sets it (read once; other CPUs may differ).
constexpr int PREFETCH_BYTES = 8192;

// Rows of `row_bytes` each to ask for ahead: PREFETCH_BYTES' worth, at least PREFETCH_ROWS.
inline int prefetch_ahead(size_t row_bytes) {
  static const int bytes = [] {
    const char* v = std::getenv("MLXRT_QMV_PREFETCH_BYTES");
    const int b = v != nullptr && *v != '\0' ? std::atoi(v) : PREFETCH_BYTES;
    return b > 0 ? b : PREFETCH_BYTES;
  }();
  const int n = static_cast<int>(static_cast<size_t>(bytes) / row_bytes);
  return n < PREFETCH_ROWS ? PREFETCH_ROWS : n;
}

// Asks for weight rows [r, r + n) and their scales and biases to be brought into cache. Inlined
// always: a call to it, with no effect GCC can see, is otherwise deleted as dead code.
__attribute__((always_inline)) inline void prefetch_rows(const Problem& p, int r, int n, size_t row_bytes) {
  const char* w = reinterpret_cast<const char*>(p.w) + static_cast<size_t>(r) * row_bytes;
  for (size_t o = 0; o < n * row_bytes; o += 64) _mm_prefetch(w + o, _MM_HINT_T0);
  const size_t each = p.stype == ScaleType::f32 ? 4 : 2;
  const size_t at = static_cast<size_t>(r) * p.G * each, len = static_cast<size_t>(n) * p.G * each;
  for (size_t o = 0; o < len; o += 64) {
    _mm_prefetch(static_cast<const char*>(p.scales) + at + o, _MM_HINT_T0);
    if (p.centre == 0.f) _mm_prefetch(static_cast<const char*>(p.biases) + at + o, _MM_HINT_T0);
  }
}

} // namespace mlxrt_qmv
