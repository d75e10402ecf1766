// The AVX-512 integer kernel (F, BW, VL and VNNI; compiled with them for this file only and run
// only where the CPU has them, qmv.cpp checks): x in 8 bits per block of 32 (quantize_x_int8),
// each 64-byte load of weights meeting it in vpdpbusd (unsigned weight bytes times signed x
// bytes, four products summed into each 32-bit lane, no saturation), the 32-bit sums of a block
// scaled in float once (scale of the weights' group times x's block scale) and added into the
// row's float accumulator in block order. Every output element is that one sequence of operations
// whatever rows of x or weights run beside it (the variants below only interleave independent
// chains; from PRE_ROWS rows of x, tile_pre() takes the same vectors made once a band), so a
// row's result is its own bit for bit, alone or in a batch of any size.
//
// 4-bit weights: a 64-byte chunk holds four blocks (128 elements); its low nibbles are the even
// elements of the four blocks, 16 each, its high nibbles the odd ones, so x is laid out per chunk
// as [even elements of blocks 0-3 | odd elements of blocks 0-3] (quantize_x_int8's layout 4) and
// the 32-bit lanes 4j..4j+3 of the sums belong to block j. 8-bit weights: a chunk is two blocks,
// x in order, lanes 8j..8j+7 block j; 3-, 5- and 6-bit weights are unpacked to those bytes (the
// same integers, so the same products as the layer widened to 8 bits). The last chunk of a row may be partial: its weight bytes,
// scales and x scales are read with masks (zeros), and x's row is padded with zeros to whole
// chunks, so it is the same loop.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels.h"
#include "prefetch_x86.h"
#include "vbmi_unpack.h"

namespace mlxrt_qmv {

namespace {

// The 16 lanes' block within a chunk: [0 x4, 1 x4, 2 x4, 3 x4] (4-bit), [0 x8, 1 x8] (8-bit).
inline __m512i block_index(int bits) {
  return bits == 4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                   : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
}

// A chunk's n per-block scales (n <= 4; the rest 0) as float32. Whole chunks (4 blocks at 4
// bits, 2 at 8) load unmasked: a masked load cost far more here (Zen 4).
inline __m128 chunk_scales(const float* f, int n) {
  return n == 4 ? _mm_loadu_ps(f)
      : n == 2 ? _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(f)))
               : _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << n) - 1), f);
}

inline int first_two(const uint16_t* f) {
  int v;
  std::memcpy(&v, f, sizeof v);
  return v;
}

// The same from float16 scales as stored, widened.
inline __m128 chunk_scales(const uint16_t* f, int n) {
  const __m128i h = n == 4 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(f))
      : n == 2 ? _mm_cvtsi32_si128(first_two(f))
               : _mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << n) - 1), f);
  return _mm_cvtph_ps(h);
}

// Per-block scales (n of them from f, the rest 0) spread over the lanes of their blocks.
template <typename S>
inline __m512 spread(const S* f, int n, __m512i idx) {
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(chunk_scales(f, n)));
}

// One weight row: its bytes and its scales and biases, float32 (S = float) or float16 as stored
// (S = uint16_t: a lone row of x reads them in place, widened in registers, the same values).
template <typename S>
struct WRowT {
  const uint8_t* w;
  const S* scb; // the weights' scale of each block of 32
  const S* sc;
  const S* bi;
};
using WRow = WRowT<float>;

// Up to 16 scales or biases from p (the lanes past mask zero) as float32.
inline __m512 load16(const float* p, __mmask16 m) {
  return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load16(const uint16_t* p, __mmask16 m) {
  if (m == 0xFFFF) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

// Up to 16 biases of row r: read, or (r.bi null: Problem::centre) -centre times the scales, which
// is exactly the stored biases (checked when the layer was installed; a power of two times a
// float16 scale is exact in float32).
template <typename S>
inline __m512 biases16(const WRowT<S>& r, int g, __mmask16 m, __m512 neg_centre) {
  return r.bi != nullptr ? load16(r.bi + g, m) : _mm512_mul_ps(load16(r.sc + g, m), neg_centre);
}

// sum_g bias[g] * xsum[g] + scale[g] * xoff[g], spread over 16 lanes, the last G % 16 masked.
template <typename S>
inline __m512 bias_term(const WRowT<S>& r, const float* xs, const float* xo, int G, float centre = 0.f) {
  const __m512 neg = _mm512_set1_ps(-centre);
  __m512 a = _mm512_setzero_ps();
  int g = 0;
  for (; g + 16 <= G; g += 16) {
    a = _mm512_fmadd_ps(biases16(r, g, 0xFFFF, neg), _mm512_loadu_ps(xs + g), a);
    a = _mm512_fmadd_ps(load16(r.sc + g, 0xFFFF), _mm512_loadu_ps(xo + g), a);
  }
  if (g < G) {
    const __mmask16 m = static_cast<__mmask16>((1u << (G - g)) - 1);
    a = _mm512_fmadd_ps(biases16(r, g, m, neg), _mm512_maskz_loadu_ps(m, xs + g), a);
    a = _mm512_fmadd_ps(load16(r.sc + g, m), _mm512_maskz_loadu_ps(m, xo + g), a);
  }
  return a;
}

// out[k] = _mm512_reduce_add_ps(v[k]) for 16 vectors, bit for bit, in 45 operations instead of
// 16 serial trees: the same additions (lanes l and l + 8, then l and l + 4, l and l + 2, l and
// l + 1; a sum's operands in either order are the same float), four vectors' lanes at a time.
// out[4 * j + t] is v[4 * t + j]'s sum.
inline void reduce16(const __m512* v, float* out) {
  __m512 a[8], b[4], c[2];
  for (int k = 0; k < 8; ++k) // [lo 256 of v2k | lo 256 of v2k+1] + [hi 256 | hi 256]
    a[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
  for (int k = 0; k < 4; ++k) // 128-bit lane j: v[4k + j]'s lanes l + (l + 4)
    b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xDD));
  for (int k = 0; k < 2; ++k) // lane j: [v[8k + j]: 0 + 2, 1 + 3 | v[8k + 4 + j]: 0 + 2, 1 + 3]
    c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44),
                         _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD)));
}

