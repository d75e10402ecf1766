// The AVX2 integer kernel (as llama.cpp's Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products): x is
// quantized to int8 once per call, in blocks of 32 with one float scale each (see
// kernels.h and quantize_x_avx2 below), and each weight byte meets it in integer multiply-adds
// (_mm256_maddubs_epi16: unsigned 8-bit weights x signed 8-bit x, pairs summed in 16 bits),
// summed in 32 bits per block and scaled in float once per block. 64 4-bit weights cost one
// load, one shift, two ands and two maddubs; the float kernel (kernel_avx2.cpp) needs eight
// int-to-float conversions and eight FMAs for them. Compiled with AVX2/FMA/F16C for this file
// only and run only where the CPU has them (qmv.cpp checks).
#include <immintrin.h>

#include <vector>

#include "kernels.h"
#include "prefetch_x86.h"
#include "scales.h"
#include "simd_avx2.h"

namespace mlxrt_qmv {

namespace {

// One weight row's scales and biases as float32: the stored arrays themselves when they are
// float32, else converted into sc / bi. scb: the scale of each block of 32 elements (K / 32).
struct RowScales {
  const float* sc;
  const float* bi;
  const float* scb;
};

RowScales row_scales_f32(const Problem& p, int r, float* sc, float* bi, float* scb) {
  const size_t off = static_cast<size_t>(r) * p.G;
  if (p.stype == ScaleType::f32) {
    sc = const_cast<float*>(static_cast<const float*>(p.scales) + off);
    bi = const_cast<float*>(static_cast<const float*>(p.biases) + off);
  } else {
    scales_avx2(p, r, sc, bi);
  }
  const int per = p.group_size / 32;
  if (per == 1) return {sc, bi, sc};
  const int nb = p.K / 32;
  for (int b = 0; b < nb; ++b) scb[b] = sc[b / per];
  return {sc, bi, scb};
}

// sum_g bias[g] * xsum[g] + scale[g] * xoff[g] (the biases' term and, for 8-bit weights taken as
// q - 128, the 128 they leave out, against the rounded x's sums; see quantize_x_avx2) spread over
// 8 lanes, to add to a row's accumulator before its lanes are summed. The last G % 8 groups are read with a masked load.
alignas(32) constexpr int32_t kTailMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

inline __m256 bias_term(const Problem& p, const RowScales& rs, int m) {
  const float* xs = p.xsum + static_cast<size_t>(m) * p.G;
  const float* xo = p.xoff + static_cast<size_t>(m) * p.G;
  __m256 a = _mm256_setzero_ps();
  int g = 0;
  for (; g + 8 <= p.G; g += 8) {
    a = _mm256_fmadd_ps(_mm256_loadu_ps(rs.bi + g), _mm256_loadu_ps(xs + g), a);
    a = _mm256_fmadd_ps(_mm256_loadu_ps(rs.sc + g), _mm256_loadu_ps(xo + g), a);
  }
  if (g < p.G) {
    const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTailMask + 8 - (p.G - g)));
    a = _mm256_fmadd_ps(_mm256_maskload_ps(rs.bi + g, mask), _mm256_maskload_ps(xs + g, mask), a);
    a = _mm256_fmadd_ps(_mm256_maskload_ps(rs.sc + g, mask), _mm256_maskload_ps(xo + g, mask), a);
  }
  return a;
}

inline __m256 pair_to_halves(const float* f, __m256i idx) { // [f[0] x4, f[1] x4]
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(f)))), idx);
}

inline float fold(__m256 acc, __m128 tail) {
  return hsum(_mm_add_ps(tail, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1))));
}

