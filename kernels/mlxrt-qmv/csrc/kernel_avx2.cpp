// The AVX2 + FMA (+ F16C) kernel, compiled with those instructions enabled for this file only
// and run only where the CPU has them (qmv.cpp checks). 4-bit weights take x permuted with
// width 8: a 256-bit load of 8 words unpacks nibble s of every word with one shift and mask,
// and the 8 x values that nibble multiplies sit next to each other. 8-bit weights widen 8
// bytes to 8 lanes and take x as given.
#include <immintrin.h>

#include <vector>

#include "kernels.h"
#include "scales.h"
#include "simd_avx2.h"

namespace mlxrt_qmv {

namespace {

// Partial sums per row of x: an FMA waits ~4 cycles for the previous one into the same
// register, so one row alone keeps four chains going, two rows two each.
template <int MM>
constexpr int chains() {
  return MM == 1 ? 4 : MM == 2 ? 2 : 1;
}

// 64 elements (8 words) of 4-bit weights against MM rows of x permuted with width 8.
template <int MM>
inline void block4x8(const uint32_t* wp, const float* const* xm, int k, __m256 (*t)[chains<MM>()]) {
  constexpr int NA = chains<MM>();
  const __m256i mask = _mm256_set1_epi32(0xF);
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp));
#pragma GCC unroll 8
  for (int s = 0; s < 8; ++s) {
    const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
    v = _mm256_srli_epi32(v, 4);
    for (int m = 0; m < MM; ++m) t[m][s % NA] = _mm256_fmadd_ps(q, _mm256_loadu_ps(xm[m] + k + 8 * s), t[m][s % NA]);
  }
}

template <int MM>
inline __m256 fold(const __m256* t) {
  constexpr int NA = chains<MM>();
  if constexpr (NA == 4) return _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]));
  if constexpr (NA == 2) return _mm256_add_ps(t[0], t[1]);
  return t[0];
}

// The tail of 32 elements (4 words) against x permuted with width 4.
template <int MM>
inline void block4x4(const uint32_t* wp, const float* const* xm, int k, __m128* t) {
  const __m128i mask = _mm_set1_epi32(0xF);
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp));
#pragma GCC unroll 8
  for (int s = 0; s < 8; ++s) {
    const __m128 q = _mm_cvtepi32_ps(_mm_and_si128(v, mask));
    v = _mm_srli_epi32(v, 4);
    for (int m = 0; m < MM; ++m) t[m] = _mm_fmadd_ps(q, _mm_loadu_ps(xm[m] + k + 4 * s), t[m]);
  }
}

// The rows of x a call works on, and each one's bias term sum_g bias[g] * sum(x_g).
template <int MM>
inline void start_rows(const Problem& p, const float* bi, int m0, const float** xm, float* bacc) {
  for (int m = 0; m < MM; ++m) {
    xm[m] = p.x + static_cast<size_t>(m0 + m) * p.K;
    const float* xs = p.xsum + static_cast<size_t>(m0 + m) * p.G;
    float b = 0.f;
    for (int g = 0; g < p.G; ++g) b += bi[g] * xs[g];
    bacc[m] = b;
  }
}

template <int MM>
void row4(const Problem& p, const uint32_t* wr, const float* sc, const float* bi, int m0, int r) {
  const int K = p.K, G = p.G, gs = p.group_size;
  const float* xm[MM];
  float bacc[MM];
  __m256 acc[MM];
  __m128 acc4[MM];
  start_rows<MM>(p, bi, m0, xm, bacc);
  for (int m = 0; m < MM; ++m) {
    acc[m] = _mm256_setzero_ps();
    acc4[m] = _mm_setzero_ps();
  }
  int k = 0;
  constexpr int NA = chains<MM>();
  if (gs >= 64) {
    for (int g = 0; g < G; ++g) {
      __m256 t[MM][NA];
      for (int m = 0; m < MM; ++m)
        for (int a = 0; a < NA; ++a) t[m][a] = _mm256_setzero_ps();
      for (int e = 0; e < gs; e += 64, k += 64) block4x8<MM>(wr + k / 8, xm, k, t);
      const __m256 sv = _mm256_set1_ps(sc[g]);
      for (int m = 0; m < MM; ++m) acc[m] = _mm256_fmadd_ps(fold<MM>(t[m]), sv, acc[m]);
    }
  } else { // group size 32: a block of 8 words is two groups, lanes 0-3 and 4-7
    int g = 0;
    for (; k + 64 <= K; k += 64, g += 2) {
      __m256 t[MM][NA];
      for (int m = 0; m < MM; ++m)
        for (int a = 0; a < NA; ++a) t[m][a] = _mm256_setzero_ps();
      block4x8<MM>(wr + k / 8, xm, k, t);
      const __m256 sv = _mm256_setr_m128(_mm_set1_ps(sc[g]), _mm_set1_ps(sc[g + 1]));
      for (int m = 0; m < MM; ++m) acc[m] = _mm256_fmadd_ps(fold<MM>(t[m]), sv, acc[m]);
    }
    if (k < K) {
      __m128 t[MM];
      for (int m = 0; m < MM; ++m) t[m] = _mm_setzero_ps();
      block4x4<MM>(wr + k / 8, xm, k, t);
      const __m128 sv = _mm_set1_ps(sc[g]);
      for (int m = 0; m < MM; ++m) acc4[m] = _mm_fmadd_ps(t[m], sv, acc4[m]);
    }
  }
  for (int m = 0; m < MM; ++m)
    p.out[static_cast<size_t>(m0 + m) * p.N + r] = hsum(acc[m]) + hsum(acc4[m]) + bacc[m];
}