// The end of a tile: res[m][i] = the sum of the lanes of acc[i][m] + the pair's bias term (sum_g
// bias[g] * xsum[g] + scale[g] * xoff[g], 16 groups a step, two fused multiply-adds from zero,
// the last G % 16 masked), the sum's tree _mm512_reduce_add_ps's. Each row's and x row's groups
// are loaded once for the tile and the pairs' sums reduced together (reduce16): per pair, the
// bias term and a serial sum tree had cost about as much as the products at K = 576.
template <int R, int MM>
inline void finish_rows(const Problem& p, const WRow* rows, int m0, const __m512 (&acc)[R][MM], float (*res)[4]) {
  __m512 v[16];
  for (int k = 0; k < 16; ++k) v[k] = _mm512_setzero_ps();
  const float* xs[MM];
  const float* xo[MM];
  for (int m = 0; m < MM; ++m) {
    xs[m] = p.xsum + static_cast<size_t>(m0 + m) * p.G;
    xo[m] = p.xoff + static_cast<size_t>(m0 + m) * p.G;
  }
  for (int g = 0; g < p.G; g += 16) {
    const __mmask16 mk = p.G - g >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (p.G - g)) - 1);
    __m512 bs[MM], os[MM];
    for (int m = 0; m < MM; ++m) {
      bs[m] = load16(xs[m] + g, mk);
      os[m] = load16(xo[m] + g, mk);
    }
    for (int i = 0; i < R; ++i) {
      const __m512 bi = load16(rows[i].bi + g, mk);
      const __m512 sc = load16(rows[i].sc + g, mk);
      for (int m = 0; m < MM; ++m) {
        v[4 * i + m] = _mm512_fmadd_ps(bi, bs[m], v[4 * i + m]);
        v[4 * i + m] = _mm512_fmadd_ps(sc, os[m], v[4 * i + m]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MM; ++m) v[4 * i + m] = _mm512_add_ps(acc[i][m], v[4 * i + m]);
  if constexpr (R * MM < 8) { // 2 x 2: four trees, not reduce16 on 12 zeros
    for (int i = 0; i < R; ++i)
      for (int m = 0; m < MM; ++m) res[m][i] = _mm512_reduce_add_ps(v[4 * i + m]);
    return;
  }
  alignas(64) float sums[16];
  reduce16(v, sums);
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MM; ++m) res[m][i] = sums[4 * m + i]; // v[4i + m]'s sum is at 4m + i
}

template <int R, int MM, typename S = float>
inline void finish(const Problem& p, const WRowT<S>* rows, int m0, const __m512 (&acc)[R][MM], float (*res)[4]) {
  if constexpr (MM == 1) { // a decode step: each row's term and tree (measured ~5% faster there)
    const float* xs = p.xsum + static_cast<size_t>(m0) * p.G;
    const float* xo = p.xoff + static_cast<size_t>(m0) * p.G;
    for (int i = 0; i < R; ++i)
      res[0][i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], bias_term(rows[i], xs, xo, p.G, p.centre)));
  } else {
    finish_rows<R, MM>(p, rows, m0, acc, res);
  }
}