// 4-bit, R weight rows against MM rows of x (R * MM accumulators, independent FMA chains; the
// x loads shared by the R rows, the unpacked weights by the MM rows). A chunk is 64 elements
// (32 bytes, blocks b and b + 1): the low nibbles of its bytes are the even elements of both
// blocks, the high nibbles the odd ones, so x is stored per chunk as [even of b, even of b + 1,
// odd of b, odd of b + 1] (quantize_x_avx2) and one maddubs takes each half; lanes 0-3 of the 32-bit
// sums belong to block b, lanes 4-7 to block b + 1.
template <bool Q15, int R, int MM>
void rows4q(const Problem& p, const uint8_t* const* w, const RowScales* rs, int m0, float (*res)[4]) {
  const int K = p.K, nb = K / 32;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i k128 = _mm256_set1_epi16(128);
  const __m256i lo_hi = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  __m256 acc[R][MM];
  const int8_t* xq[MM];
  const int8_t* xr[MM]; // Q15: the low 7 bits
  const float* xd[MM];
  for (int m = 0; m < MM; ++m) {
    xq[m] = p.xq + static_cast<size_t>(m0 + m) * K;
    xr[m] = Q15 ? p.xlo + static_cast<size_t>(m0 + m) * K : nullptr;
    xd[m] = p.xd + static_cast<size_t>(m0 + m) * nb;
    for (int i = 0; i < R; ++i) acc[i][m] = _mm256_setzero_ps();
  }
  int b = 0;
  if constexpr (MM == 1 && Q15) {
    // One row of x (a decode step): x's four registers loaded once a chunk, then each weight
    // row in turn, start to finish. The general loop below keeps every row's unpacked nibbles
    // and scales live at once, which leaves GCC too few registers for the accumulators: it
    // spilled them, and each chunk waited on a store and a reload (a decode step's products,
    // prefetched, on one thread: 8.7 ms that way, 8.1 this way).
    const int8_t* x0 = xq[0];
    const int8_t* x1 = xr[0];
    for (; b + 2 <= nb; b += 2) {
      const __m256 d = pair_to_halves(xd[0] + b, lo_hi);
      const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + b * 32));
      const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + b * 32 + 32));
      const __m256i rl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1 + b * 32));
      const __m256i rh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1 + b * 32 + 32));
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i] + b * 16));
        const __m256i lo = _mm256_and_si256(v, mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
        const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
        const __m256i l16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, rl), _mm256_maddubs_epi16(hi, rh));
        const __m256i s32 = _mm256_add_epi32(_mm256_madd_epi16(s16, k128), _mm256_madd_epi16(l16, ones));
        acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(pair_to_halves(rs[i].scb + b, lo_hi), d),
                                    acc[i][0]);
      }
    }
  }
  for (; b + 2 <= nb; b += 2) { // every other case (the one-row loop leaves no pairs)
    __m256i lo[R], hi[R];
    __m256 ws[R];
    for (int i = 0; i < R; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i] + b * 16));
      lo[i] = _mm256_and_si256(v, mask);
      hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      ws[i] = pair_to_halves(rs[i].scb + b, lo_hi);
    }
    for (int m = 0; m < MM; ++m) {
      const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + b * 32));
      const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + b * 32 + 32));
      const __m256 d = pair_to_halves(xd[m] + b, lo_hi);
      for (int i = 0; i < R; ++i) {
        const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], xl), _mm256_maddubs_epi16(hi[i], xh));
        __m256i s32;
        if constexpr (Q15) {
          const __m256i* r = reinterpret_cast<const __m256i*>(xr[m] + b * 32);
          const __m256i l16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], _mm256_loadu_si256(r)),
                                               _mm256_maddubs_epi16(hi[i], _mm256_loadu_si256(r + 1)));
          s32 = _mm256_add_epi32(_mm256_madd_epi16(s16, k128), _mm256_madd_epi16(l16, ones));
        } else {
          s32 = _mm256_madd_epi16(s16, ones);
        }
        acc[i][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(ws[i], d), acc[i][m]);
      }
    }
  }
  __m128 tail[R][MM];
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MM; ++m) tail[i][m] = _mm_setzero_ps();
  if (b < nb) { // one block of 32: x stored [even, odd]
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int i = 0; i < R; ++i) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i] + b * 16));
      const __m128i lo = _mm_and_si128(v, m4);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
      for (int m = 0; m < MM; ++m) {
        const int8_t* x = xq[m] + b * 32;
        const __m128i s16 = _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x))),
                                          _mm_maddubs_epi16(hi, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16))));
        __m128i s32 = _mm_madd_epi16(s16, _mm_set1_epi16(Q15 ? 128 : 1));
        if constexpr (Q15) {
          const int8_t* y = xr[m] + b * 32;
          const __m128i l16 = _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128(reinterpret_cast<const __m128i*>(y))),
                                            _mm_maddubs_epi16(hi, _mm_loadu_si128(reinterpret_cast<const __m128i*>(y + 16))));
          s32 = _mm_add_epi32(s32, _mm_madd_epi16(l16, _mm_set1_epi16(1)));
        }
        tail[i][m] = _mm_mul_ps(_mm_cvtepi32_ps(s32), _mm_set1_ps(rs[i].scb[b] * xd[m][b]));
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MM; ++m) res[i][m] = fold(_mm256_add_ps(acc[i][m], bias_term(p, rs[i], m0 + m)), tail[i][m]);
}

