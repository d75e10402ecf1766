// The AVX-512 VNNI loops for 8-bit weights in bands of 16 rows (Problem::band; bands.h lays them
// out): each 64-byte load holds four consecutive values of 16 rows, so one vpdpbusd against four
// bytes of a row of x broadcast to every lane advances 16 output rows at once, each lane one row's
// 32-bit sum. A block of 32 values is eight such steps, then its sums are scaled in float once,
// 16 rows at a time. The row-major loops (kernel_avx512_vnni.cpp) meet one row's 64 bytes in one
// vpdpbusd and then scale and add that vector: three float operations for every product
// instruction, which made a batch's step compute-bound (Gemma 3's 262,144-row 8-bit head took
// 16.6 ms at 8 rows of x against 5.7 for one, the time to read it). Here it is three for eight.
//
// Every output element is one sequence of operations, whatever rows of x or weights run beside
// it: for each block b in order, acc = fma(float(sum_b), scale_g * xd_b, acc) (the 32-bit sum
// exact in any order), then t = fma(bias_g, xsum_g, t) for each group g in order from zero, and
// the result acc + t. The variants below only interleave independent chains, so a row's result is
// its own bit for bit, alone or in a batch of any size. xoff is zero for x in 8 bits
// (quantize_x_int8), so it is not read.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "prefetch_x86.h"

namespace mlxrt_qmv {

namespace {

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

// NB bands (from band index `band`) against MM rows of x (from m0).
template <class L, int NB, int MM>
void band_tile(const Problem& p, int band, int m0, int prefetch) {
  using T = typename L::T;
  const int nb = p.K / 32, per = p.group_size / 32, G = p.G;
  const size_t band_bytes = static_cast<size_t>(16) * p.K;
  const size_t band_scales = static_cast<size_t>(16) * G;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(band) * band_bytes;
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
    if (prefetch > 0) // a lone row's stream: its bands' next bytes asked for ahead
      for (int n = 0; n < NB; ++n)
        for (int o = 0; o < 512; o += 64) _mm_prefetch(reinterpret_cast<const char*>(w + n * band_bytes + b * 512 + prefetch + o), _MM_HINT_T0);
    __m512i s[NB][MM];
    for (int n = 0; n < NB; ++n)
      for (int m = 0; m < MM; ++m) s[n][m] = _mm512_setzero_si512();
    const uint8_t* wb = w + static_cast<size_t>(b) * 512;
    for (int j = 0; j < 8; ++j) {
      __m512i wv[NB];
      for (int n = 0; n < NB; ++n) wv[n] = _mm512_loadu_si512(wb + n * band_bytes + 64 * j);
      for (int m = 0; m < MM; ++m) {
        const __m512i xv = _mm512_set1_epi32(four_bytes(xq[m] + b * 32 + 4 * j));
        for (int n = 0; n < NB; ++n) s[n][m] = _mm512_dpbusd_epi32(s[n][m], wv[n], xv);
      }
    }
    const int g = b / per;
    for (int n = 0; n < NB; ++n) {
      const __m512 ws = L::load(sc + n * band_scales + static_cast<size_t>(g) * 16);
      for (int m = 0; m < MM; ++m)
        acc[n][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[n][m]), _mm512_mul_ps(ws, _mm512_set1_ps(xd[m][b])), acc[n][m]);
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

// Bands [b0, b1) against every row of x: a lone row four bands at a time, two to four rows two
// bands at a time, more rows up to eight at a time against one band (its 16 * K bytes stay in
// cache while the rows of x meet it).
template <class L>
void bands(const Problem& p, int b0, int b1) {
  if (p.M == 1) {
    const int ahead = prefetch_ahead(64) * 64 / 4; // PREFETCH_BYTES over the four bands' streams
    int b = b0;
    for (; b + 4 <= b1; b += 4) band_tile<L, 4, 1>(p, b, 0, ahead);
    for (; b < b1; ++b) band_tile<L, 1, 1>(p, b, 0, ahead);
    return;
  }
  if (p.M <= 4) {
    int b = b0;
    for (; b + 2 <= b1; b += 2) {
      switch (p.M) {
        case 2: band_tile<L, 2, 2>(p, b, 0, 0); break;
        case 3: band_tile<L, 2, 3>(p, b, 0, 0); break;
        default: band_tile<L, 2, 4>(p, b, 0, 0); break;
      }
    }
    for (; b < b1; ++b) {
      switch (p.M) {
        case 2: band_tile<L, 1, 2>(p, b, 0, 0); break;
        case 3: band_tile<L, 1, 3>(p, b, 0, 0); break;
        default: band_tile<L, 1, 4>(p, b, 0, 0); break;
      }
    }
    return;
  }
  for (int b = b0; b < b1; ++b) {
    int m = 0;
    for (; m + 8 <= p.M; m += 8) band_tile<L, 1, 8>(p, b, m, 0);
    switch (p.M - m) {
      case 1: band_tile<L, 1, 1>(p, b, m, 0); break;
      case 2: band_tile<L, 1, 2>(p, b, m, 0); break;
      case 3: band_tile<L, 1, 3>(p, b, m, 0); break;
      case 4: band_tile<L, 1, 4>(p, b, m, 0); break;
      case 5: band_tile<L, 1, 5>(p, b, m, 0); break;
      case 6: band_tile<L, 1, 6>(p, b, m, 0); break;
      case 7: band_tile<L, 1, 7>(p, b, m, 0); break;
      default: break;
    }
  }
}

} // namespace

void rows_avx512_bands8(const Problem& p, int r0, int r1) {
  const int b0 = r0 / 16, b1 = r1 / 16; // split_rows hands whole bands
  if (p.stype == ScaleType::f32)
    bands<F32>(p, b0, b1);
  else if (p.stype == ScaleType::f16)
    bands<F16>(p, b0, b1);
  else
    bands<BF16>(p, b0, b1);
}

} // namespace mlxrt_qmv