// R weight rows against MM rows of x (m0 ..): out[m][i] = row i . x row m. S: the scales' type
// (float16 as stored only for one row of x, MM == 1).
template <int BITS, int R, int MM, typename S = float>
void tile(const Problem& p, const WRowT<S>* rows, int m0, float (*res)[4]) {
  constexpr int BPC = BITS == 4 ? 4 : 2; // blocks a chunk
  const int nb = p.K / 32;
  const int chunks = (nb + BPC - 1) / BPC;
  const __m512i idx = block_index(BITS);
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512 acc[R][MM];
  const int8_t* xq[MM];
  const float* xd[MM];
  for (int m = 0; m < MM; ++m) {
    xq[m] = p.xq + static_cast<size_t>(m0 + m) * p.xstride;
    xd[m] = p.xd + static_cast<size_t>(m0 + m) * nb;
    for (int i = 0; i < R; ++i) acc[i][m] = _mm512_setzero_ps();
  }
  for (int c = 0; c < chunks; ++c) {
    const int b = c * BPC;
    const int nbc = nb - b < BPC ? nb - b : BPC;
    const __mmask64 bytes = nbc == BPC ? ~0ULL : (1ULL << (nbc * 32 * BITS / 8)) - 1;
    __m512i lo[R], hi[R];
    __m512 ws[R];
    for (int i = 0; i < R; ++i) {
      const uint8_t* src = rows[i].w + static_cast<size_t>(c) * 64;
      const __m512i v = nbc == BPC ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(bytes, src);
      if constexpr (BITS == 4) {
        lo[i] = _mm512_and_si512(v, mask);
        hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      } else {
        lo[i] = v;
      }
      ws[i] = spread(rows[i].scb + b, nbc, idx);
    }
    for (int m = 0; m < MM; ++m) {
      const int8_t* x = xq[m] + static_cast<size_t>(c) * (BITS == 4 ? 128 : 64);
      const __m512i x0 = _mm512_loadu_si512(x);
      const __m512i x1 = BITS == 4 ? _mm512_loadu_si512(x + 64) : x0;
      const __m512 d = spread(xd[m] + b, nbc, idx);
      for (int i = 0; i < R; ++i) {
        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], x0);
        if constexpr (BITS == 4) s = _mm512_dpbusd_epi32(s, hi[i], x1);
        acc[i][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ws[i], d), acc[i][m]);
      }
    }
  }
  finish<R, MM, S>(p, rows, m0, acc, res);
}

using TileFn = void (*)(const Problem&, const WRow*, int, float (*)[4]);
using TileHFn = void (*)(const Problem&, const WRowT<uint16_t>*, int, float (*)[4]);

// Weights rows taken together: four for one row of x (a decode step: four independent chains,
// one x load for four rows), two for two to four rows of x (eight accumulators).
template <int BITS>
constexpr TileFn tiles[4][2] = {{tile<BITS, 1, 1>, tile<BITS, 4, 1>},
                                {tile<BITS, 1, 2>, tile<BITS, 2, 2>},
                                {tile<BITS, 1, 3>, tile<BITS, 2, 3>},
                                {tile<BITS, 1, 4>, tile<BITS, 2, 4>}};
// One row of x with float16 scales read in place: one weight row, four.
template <int BITS>
constexpr TileHFn tiles_h[2] = {tile<BITS, 1, 1, uint16_t>, tile<BITS, 4, 1, uint16_t>};

// Several rows of x (a prefill chunk, a batch's step): each band's operands made once, before any
// row of x meets them, and each row of x's block scales spread once a call, so that the tile
// below does only the products. Per weight row and chunk (Pre::ROW bytes a chunk): the unpacked
// low nibbles (or the 8-bit bytes), the high nibbles (4-bit), the block scales spread over the
// lanes; the same vectors tile() makes from the stored bytes, so the same chain of operations.
// tile() remade them for every tile: with two weight rows against four rows of x, 3.5 of its
// 8.5 vector operations a pair and chunk (4-bit) were unpacking and spreading.
struct Pre {
  // bytes a chunk of a row: 4-bit lo 64, hi 64, 16 float scales; 8-bit only the scales (the
  // bytes are the operand as stored, read from the row)
  static constexpr int row(int bits) { return bits == 4 ? 192 : 64; }
  static constexpr int scales_at(int bits) { return bits == 4 ? 128 : 0; }
  const uint8_t* band; // the band's rows, chunks * row(bits) bytes each
  const float* xd; // M rows of chunks * 16 spread x block scales
  int chunks;
};