// 8-bit: a block is 32 bytes. maddubs(q, x) could overflow 16 bits (255 * 127 * 2), so, as
// llama.cpp does, the weights are taken as q - 128 (signed), multiplied as |q - 128| against x
// with the sign of q - 128 moved onto x (at most 128 * 127 * 2 = 32512 a pair); the 128 * sum(x)
// this leaves out is in the bias term (quantize_x_avx2's xoff). Q15: the bytes widened to 16
// bits against x in int16 (madd_epi16: 255 * 16256 * 2 a pair, within 32 bits), q as it is.
template <bool Q15, int R, int MM>
void rows8q(const Problem& p, const uint8_t* const* w, const RowScales* rs, int m0, float (*res)[4]) {
  const int K = p.K, nb = K / 32;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][MM];
  const int8_t* xq[MM];
  const float* xd[MM];
  for (int m = 0; m < MM; ++m) {
    xq[m] = p.xq + static_cast<size_t>(m0 + m) * K;
    xd[m] = p.xd + static_cast<size_t>(m0 + m) * nb;
    for (int i = 0; i < R; ++i) acc[i][m] = _mm256_setzero_ps();
  }
  if constexpr (Q15) {
    const int16_t* xw[MM];
    for (int m = 0; m < MM; ++m) xw[m] = p.x16 + static_cast<size_t>(m0 + m) * K;
    for (int b = 0; b < nb; ++b) {
      __m256i lo[R], hi[R];
      __m256 ws[R];
      for (int i = 0; i < R; ++i) {
        const __m128i* wp = reinterpret_cast<const __m128i*>(w[i] + b * 32);
        lo[i] = _mm256_cvtepu8_epi16(_mm_loadu_si128(wp));
        hi[i] = _mm256_cvtepu8_epi16(_mm_loadu_si128(wp + 1));
        ws[i] = _mm256_broadcast_ss(rs[i].scb + b);
      }
      for (int m = 0; m < MM; ++m) {
        const __m256i* xp = reinterpret_cast<const __m256i*>(xw[m] + b * 32);
        const __m256i x0 = _mm256_loadu_si256(xp), x1 = _mm256_loadu_si256(xp + 1);
        const __m256 d = _mm256_broadcast_ss(xd[m] + b);
        for (int i = 0; i < R; ++i) {
          const __m256i s32 = _mm256_add_epi32(_mm256_madd_epi16(lo[i], x0), _mm256_madd_epi16(hi[i], x1));
          acc[i][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(ws[i], d), acc[i][m]);
        }
      }
    }
    for (int i = 0; i < R; ++i)
      for (int m = 0; m < MM; ++m) res[i][m] = hsum(_mm256_add_ps(acc[i][m], bias_term(p, rs[i], m0 + m)));
    return;
  }
  for (int b = 0; b < nb; ++b) {
    __m256i v[R], a[R];
    __m256 ws[R];
    for (int i = 0; i < R; ++i) {
      v[i] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i] + b * 32)), flip);
      a[i] = _mm256_abs_epi8(v[i]);
      ws[i] = _mm256_broadcast_ss(rs[i].scb + b);
    }
    for (int m = 0; m < MM; ++m) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + b * 32));
      const __m256 d = _mm256_broadcast_ss(xd[m] + b);
      for (int i = 0; i < R; ++i) {
        const __m256i xs = _mm256_sign_epi8(x, v[i]);
        const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(a[i], xs), ones);
        acc[i][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(ws[i], d), acc[i][m]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MM; ++m) res[i][m] = hsum(_mm256_add_ps(acc[i][m], bias_term(p, rs[i], m0 + m)));
}

