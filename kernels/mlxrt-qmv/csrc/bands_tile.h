// The AVX-512 VNNI loops for weights in bands of 16 rows (Problem::band; bands.h lays them out),
// for every width: kernel_avx512_bands.cpp instantiates them for 8- and 4-bit weights,
// kernel_avx512_bands_vbmi.cpp (built with VBMI, run only where the CPU has it) for 3, 5 and 6.
//
// Each operand is 64 bytes: four consecutive values of each of the band's 16 rows, one a byte, so
// one vpdpbusd against four bytes of a row of x broadcast to every lane advances 16 output rows
// at once, each lane one row's 32-bit sum. A block of 32 values is eight operands, then its sums
// are scaled in float once, 16 rows at a time. The row-major loops (kernel_avx512_vnni.cpp) meet
// one row's 64 bytes in one vpdpbusd and then scale and add that vector: three float operations
// for every product instruction, which made a batch's step compute-bound (Gemma 3's 262,144-row
// 8-bit head took 16.3 ms at 8 rows of x against 6.2 for one; in bands 7.5 and 5.0). Here it is
// three for eight. The operands of a block as stored (bands.h): 8-bit, the 64 bytes as they are;
// 4-bit, four lines whose low nibbles are operand 2l and high ones operand 2l + 1; 3-, 5- and
// 6-bit, eight runs of 8 * BITS bytes, each the 64 values' bit stream (unpack64).
//
// Every output element is one sequence of operations, whatever rows of x or weights run beside
// it: for each block b in order, acc = fma(float(sum_b), scale_g * xd_b, acc) (the 32-bit sum
// exact in any order), then t = fma(bias_g, xsum_g, t) for each group g in order from zero, and
// the result acc + t. The variants below only interleave independent chains, so a row's result is
// its own bit for bit, alone or in a batch of any size; and a layer of 3-, 4-, 5- or 6-bit
// integers gives the bits of the same integers in 8-bit words. x is in order (quantize_x_int8,
// layout 0, whatever the weights' width); xoff is zero for x in 8 bits, so it is not read.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "prefetch_x86.h"
#include "vbmi_unpack.h"

namespace mlxrt_qmv {
// Internal to each file that includes it: the two files build it for different instruction sets.
namespace {
namespace bands_tile {

// 16 consecutive scales or biases as float32, from their stored type (exact widening).
struct F32 {
  using T = float;
  static __m512 load(const float* p) {
    return _mm512_loadu_ps(p);
  }
};
struct F16 {
  using T = uint16_t;
  static __m512 load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};
struct BF16 {
  using T = uint16_t;
  static __m512 load(const uint16_t* p) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
};

inline int32_t four_bytes(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof v);
  return v;
}

// Bytes of one band's block of 32 values.
template <int BITS>
constexpr int block_bytes = 64 * BITS;

// The eight operands of one band's block at wb (wend: the matrix's end, which a 64-byte load of
// a 3-, 5- or 6-bit run must not pass).
template <int BITS>
__attribute__((always_inline)) inline void operands(const uint8_t* wb, const uint8_t* wend, __m512i (&op)[8]) {
  if constexpr (BITS == 8) {
    for (int j = 0; j < 8; ++j) op[j] = _mm512_loadu_si512(wb + 64 * j);
  } else if constexpr (BITS == 4) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int l = 0; l < 4; ++l) {
      const __m512i v = _mm512_loadu_si512(wb + 64 * l);
      op[2 * l] = _mm512_and_si512(v, low);
      op[2 * l + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
  } else {
    const __m512i perm = _mm512_load_si512(vbmi_unpack<BITS>.perm), shift = _mm512_load_si512(vbmi_unpack<BITS>.shift);
    for (int j = 0; j < 8; ++j) {
      const uint8_t* src = wb + 8 * BITS * j;
      const __m512i v = src + 64 <= wend ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8((1ULL << (8 * BITS)) - 1, src);
      op[j] = unpack64<BITS>(v, perm, shift, 0xFFFF);
    }
  }
}

// NB bands (from band index `band`) against MM rows of x (from m0); prefetch > 0: ask for the
// band's bytes that far ahead (a lone row's stream).
template <class L, int BITS, int NB, int MM>
void tile(const Problem& p, int band, int m0, int prefetch) {
  using T = typename L::T;
  const int nb = p.K / 32, per = p.group_size / 32, G = p.G;
  const size_t band_bytes = static_cast<size_t>(nb) * block_bytes<BITS>;
  const size_t band_scales = static_cast<size_t>(16) * G;
  const uint8_t* const w0 = reinterpret_cast<const uint8_t*>(p.w);
  const uint8_t* const wend = w0 + static_cast<size_t>(p.N / 16) * band_bytes;
  const uint8_t* w = w0 + static_cast<size_t>(band) * band_bytes;
  const T* sc = static_cast<const T*>(p.scales) + static_cast<size_t>(band) * band_scales;
  const T* bi = static_cast<const T*>(p.biases) + static_cast<size_t>(band) * band_scales;
  const int8_t* xq[MM];
  const float* xd[MM];
  const float* xs[MM];
  for (int m = 0; m < MM; ++m) {
    xq[m] = p.xq + static_cast<size_t>(m0 + m) * p.xstride;
    xd[m] = p.xd + static_cast<size_t>(m0 + m) * nb;
    xs[m] = p.xsum + static_cast<size_t>(m0 + m) * G;
  }
  __m512 acc[NB][MM];
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MM; ++m) acc[n][m] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const size_t at = static_cast<size_t>(b) * block_bytes<BITS>;
    if (prefetch > 0)
      for (int n = 0; n < NB; ++n)
        for (int o = 0; o < block_bytes<BITS>; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(w + n * band_bytes + at + prefetch + o), _MM_HINT_T0);
    // few chains (a lone row): even and odd operands into two sums, added after (exact in 32
    // bits, so the same sum), which halves the chain of dependent vpdpbusd
    constexpr int SPLIT = NB * MM <= 2 ? 2 : 1;
    __m512i s[SPLIT][NB][MM];
    for (int h = 0; h < SPLIT; ++h)
      for (int n = 0; n < NB; ++n)
        for (int m = 0; m < MM; ++m) s[h][n][m] = _mm512_setzero_si512();
    for (int n = 0; n < NB; ++n) {
      __m512i op[8];
      operands<BITS>(w + n * band_bytes + at, wend, op);
      for (int j = 0; j < 8; ++j)
        for (int m = 0; m < MM; ++m)
          s[j % SPLIT][n][m] =
              _mm512_dpbusd_epi32(s[j % SPLIT][n][m], op[j], _mm512_set1_epi32(four_bytes(xq[m] + b * 32 + 4 * j)));
    }
    if constexpr (SPLIT == 2)
      for (int n = 0; n < NB; ++n)
        for (int m = 0; m < MM; ++m) s[0][n][m] = _mm512_add_epi32(s[0][n][m], s[1][n][m]);
    const int g = b / per;
    for (int n = 0; n < NB; ++n) {
      const __m512 ws = L::load(sc + n * band_scales + static_cast<size_t>(g) * 16);
      for (int m = 0; m < MM; ++m)
        acc[n][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0][n][m]), _mm512_mul_ps(ws, _mm512_set1_ps(xd[m][b])), acc[n][m]);
    }
  }
  const __m512 neg = _mm512_set1_ps(-p.centre);
  for (int n = 0; n < NB; ++n) {
    __m512 t[MM];
    for (int m = 0; m < MM; ++m) t[m] = _mm512_setzero_ps();
    for (int g = 0; g < G; ++g) {
      // centre > 0: the biases are -centre times the scales exactly (checked at install)
      const size_t at = n * band_scales + static_cast<size_t>(g) * 16;
      const __m512 bv = p.centre > 0.f ? _mm512_mul_ps(L::load(sc + at), neg) : L::load(bi + at);
      for (int m = 0; m < MM; ++m) t[m] = _mm512_fmadd_ps(bv, _mm512_set1_ps(xs[m][g]), t[m]);
    }
    for (int m = 0; m < MM; ++m)
      _mm512_storeu_ps(p.out + static_cast<size_t>(m0 + m) * p.N + static_cast<size_t>(band + n) * 16,
                       _mm512_add_ps(acc[n][m], t[m]));
  }
}