template <int BITS>
void prepare_row(const WRow& r, int nb, uint8_t* out) {
  constexpr int BPC = BITS == 4 ? 4 : 2;
  const int chunks = (nb + BPC - 1) / BPC;
  const __m512i idx = block_index(BITS);
  const __m512i mask = _mm512_set1_epi8(0x0F);
  for (int c = 0; c < chunks; ++c) {
    const int b = c * BPC;
    const int nbc = nb - b < BPC ? nb - b : BPC;
    const __mmask64 bytes = nbc == BPC ? ~0ULL : (1ULL << (nbc * 32 * BITS / 8)) - 1;
    uint8_t* o = out + static_cast<size_t>(c) * Pre::row(BITS);
    if constexpr (BITS == 4) {
      const uint8_t* src = r.w + static_cast<size_t>(c) * 64;
      const __m512i v = nbc == BPC ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(bytes, src);
      _mm512_storeu_si512(o, _mm512_and_si512(v, mask));
      _mm512_storeu_si512(o + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
    }
    _mm512_storeu_ps(o + Pre::scales_at(BITS), spread(r.scb + b, nbc, idx));
  }
}

template <int BITS>
void prepare_x(const Problem& p, int chunks, float* out) {
  constexpr int BPC = BITS == 4 ? 4 : 2;
  const int nb = p.K / 32;
  const __m512i idx = block_index(BITS);
  for (int m = 0; m < p.M; ++m)
    for (int c = 0; c < chunks; ++c) {
      const int b = c * BPC;
      const int nbc = nb - b < BPC ? nb - b : BPC;
      _mm512_storeu_ps(out + (static_cast<size_t>(m) * chunks + c) * 16, spread(p.xd + static_cast<size_t>(m) * nb + b, nbc, idx));
    }
}

// R weight rows (from band row j0) against MM rows of x (from m0): tile()'s chain for each pair.
template <int BITS, int R, int MM>
void tile_pre(const Problem& p, const Pre& pre, const WRow* rows, int j0, int m0, float (*res)[4]) {
  __m512 acc[R][MM];
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MM; ++m) acc[i][m] = _mm512_setzero_ps();
  constexpr int ROW = Pre::row(BITS);
  const uint8_t* w0 = pre.band + static_cast<size_t>(j0) * pre.chunks * ROW;
  const size_t wstep = static_cast<size_t>(pre.chunks) * ROW;
  const int nb = p.K / 32;
  // 8-bit: the last chunk of a row may be one block (its other half masked to zeros, as tile())
  const __mmask64 last = nb % 2 ? (1ULL << 32) - 1 : ~0ULL;
  for (int c = 0; c < pre.chunks; ++c) {
    __m512i lo[R], hi[R];
    __m512 ws[R];
    for (int i = 0; i < R; ++i) {
      const uint8_t* o = w0 + i * wstep + static_cast<size_t>(c) * ROW;
      if constexpr (BITS == 4) {
        lo[i] = _mm512_loadu_si512(o);
        hi[i] = _mm512_loadu_si512(o + 64);
      } else {
        const uint8_t* src = rows[j0 + i].w + static_cast<size_t>(c) * 64;
        lo[i] = c + 1 < pre.chunks ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(last, src);
      }
      ws[i] = _mm512_loadu_ps(o + Pre::scales_at(BITS));
    }
    for (int m = 0; m < MM; ++m) {
      const int8_t* x = p.xq + static_cast<size_t>(m0 + m) * p.xstride + static_cast<size_t>(c) * (BITS == 4 ? 128 : 64);
      const __m512i x0 = _mm512_loadu_si512(x);
      const __m512i x1 = BITS == 4 ? _mm512_loadu_si512(x + 64) : x0;
      const __m512 d = _mm512_loadu_ps(pre.xd + (static_cast<size_t>(m0 + m) * pre.chunks + c) * 16);
      for (int i = 0; i < R; ++i) {
        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], x0);
        if constexpr (BITS == 4) s = _mm512_dpbusd_epi32(s, hi[i], x1);
        acc[i][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ws[i], d), acc[i][m]);
      }
    }
  }
  finish<R, MM>(p, rows + j0, m0, acc, res);
}

using PreFn = void (*)(const Problem&, const Pre&, const WRow*, int, int, float (*)[4]);

// [rows of x - 1][weight rows - 1]: four by four (16 accumulators), the edges smaller.
template <int BITS>
constexpr PreFn pre_tiles[4][4] = {
    {tile_pre<BITS, 1, 1>, tile_pre<BITS, 2, 1>, tile_pre<BITS, 3, 1>, tile_pre<BITS, 4, 1>},
    {tile_pre<BITS, 1, 2>, tile_pre<BITS, 2, 2>, tile_pre<BITS, 3, 2>, tile_pre<BITS, 4, 2>},
    {tile_pre<BITS, 1, 3>, tile_pre<BITS, 2, 3>, tile_pre<BITS, 3, 3>, tile_pre<BITS, 4, 3>},
    {tile_pre<BITS, 1, 4>, tile_pre<BITS, 2, 4>, tile_pre<BITS, 3, 4>, tile_pre<BITS, 4, 4>}};

// Rows of x from which the band's operands are made first (Pre): below it tile() is as fast or
// faster (the 28 MB head at 2 rows: 1.33 against 0.76 ms a row, at 8: 0.55 against 0.61).
constexpr int PRE_ROWS = 8;