template <int MM>
void row8(const Problem& p, const uint32_t* wr, const float* sc, const float* bi, int m0, int r) {
  const int G = p.G, gs = p.group_size;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(wr);
  const float* xm[MM];
  float bacc[MM];
  __m256 acc[MM];
  start_rows<MM>(p, bi, m0, xm, bacc);
  for (int m = 0; m < MM; ++m) acc[m] = _mm256_setzero_ps();
  int k = 0;
  constexpr int NA = chains<MM>();
  for (int g = 0; g < G; ++g) {
    __m256 t[MM][NA];
    for (int m = 0; m < MM; ++m)
      for (int a = 0; a < NA; ++a) t[m][a] = _mm256_setzero_ps();
    for (int e = 0; e < gs; e += 32, k += 32) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256 q = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + k + 8 * j))));
        for (int m = 0; m < MM; ++m)
          t[m][j % NA] = _mm256_fmadd_ps(q, _mm256_loadu_ps(xm[m] + k + 8 * j), t[m][j % NA]);
      }
    }
    const __m256 sv = _mm256_set1_ps(sc[g]);
    for (int m = 0; m < MM; ++m) acc[m] = _mm256_fmadd_ps(fold<MM>(t[m]), sv, acc[m]);
  }
  for (int m = 0; m < MM; ++m) p.out[static_cast<size_t>(m0 + m) * p.N + r] = hsum(acc[m]) + bacc[m];
}

using RowFn = void (*)(const Problem&, const uint32_t*, const float*, const float*, int, int);

} // namespace

void scales_avx2(const Problem& p, int r, float* sc, float* bi) {
  if (p.stype != ScaleType::f16) {
    row_scales(p, r, sc, bi);
    return;
  }
  const size_t off = static_cast<size_t>(r) * p.G;
  const uint16_t* s = static_cast<const uint16_t*>(p.scales) + off;
  const uint16_t* b = static_cast<const uint16_t*>(p.biases) + off;
  int g = 0;
  for (; g + 8 <= p.G; g += 8) {
    _mm256_storeu_ps(sc + g, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + g))));
    _mm256_storeu_ps(bi + g, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + g))));
  }
  for (; g < p.G; ++g) {
    sc[g] = _cvtsh_ss(s[g]);
    bi[g] = _cvtsh_ss(b[g]);
  }
}

void dequant_avx2(const Problem& p, int r0, int r1) {
  const int K = p.K, G = p.G, gs = p.group_size;
  const int words = K * p.bits / 32;
  thread_local std::vector<float> sb;
  sb.resize(2 * static_cast<size_t>(G));
  float* sc = sb.data();
  float* bi = sb.data() + G;
  const __m256i shifts4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask4 = _mm256_set1_epi32(0xF);
  for (int r = r0; r < r1; ++r) {
    scales_avx2(p, r, sc, bi);
    const uint32_t* wr = p.w + static_cast<size_t>(r) * words;
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(wr);
    float* o = p.out + static_cast<size_t>(r) * K;
    for (int g = 0; g < G; ++g) {
      const __m256 s = _mm256_set1_ps(sc[g]);
      const __m256 b = _mm256_set1_ps(bi[g]);
      for (int k = g * gs; k < (g + 1) * gs; k += 8) {
        __m256i q;
        if (p.bits == 4)
          q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(wr[k / 8])), shifts4), mask4);
        else
          q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + k)));
        _mm256_storeu_ps(o + k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), s, b));
      }
    }
  }
}

void rows_avx2(const Problem& p, int r0, int r1) {
  static constexpr RowFn four[] = {row4<1>, row4<2>, row4<3>, row4<4>};
  static constexpr RowFn eight[] = {row8<1>, row8<2>, row8<3>, row8<4>};
  const RowFn* fns = p.bits == 4 ? four : eight;
  const int words = p.K * p.bits / 32;
  thread_local std::vector<float> sb;
  sb.resize(2 * static_cast<size_t>(p.G));
  float* sc = sb.data();
  float* bi = sb.data() + p.G;
  for (int r = r0; r < r1; ++r) {
    scales_avx2(p, r, sc, bi);
    const uint32_t* wr = p.w + static_cast<size_t>(r) * words;
    // Rows of x four at a time: four accumulators and four partial sums fit the 16 registers.
    for (int m0 = 0; m0 < p.M; m0 += 4) {
      const int mm = p.M - m0 < 4 ? p.M - m0 : 4;
      fns[mm - 1](p, wr, sc, bi, m0, r);
    }
  }
}

} // namespace mlxrt_qmv