// Bands [b0, b1) against every row of x: a lone row one band at a time, two to four rows two
// bands at a time, more rows up to eight at a time against one band (its bytes stay in cache
// while the rows of x meet it).
template <class L, int BITS>
void bands(const Problem& p, int b0, int b1) {
  if (p.M == 1) {
    // one band at a time: the weights are read as one sequential stream, PREFETCH_BYTES ahead
    // (four bands at a time, four streams 16 * K bytes apart, were slower: SmolLM2's bare loop
    // 5.75 against 4.56 ms a token)
    const int ahead = prefetch_ahead(64) * 64;
    for (int b = b0; b < b1; ++b) tile<L, BITS, 1, 1>(p, b, 0, ahead);
    return;
  }
  if (p.M <= 4) {
    constexpr void (*two[3])(const Problem&, int, int, int) = {tile<L, BITS, 2, 2>, tile<L, BITS, 2, 3>, tile<L, BITS, 2, 4>};
    constexpr void (*one[3])(const Problem&, int, int, int) = {tile<L, BITS, 1, 2>, tile<L, BITS, 1, 3>, tile<L, BITS, 1, 4>};
    int b = b0;
    for (; b + 2 <= b1; b += 2) two[p.M - 2](p, b, 0, 0);
    for (; b < b1; ++b) one[p.M - 2](p, b, 0, 0);
    return;
  }
  constexpr void (*rest[8])(const Problem&, int, int, int) = {nullptr, tile<L, BITS, 1, 1>, tile<L, BITS, 1, 2>,
                                                              tile<L, BITS, 1, 3>, tile<L, BITS, 1, 4>, tile<L, BITS, 1, 5>,
                                                              tile<L, BITS, 1, 6>, tile<L, BITS, 1, 7>};
  for (int b = b0; b < b1; ++b) {
    int m = 0;
    for (; m + 8 <= p.M; m += 8) tile<L, BITS, 1, 8>(p, b, m, 0);
    if (m < p.M) rest[p.M - m](p, b, m, 0);
  }
}

// rows [r0, r1) (whole bands) of a layer of BITS bits, by the scales' stored type
template <int BITS>
void rows(const Problem& p, int r0, int r1) {
  const int b0 = r0 / 16, b1 = r1 / 16;
  if (p.stype == ScaleType::f32)
    bands<F32, BITS>(p, b0, b1);
  else if (p.stype == ScaleType::f16)
    bands<F16, BITS>(p, b0, b1);
  else
    bands<BF16, BITS>(p, b0, b1);
}

} // namespace bands_tile
} // namespace
} // namespace mlxrt_qmv