// Rows of x taken against one band of weight rows before the next band: the band's weights stay
// in L1 while every row of x in the block meets them.
constexpr int X_BLOCK = 64;
constexpr int W_BAND = 16;

// One weight row to one byte a value (unpack_row's scalar loop took ~0.25 ns a value, as long as
// the products of one row of x).
template <int BITS>
__attribute__((target("avx512vbmi"))) void unpack_vbmi(const uint8_t* w, int K, uint8_t* q) {
  const __m512i perm = _mm512_load_si512(vbmi_unpack<BITS>.perm), shift = _mm512_load_si512(vbmi_unpack<BITS>.shift);
  int k = 0;
  for (; k + 64 <= K; k += 64) { // 8 * BITS bytes in, 64 out
    const __m512i v = _mm512_maskz_loadu_epi8((1ULL << (8 * BITS)) - 1, w + k / 8 * BITS);
    _mm512_storeu_si512(q + k, unpack64<BITS>(v, perm, shift, 0xFFFF));
  }
  if (k < K) { // the last 32 values (K is whole blocks of 32)
    const __m512i v = _mm512_maskz_loadu_epi8((1ULL << (4 * BITS)) - 1, w + k / 8 * BITS);
    _mm512_mask_storeu_epi8(q + k, 0xFFFFFFFFULL, unpack64<BITS>(v, perm, shift, 0xFFFF));
  }
}

// R weight rows of BITS (3, 5 or 6) bits against MM rows of x (from m0), unpacked in registers
// (64 values a step, unpack64) straight into tile<8, R, MM>'s chain: the same integers in the same
// vpdpbusd, each chunk's sums scaled by the weights' block scale times x's and added into the
// pair's accumulator in block order, the same finish. So the product is, bit for bit, that of the
// layer widened to 8 bits (and of the band loops below from PRE_ROWS rows of x). Unpacking a band
// into a buffer first and running tile<8> on it took 132 us a 2048x640 5-bit product for one row
// of x against 51 for the widened layer (98 against 67 for two rows); in registers the packed
// bytes are all it reads. The scales of a pair of chunks (four blocks) load at once and meet x's
// there, in four lanes (the same products ws * d that tile() makes spread over sixteen), before
// each chunk spreads its two. A 64-byte load of a chunk's 8 * BITS bytes is unmasked unless it
// would run past the matrix (wend); a partial last chunk's second block is zeroed after
// unpacking (keep). S: float16 scales read in place only for one row of x, as tile().
template <int BITS, int R, int MM, typename S>
__attribute__((target("avx512vbmi"))) void tile_packed(const Problem& p, const WRowT<S>* rows, int m0,
                                                       const uint8_t* wend, float (*res)[4]) {
  constexpr int CB = 8 * BITS; // bytes a chunk of 64 values
  const int nb = p.K / 32;
  const __m512i perm = _mm512_load_si512(vbmi_unpack<BITS>.perm), shift = _mm512_load_si512(vbmi_unpack<BITS>.shift);
  const __m512i lanes[2] = {block_index(8), _mm512_add_epi32(block_index(8), _mm512_set1_epi32(2))};
  const int8_t* xq[MM];
  const float* xd[MM];
  __m512 a[R][MM]; // finish()'s acc, apart until then: an array passed on by reference was stored every step
  for (int m = 0; m < MM; ++m) {
    xq[m] = p.xq + static_cast<size_t>(m0 + m) * p.xstride;
    xd[m] = p.xd + static_cast<size_t>(m0 + m) * nb;
    for (int i = 0; i < R; ++i) a[i][m] = _mm512_setzero_ps();
  }
  for (int b = 0; b < nb; b += 4) {
    const int n4 = nb - b < 4 ? nb - b : 4;
    __m128 wd[R][MM];
    {
      __m128 d[MM];
      for (int m = 0; m < MM; ++m) d[m] = chunk_scales(xd[m] + b, n4);
      for (int i = 0; i < R; ++i) {
        const __m128 ws = chunk_scales(rows[i].scb + b, n4);
        for (int m = 0; m < MM; ++m) wd[i][m] = _mm_mul_ps(ws, d[m]);
      }
    }
    for (int h = 0; 2 * h < n4; ++h) {
      const int c = b / 2 + h;
      const __mmask16 keep = n4 - 2 * h >= 2 ? 0xFFFF : 0x00FF;
      __m512i w[R];
      for (int i = 0; i < R; ++i) {
        const uint8_t* src = rows[i].w + static_cast<size_t>(c) * CB;
        const __m512i v = src + 64 <= wend ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8((1ULL << CB) - 1, src);
        w[i] = unpack64<BITS>(v, perm, shift, keep);
      }
      for (int m = 0; m < MM; ++m) {
        const __m512i x0 = _mm512_loadu_si512(xq[m] + static_cast<size_t>(c) * 64);
        for (int i = 0; i < R; ++i) {
          const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[i], x0);
          const __m512 ws = _mm512_permutexvar_ps(lanes[h], _mm512_castps128_ps512(wd[i][m]));
          a[i][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), ws, a[i][m]);
        }
      }
    }
  }
  __m512 acc[R][MM];
  for (int i = 0; i < R; ++i)
    for (int m = 0; m < MM; ++m) acc[i][m] = a[i][m];
  finish<R, MM, S>(p, rows, m0, acc, res);
}