using RowsQ = void (*)(const Problem&, const uint8_t* const*, const RowScales*, int, float (*)[4]);

// Weight rows taken together for MM rows of x: for 4-bit weights 4 for one row of x (four
// independent FMA chains, one x load for four rows), 2 for two to four (a prefill's 4 x rows
// against 2 weight rows: 8 accumulators, and each x load and x-scale shuffle serves two rows;
// ~8% faster than one weight row at 31 rows, 1536x576 on one thread). For 8-bit weights always 1: four 8-bit rows at a time read a matrix from DRAM
// ~1.6x slower than one (49152x576 on one thread: 4,450 against 2,750 CPU us; in cache it is
// 75 against 90-130), and a decode step's weights come from DRAM.
constexpr int rows_for(int bits, int mm) {
  return bits == 8 ? 1 : mm == 1 ? 4 : 2;
}

template <int BITS, bool Q15, int R, int MM>
constexpr RowsQ pick() {
  if constexpr (BITS == 4) return rows4q<Q15, R, MM>;
  return rows8q<Q15, R, MM>;
}


template <int BITS, bool Q15>
void rows_q(const Problem& p, int r0, int r1) {
  // [x rows in the call - 1][wide (R of rows_for) or one weight row]
  static constexpr RowsQ fns[4][2] = {{pick<BITS, Q15, 1, 1>(), pick<BITS, Q15, 4, 1>()},
                                      {pick<BITS, Q15, 1, 2>(), pick<BITS, Q15, 2, 2>()},
                                      {pick<BITS, Q15, 1, 3>(), pick<BITS, Q15, 2, 3>()},
                                      {pick<BITS, Q15, 1, 4>(), pick<BITS, Q15, 2, 4>()}};
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const uint8_t* wbase = reinterpret_cast<const uint8_t*>(p.w);
  const size_t sz = 2 * static_cast<size_t>(p.G) + p.K / 32;
  thread_local std::vector<float> sb;
  sb.resize(4 * sz);
  float* const scratch = sb.data(); // once: each use of a thread_local in this shared library is a call
  float res[4][4];
  for (int m0 = 0; m0 < p.M; m0 += 4) {
    const int mm = p.M - m0 < 4 ? p.M - m0 : 4;
    const int R = rows_for(BITS, mm);
    for (int r = r0; r < r1;) {
      const int n = r1 - r >= R ? R : 1;
      if (m0 == 0 && r + PREFETCH_ROWS + n <= p.N) prefetch_rows(p, r + PREFETCH_ROWS, n, row_bytes);
      const uint8_t* w[4];
      RowScales rs[4];
      for (int i = 0; i < n; ++i) {
        float* base = scratch + i * sz;
        w[i] = wbase + static_cast<size_t>(r + i) * row_bytes;
        rs[i] = row_scales_f32(p, r + i, base, base + p.G, base + 2 * p.G);
      }
      fns[mm - 1][n > 1 ? 1 : 0](p, w, rs, m0, res);
      for (int i = 0; i < n; ++i)
        for (int m = 0; m < mm; ++m)
          p.out[static_cast<size_t>(m0 + m) * p.N + r + i] = res[i][m];
      r += n;
    }
  }
}

} // namespace

