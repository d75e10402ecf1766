// The row kernels of the quantized matrix-vector product: out[m, r] = x[m] . dequant(w[r]),
// for a few rows m of x (M <= 8) and a range of output rows r. One kernel per instruction set;
// qmv.cpp picks one at run time from the CPU's features.
//
// Dequantization is MLX's affine mode (mx.quantize): element k of weight row r is
// scale[r, g] * q[r, k] + bias[r, g], g = k / group_size, and q is packed little end first
// into uint32 words (bits 4: 8 values a word, bits 8: 4 values a word). The kernels use
//   x . w[r] = sum_g scale[r, g] * (x_g . q_g) + bias[r, g] * sum(x_g)
// so the per-group sums of x are computed once per call, not once per output row.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlxrt_qmv {

enum class ScaleType { f32, f16, bf16 };

struct Problem {
  const float* x; // M rows of K floats, in the layout the kernel asked for (x_width)
  const float* xsum; // M rows of G per-group sums of x
  const uint32_t* w; // N rows of K * bits / 32 words
  const void* scales; // N rows of G, of type stype
  const void* biases; // N rows of G, of type stype
  ScaleType stype;
  int M, N, K, G, group_size, bits;
  float* out; // M rows of N
};

// Computes out[m, r] for every m and r in [r0, r1).
using RowsFn = void (*)(const Problem&, int r0, int r1);

struct Kernel {
  const char* name;
  RowsFn rows;
  // How x must be laid out for 4-bit weights: 0 = as given; W > 0 = in blocks of 8 * W
  // elements, element 8 * l + s of a block stored at s * W + l (the order in which a W-lane
  // register unpacks W packed words nibble by nibble), the tail of K in blocks of W / 2, ...,
  // down to W = 4. 8-bit weights always take x as given.
  int x_width;
  RowsFn dequant;
};

void rows_generic(const Problem& p, int r0, int r1);
// Dequantizes weight rows [r0, r1) into out (K floats a row): the x, xsum and M of p unused.
void dequant_generic(const Problem& p, int r0, int r1);
#if defined(__x86_64__) || defined(_M_X64)
void rows_avx2(const Problem& p, int r0, int r1);
void dequant_avx2(const Problem& p, int r0, int r1);
#endif

// Lays out one row of x (K floats) as a kernel of x_width W expects (see Kernel::x_width).
inline void permute_x(const float* x, float* xp, int K, int W) {
  if (W == 0) {
    for (int k = 0; k < K; ++k) xp[k] = x[k];
    return;
  }
  int k = 0;
  int w = W;
  while (k < K) {
    while (w > 4 && K - k < 8 * w) w /= 2;
    for (int l = 0; l < w; ++l)
      for (int s = 0; s < 8; ++s) xp[k + s * w + l] = x[k + 8 * l + s];
    k += 8 * w;
  }
}

} // namespace mlxrt_qmv
