// Weight-row prefetching the x86-64 8-bit kernels share (kernel_avx2_q8.cpp,
// kernel_avx512_vnni.cpp). Include only from x86-64 files: _mm_prefetch is SSE.
#pragma once

#include <immintrin.h>

#include <cstddef>

#include "kernels.h"

namespace mlxrt_qmv {

// Weight rows are asked for this many rows ahead of the ones being multiplied: the hardware
// prefetcher alone left a decode step's products waiting on DRAM (SmolLM2's 211 products on one
// thread, 4- and 8-bit: 10.0 ms a step without, 8.7 with 2-6 rows ahead, 9.0 with 8-12).
constexpr int PREFETCH_ROWS = 4;

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