using PackedFn = void (*)(const Problem&, const WRow*, int, const uint8_t*, float (*)[4]);

// tiles' shapes for packed rows (band rows' scales as float32)
template <int BITS>
constexpr PackedFn packed_tiles[4][2] = {{tile_packed<BITS, 1, 1, float>, tile_packed<BITS, 4, 1, float>},
                                         {tile_packed<BITS, 1, 2, float>, tile_packed<BITS, 2, 2, float>},
                                         {tile_packed<BITS, 1, 3, float>, tile_packed<BITS, 2, 3, float>},
                                         {tile_packed<BITS, 1, 4, float>, tile_packed<BITS, 2, 4, float>}};

// A lone row of x against rows [r0, r1) of BITS (3, 5 or 6) bits whose scales (S: float or
// float16, read in place) are one a block of 32: tile_packed four rows at a time, the rows
// prefetch_ahead() ahead asked for as the 8-bit loops do.
template <int BITS, typename S>
__attribute__((target("avx512vbmi"))) void lone_packed(const Problem& p, int r0, int r1) {
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const uint8_t* wbase = reinterpret_cast<const uint8_t*>(p.w);
  const uint8_t* wend = wbase + static_cast<size_t>(p.N) * row_bytes;
  const S* sc = static_cast<const S*>(p.scales);
  const S* bi = p.centre > 0.f ? nullptr : static_cast<const S*>(p.biases);
  WRowT<S> rows[4];
  float res[4][4];
  for (int r = r0; r < r1;) {
    const int n = r1 - r >= 4 ? 4 : 1;
    for (int i = 0; i < n; ++i) {
      const size_t off = static_cast<size_t>(r + i) * p.G;
      rows[i] = {wbase + static_cast<size_t>(r + i) * row_bytes, sc + off, sc + off, bi ? bi + off : nullptr};
    }
    if (r + prefetch_ahead(row_bytes) + n <= p.N) prefetch_rows(p, r + prefetch_ahead(row_bytes), n, row_bytes);
    if (n > 1)
      tile_packed<BITS, 4, 1, S>(p, rows, 0, wend, res);
    else
      tile_packed<BITS, 1, 1, S>(p, rows, 0, wend, res);
    for (int i = 0; i < n; ++i) p.out[r + i] = res[0][i];
    r += n;
  }
}

bool has_vbmi() {
  static const bool yes = __builtin_cpu_supports("avx512vbmi");
  return yes;
}

