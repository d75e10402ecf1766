// The row kernels of the quantized matrix-vector product: out[m, r] = x[m] . dequant(w[r]),
// for rows m of x and a range of output rows r. One kernel per instruction set;
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
  // Kernels that take x quantized (Kernel::int8_x; Kernel::quantize makes these): M rows of K int8
  // values laid out for the weights' bits, M rows of K / 32 block scales, and M rows of G
  // offsets that the bias term adds (see quantize_x_avx2). xsum is then the rounded x's sums.
  const int8_t* xq;
  const int8_t* xlo; // the Q15 kernel, 4-bit weights: x / d in 15 bits, its high part in xq and low 7 bits here
  const int16_t* x16; // the Q15 kernel, 8-bit weights: x / d in 15 bits as int16, in order
  const float* xd;
  const float* xoff;
  int xstride; // bytes from one row of xq to the next (K, or more where a kernel pads x's rows)
  const uint32_t* w; // N rows of K * bits / 32 words
  const void* scales; // N rows of G, of type stype
  const void* biases; // N rows of G, of type stype
  ScaleType stype;
  int M, N, K, G, group_size, bits;
  float* out; // M rows of N
  // > 0: every bias is -centre * its scale exactly (a symmetric block format: Q8_0, Q4_0, Q5_0 as
  // converted), so a lone row's AVX-512 tiles compute the biases from the scales instead of
  // reading them (the same values); the other loops read biases as ever.
  float centre = 0.f;
  // 16: the weights, scales and biases are in bands of 16 rows (bands.h), which only
  // rows_avx512_vnni reads (band_bits() says for which widths); r0 and r1 are then multiples of
  // 16, and x is in order whatever the width. 0: row-major.
  int band = 0;
};

// Row r's scales and biases as float32 into sc and bi (G each); float16 converted with F16C.
// Defined in kernel_avx2.cpp: call it only from the AVX2 translation units.
void scales_avx2(const Problem& p, int r, float* sc, float* bi);

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
  // Whether rows takes x quantized to int8 (xq, xd, xoff; made by quantize) instead of as
  // floats (x).
  bool int8_x = false;
  void (*quantize)(const float* x, int K, int group_size, int bits, int8_t* xq, int8_t* xlo, int16_t* x16,
                   float* xd, float* xsum, float* xoff) = nullptr;
  // Whether x goes in 15 bits (xq and xlo) rather than 8 (xq).
  bool q15 = false;
  // >= 0: x goes in 8 bits through quantize_x_int8 (not quantize), with this layout for 4-bit
  // weights (8-bit weights: in order), each row padded with zeros to a multiple of x_pad bytes.
  int int8_layout = -1;
  int x_pad = 32;
  // The quantizer for int8_layout >= 0: quantize_x_int8 or a vector loop with its bits.
  void (*quantize_int8)(const float* x, int K, int group_size, int bits, int layout, int padded, int8_t* xq, float* xd,
                        float* xsum, float* xoff) = nullptr;
};

// Quantizes one row of x (K floats, K a multiple of 32) to 8 bits in blocks of 32, for the
// portable and AVX-512 integer kernels: block b's scale d = max|x_b| / 127 to xd[b], round(x / d)
// (to nearest, ties to even) to xq, in order (layout 0) or, layout 4, per chunk of four blocks
// (128 elements) as [even elements of blocks 0-3, 16 each | odd elements of blocks 0-3] (the
// order of 64 packed bytes' low and high nibbles); a last partial chunk keeps that layout, and
// xq is zero from the row's last value to `padded` bytes. Also the per-group sums of the rounded
// x (xsum, sum of d * round(x / d)) and zero offsets (xoff): the kernels multiply the weights' q as
// they are, so scale * (q . x_rounded) + bias * xsum is w . x_rounded exactly, whose error
// w . (x_rounded - x) meets the weights as they are. (Exact sums of x with an offset
// 2^(bits-1) * (xsum - sum of x_rounded), mlxrt-qmv 0.5.0, left scale * (q - 2^(bits-1)) to meet
// the rounding instead: right for weights centred there, but a GGUF Q5_0 or Q6_K layer widened to
// 8 bits is centred on 16 or 32, and its rounding error grew ~7-14 times: Gemma 3 270M Q4_K_M
// left llama.cpp's text.)
void quantize_x_int8(const float* x, int K, int group_size, int bits, int layout, int padded, int8_t* xq, float* xd,
                     float* xsum, float* xoff);