namespace {

// Stores block b of x / d (32 ints q) as int8: whole (part -1), or its high part q >> 7 (part 0)
// or low 7 bits q & 127 (part 1); for 4-bit weights in the nibble order (quantize_x_avx2).
void store_block(const int32_t* q, int8_t* out, int b, int nb, int bits, int part) {
  int8_t v[32];
  for (int i = 0; i < 32; ++i) v[i] = static_cast<int8_t>(part < 0 ? q[i] : part == 0 ? q[i] >> 7 : q[i] & 127);
  if (bits != 4) {
    for (int i = 0; i < 32; ++i) out[b * 32 + i] = v[i];
    return;
  }
  // in a pair (b even with a next block, or b odd): [even b, even b + 1, odd b, odd b + 1];
  // a lone last block: [even, odd]
  const bool pair = b % 2 == 1 || b + 1 < nb;
  int8_t* base = pair ? out + (b - b % 2) * 32 + (b % 2) * 16 : out + b * 32;
  const int odd = pair ? 32 : 16;
  for (int i = 0; i < 16; ++i) {
    base[i] = v[2 * i];
    base[odd + i] = v[2 * i + 1];
  }
}

} // namespace

void quantize_x_avx2(const float* x, int K, int group_size, int bits, int8_t* xq, int8_t* xlo, int16_t* x16,
                     float* xd, float* xsum, float* xoff) {
  // int8: x / d in [-127, 127]; Q15 (xlo or x16 given): in [-16256, 16256] = 128 * [-127, 127] +
  // [0, 127], the high part to xq and the low 7 bits to xlo, or the whole to x16.
  const bool q15 = xlo != nullptr || x16 != nullptr;
  const float top = q15 ? 16256.f : 127.f;
  // The row kernels multiply 8-bit weights in int8 as q - 128 (sign trick), the others as q.
  const bool centred = bits == 8 && !q15;
  const int nb = K / 32, per = group_size / 32;
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int g = 0; g < K / group_size; ++g) xsum[g] = xoff[g] = 0.f;
  alignas(32) int32_t q[32];
  for (int b = 0; b < nb; ++b) {
    const float* xb = x + b * 32;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float am = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float d = am / top;
    const __m256 id = _mm256_set1_ps(am > 0.f ? top / am : 0.f);
    __m256i qs = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) { // rounds to nearest even (the default MXCSR mode); |v * id| <= top
      const __m256i qj = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
      qs = _mm256_add_epi32(qs, qj);
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 8 * j), qj);
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(qs), _mm256_extracti128_si256(qs, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    const int qsum = _mm_cvtsi128_si32(s4);
    xd[b] = d;
    xsum[b / per] += d * static_cast<float>(qsum); // the rounded x's sum (kernels.h says why)
    if (x16 != nullptr) {
      for (int i = 0; i < 32; ++i) x16[b * 32 + i] = static_cast<int16_t>(q[i]);
    } else {
      for (int part = 0; part < (xlo != nullptr ? 2 : 1); ++part)
        store_block(q, part == 0 ? xq : xlo, b, nb, bits, xlo == nullptr ? -1 : part);
    }
  }
  for (int g = 0; g < K / group_size; ++g) xoff[g] = centred ? 128.f * xsum[g] : 0.f;
}


void rows_avx2_q8(const Problem& p, int r0, int r1) {
  if (p.bits == 4)
    rows_q<4, false>(p, r0, r1);
  else
    rows_q<8, false>(p, r0, r1);
}

void rows_avx2_q15(const Problem& p, int r0, int r1) {
  if (p.bits == 4)
    rows_q<4, true>(p, r0, r1);
  else
    rows_q<8, true>(p, r0, r1);
}

} // namespace mlxrt_qmv