// BITS: the stored width. 4 and 8 run their own loops on the stored bytes; 3, 5 and 6 (a GGUF
// conversion's widths: Q5_0, Q5_1, Q5_K) run the 8-bit loops on the same integers as the portable
// loops' (x is in order, as for 8-bit weights: quantize_x_int8): for fewer than PRE_ROWS rows of x
// with VBMI unpacked in registers (tile_packed; a lone row with float16 or float32 scales of 32 in
// lone_packed, the scales in place), else each band's rows unpacked to one byte a value first,
// once a band for every row of x.
template <int BITS>
void rows_vnni(const Problem& p, int r0, int r1) {
  constexpr int LOOP = BITS == 4 ? 4 : 8;
  if constexpr (LOOP != BITS) {
    // A lone row of x (a decode step), scales one a block: unpacked in registers (tile_packed).
    if (p.M == 1 && p.group_size == 32 && (p.stype == ScaleType::f16 || p.stype == ScaleType::f32) && has_vbmi()) {
      if (p.stype == ScaleType::f16)
        lone_packed<BITS, uint16_t>(p, r0, r1);
      else
        lone_packed<BITS, float>(p, r0, r1);
      return;
    }
  }
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const uint8_t* wbase = reinterpret_cast<const uint8_t*>(p.w);
  const int nb = p.K / 32, per = p.group_size / 32;
  // per band row: sc, bi (G each; converted when stored in half types), scb (nb)
  const size_t sz = 2 * static_cast<size_t>(p.G) + nb;
  thread_local std::vector<float> sb;
  sb.resize(W_BAND * sz);
  float* const scratch = sb.data();
  thread_local std::vector<uint8_t> ub; // the band's rows unpacked (BITS 3, 5, 6)
  if constexpr (LOOP != BITS) ub.resize(static_cast<size_t>(W_BAND) * p.K);
  WRow band[W_BAND];
  float res[4][4];
  // 3, 5 or 6 bits against fewer rows of x than PRE_ROWS with VBMI: the rows stay packed (tile_packed)
  bool packed = false;
  if constexpr (LOOP != BITS) packed = p.M < PRE_ROWS && has_vbmi();
  const uint8_t* wend = wbase + static_cast<size_t>(p.N) * row_bytes;
  // several rows of x: the band's operands and x's spread scales made once (Pre)
  constexpr int BPC = LOOP == 4 ? 4 : 2;
  const int chunks = (nb + BPC - 1) / BPC;
  const size_t pre_row = static_cast<size_t>(chunks) * Pre::row(LOOP);
  thread_local std::vector<uint8_t> pre;
  thread_local std::vector<float> xspread;
  if (p.M >= PRE_ROWS) {
    pre.resize(W_BAND * pre_row);
    xspread.resize(static_cast<size_t>(p.M) * chunks * 16);
    prepare_x<LOOP>(p, chunks, xspread.data());
  }
  if constexpr (LOOP == BITS) {
    // A lone row of x (a decode step) with float16 scales, one per block: the tiles read them as
    // stored, so a row's scales and biases are half the bytes and no pass widens them first.
    if (p.M == 1 && per == 1 && p.stype == ScaleType::f16) {
      const uint16_t* sc = static_cast<const uint16_t*>(p.scales);
      const uint16_t* bi = p.centre > 0.f ? nullptr : static_cast<const uint16_t*>(p.biases);
      WRowT<uint16_t> rows[4];
      for (int r = r0; r < r1;) {
        const int n = r1 - r >= 4 ? 4 : 1;
        for (int i = 0; i < n; ++i) {
          const size_t off = static_cast<size_t>(r + i) * p.G;
          rows[i] = {wbase + static_cast<size_t>(r + i) * row_bytes, sc + off, sc + off, bi ? bi + off : nullptr};
        }
        if (r + prefetch_ahead(row_bytes) + n <= p.N) prefetch_rows(p, r + prefetch_ahead(row_bytes), n, row_bytes);
        tiles_h<LOOP>[n > 1 ? 1 : 0](p, rows, 0, res);
        for (int i = 0; i < n; ++i) p.out[r + i] = res[0][i];
        r += n;
      }
      return;
    }
  }
  for (int rb = r0; rb < r1; rb += W_BAND) {
    const int re = r1 - rb < W_BAND ? r1 : rb + W_BAND;
    for (int r = rb; r < re; ++r) {
      float* base = scratch + static_cast<size_t>(r - rb) * sz;
      WRow& wr = band[r - rb];
      wr.w = wbase + static_cast<size_t>(r) * row_bytes;
      if constexpr (LOOP != BITS) {
        if (!packed) {
          uint8_t* q = ub.data() + static_cast<size_t>(r - rb) * p.K;
          if (has_vbmi())
            unpack_vbmi<BITS>(wr.w, p.K, q);
          else
            unpack_row(reinterpret_cast<const uint32_t*>(wr.w), BITS, p.K, q);
          wr.w = q;
        }
      }
      const size_t off = static_cast<size_t>(r) * p.G;
      if (p.stype == ScaleType::f32) {
        wr.sc = static_cast<const float*>(p.scales) + off;
        wr.bi = static_cast<const float*>(p.biases) + off;
      } else {
        scales_avx2(p, r, base, base + p.G);
        wr.sc = base;
        wr.bi = base + p.G;
      }
      if (per == 1) {
        wr.scb = wr.sc;
      } else {
        float* scb = base + 2 * p.G;
        for (int b = 0; b < nb; ++b) scb[b] = wr.sc[b / per];
        wr.scb = scb;
      }
    }
    if (p.M >= PRE_ROWS) {
      for (int r = rb; r < re; ++r) {
        // the next rows from DRAM while this one is unpacked (a head of 28 MB took 3 times as long without)
        if (r + 4 * PREFETCH_ROWS < p.N) prefetch_rows(p, r + 4 * PREFETCH_ROWS, 1, row_bytes);
        prepare_row<LOOP>(band[r - rb], nb, pre.data() + static_cast<size_t>(r - rb) * pre_row);
      }
      const Pre pr{pre.data(), xspread.data(), chunks};
      for (int mb = 0; mb < p.M; mb += X_BLOCK) {
        const int me = p.M - mb < X_BLOCK ? p.M : mb + X_BLOCK;
        for (int m0 = mb; m0 < me; m0 += 4) {
          const int mm = me - m0 < 4 ? me - m0 : 4;
          for (int r = rb; r < re; r += 4) {
            const int n = re - r < 4 ? re - r : 4;
            pre_tiles<LOOP>[mm - 1][n - 1](p, pr, band, r - rb, m0, res);
            for (int m = 0; m < mm; ++m)
              for (int i = 0; i < n; ++i) p.out[static_cast<size_t>(m0 + m) * p.N + r + i] = res[m][i];
          }
        }
      }
      continue;
    }
    for (int mb = 0; mb < p.M; mb += X_BLOCK) {
      const int me = p.M - mb < X_BLOCK ? p.M : mb + X_BLOCK;
      for (int m0 = mb; m0 < me; m0 += 4) {
        const int mm = me - m0 < 4 ? me - m0 : 4;
        const int R = mm == 1 ? 4 : 2;
        for (int r = rb; r < re;) {
          const int n = re - r >= R ? R : 1;
          if (m0 == 0 && r + prefetch_ahead(row_bytes) + n <= p.N) prefetch_rows(p, r + prefetch_ahead(row_bytes), n, row_bytes);
          if constexpr (LOOP != BITS) {
            if (packed)
              packed_tiles<BITS>[mm - 1][n > 1 ? 1 : 0](p, band + (r - rb), m0, wend, res);
            else
              tiles<LOOP>[mm - 1][n > 1 ? 1 : 0](p, band + (r - rb), m0, res);
          } else {
            tiles<LOOP>[mm - 1][n > 1 ? 1 : 0](p, band + (r - rb), m0, res);
          }
          for (int m = 0; m < mm; ++m)
            for (int i = 0; i < n; ++i) p.out[static_cast<size_t>(m0 + m) * p.N + r + i] = res[m][i];
          r += n;
        }
      }
    }
  }
}

} // namespace