// One weight row (K values of `bits` bits, MLX's little-end-first bit stream) as one byte a value.
void unpack_row(const uint32_t* w, int bits, int K, uint8_t* q);
// The portable integer kernel: x from quantize_x_int8 (layout 0), 32-bit sums per block.
void rows_generic_int8(const Problem& p, int r0, int r1);

void rows_generic(const Problem& p, int r0, int r1);
// Dequantizes weight rows [r0, r1) into out (K floats a row): the x, xsum and M of p unused.
void dequant_generic(const Problem& p, int r0, int r1);
#if defined(__x86_64__) || defined(_M_X64)
void rows_avx2(const Problem& p, int r0, int r1);
void dequant_avx2(const Problem& p, int r0, int r1);
// Quantizes one row of x (K floats, K a multiple of 32) for an int8 kernel, in blocks of 32: each
// block's scale d = max|x| / 127 goes to xd, round(x / d) to xq, laid out for 4-bit weights per
// 64-element chunk (blocks b, b + 1) as [even elements of b, even of b + 1, odd of b, odd of
// b + 1] and a last lone block as [even, odd] (the order a packed byte's low and high nibbles
// hold them), for 8-bit weights as given. Also the per-group sums of the rounded x (xsum, G of
// them) and the offsets xoff the kernels' bias term adds, scale[g] * xoff[g] each: the kernels
// multiply 8-bit weights as q - 128, so xoff = 128 * xsum; they multiply 4-bit weights as q, and
// xoff = 0. Either way a row's product is w . x_rounded exactly, its error w . (x_rounded - x)
// (as llama.cpp's, whose Q8_1 blocks carry their rounded sums; quantize_x_int8 says why not the
// exact sums).
// With xlo (4-bit weights) or x16 (8-bit weights), x / d is rounded to 15 bits instead, d =
// max|x| / 16256, and stored as its high part (>> 7, in xq) and low 7 bits (in xlo), both int8 in
// the layout above, or as int16 in order (x16).
void quantize_x_avx2(const float* x, int K, int group_size, int bits, int8_t* xq, int8_t* xlo, int16_t* x16,
                     float* xd, float* xsum, float* xoff);
void rows_avx2_q8(const Problem& p, int r0, int r1);
// rows_avx2_q8 on x in 15 bits (xq and xlo, or x16): 128 times less rounding for about 1.5 times the work.
void rows_avx2_q15(const Problem& p, int r0, int r1);
// The AVX-512 (F, BW, VL, VNNI) integer kernel: x from quantize_x_int8, layout 4, padded to 128.
// 3-, 5- and 6-bit weights: the 8-bit loops on their integers, unpacked in registers for up to 7
// rows of x where the CPU has VBMI, else each band of rows unpacked to bytes first.
void rows_avx512_vnni(const Problem& p, int r0, int r1);
// Whether rows_avx512_vnni unpacks 3-, 5- and 6-bit rows in registers for 1 to 7 rows of x (the
// CPU has AVX-512 VBMI): then those products cost no more than the same integers in 8-bit words.
bool packed_lone_rows_avx512();
// rows_avx512_vnni for weights in bands of 16 rows (Problem::band; bands_tile.h): rows [r0, r1)
// whole bands; 3-, 5- and 6-bit weights (rows_avx512_bands_vbmi) only where the CPU has VBMI.
void rows_avx512_bands(const Problem& p, int r0, int r1);
void rows_avx512_bands_vbmi(const Problem& p, int r0, int r1);
// quantize_x_int8 in AVX-512 (F, BW, VL), bit for bit: the VNNI kernel's quantize_int8.
void quantize_x_int8_avx512(const float* x, int K, int group_size, int bits, int layout, int padded, int8_t* xq,
                            float* xd, float* xsum, float* xoff);
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