// quantize_x_int8 in AVX-512, the same bits: the block's max |x| (NaNs skipped, as std::max skips
// them), d and 1 / d as there, x * (1 / d) rounded to nearest even by vcvtps2dq (MXCSR's mode, as
// nearbyint) and truncated to a byte (as the cast), the integer sum exact in any order, the group
// sums in block order. The scalar loop took ~1.1 µs a row of 576 (nearbyint a call per element):
// ~15% of a row's products in a prefill chunk of SmolLM2, on the calling thread alone.
void quantize_x_int8_avx512(const float* x, int K, int group_size, int bits, int layout, int padded, int8_t* xq,
                            float* xd, float* xsum, float* xoff) {
  const int nb = K / 32, per = group_size / 32;
  for (int g = 0; g < K / group_size; ++g) xsum[g] = xoff[g] = 0.f;
  const int from = layout == 4 && bits == 4 ? nb / 4 * 128 : K;
  if (from < padded) std::memset(xq + from, 0, static_cast<size_t>(padded - from));
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int b = 0; b < nb; ++b) {
    __m512 a = _mm512_loadu_ps(x + b * 32), c = _mm512_loadu_ps(x + b * 32 + 16);
    const __m512 aa = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, a, _CMP_ORD_Q), _mm512_abs_ps(a));
    const __m512 ca = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(c, c, _CMP_ORD_Q), _mm512_abs_ps(c));
    const float am = _mm512_reduce_max_ps(_mm512_max_ps(aa, ca));
    const float d = am / 127.f;
    const float id = am > 0.f ? 127.f / am : 0.f;
    const bool split = layout == 4 && bits == 4;
    if (split) { // [even elements | odd elements]
      const __m512 e = _mm512_permutex2var_ps(a, even, c), o = _mm512_permutex2var_ps(a, odd, c);
      a = e;
      c = o;
    }
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id)));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(c, _mm512_set1_ps(id)));
    int8_t* at0 = split ? xq + (b / 4) * 128 + (b % 4) * 16 : xq + b * 32;
    int8_t* at1 = split ? at0 + 64 : at0 + 16;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(at0), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(at1), _mm512_cvtepi32_epi8(q1));
    const int qsum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    xd[b] = d;
    // a multiply, then an add (this file is built with FMA, which would fuse them: not the
    // portable loop's rounding where a group holds several blocks)
    const __m128 t = _mm_mul_ss(_mm_set_ss(d), _mm_set_ss(static_cast<float>(qsum)));
    xsum[b / per] = _mm_cvtss_f32(_mm_add_ss(_mm_set_ss(xsum[b / per]), t));
  }
}

bool packed_lone_rows_avx512() {
  return has_vbmi();
}

void rows_avx512_vnni(const Problem& p, int r0, int r1) {
  if (p.band != 0)
    rows_avx512_bands(p, r0, r1);
  else if (p.bits == 4)
    rows_vnni<4>(p, r0, r1);
  else if (p.bits == 8)
    rows_vnni<8>(p, r0, r1);
  else if (p.bits == 6)
    rows_vnni<6>(p, r0, r1);
  else if (p.bits == 5)
    rows_vnni<5>(p, r0, r1);
  else if (p.bits == 3)
    rows_vnni<3>(p, r0, r1);
  else
    rows_generic_int8(p, r0, r1);
}

} // namespace mlxrt_qmv
