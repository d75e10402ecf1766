// The portable kernel: plain C++ the compiler vectorizes for the target (NEON on aarch64,
// SSE2 on a baseline x86-64). Takes x as given (x_width 0).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "scales.h"

namespace mlxrt_qmv {

namespace {

template <int BITS>
void rows_bits(const Problem& p, int r0, int r1) {
  constexpr int per_word = 32 / BITS;
  constexpr uint32_t mask = (1u << BITS) - 1;
  const int K = p.K, G = p.G, gs = p.group_size, M = p.M;
  const int words = K / per_word;
  thread_local std::vector<float> sb;
  sb.resize(2 * static_cast<size_t>(G));
  float* sc = sb.data();
  float* bi = sb.data() + G;
  float q[32];
  // rows of x eight at a time (the accumulators' size): the primitive takes up to MAX_ROWS
  for (int r = r0; r < r1; ++r) {
    row_scales(p, r, sc, bi);
    const uint32_t* wr = p.w + static_cast<size_t>(r) * words;
    for (int m0 = 0; m0 < M; m0 += 8) {
      const int mm = M - m0 < 8 ? M - m0 : 8;
      float acc[8] = {0};
      for (int g = 0; g < G; ++g) {
        float t[8] = {0};
        for (int e = 0; e < gs; e += 32) {
          const int k = g * gs + e;
          const uint32_t* wp = wr + k / per_word;
          for (int i = 0; i < 32; ++i) q[i] = static_cast<float>((wp[i / per_word] >> (BITS * (i % per_word))) & mask);
          for (int m = 0; m < mm; ++m) {
            const float* xm = p.x + static_cast<size_t>(m0 + m) * K + k;
            float s = 0.f;
            for (int i = 0; i < 32; ++i) s += q[i] * xm[i];
            t[m] += s;
          }
        }
        for (int m = 0; m < mm; ++m) acc[m] += sc[g] * t[m] + bi[g] * p.xsum[static_cast<size_t>(m0 + m) * G + g];
      }
      for (int m = 0; m < mm; ++m) p.out[static_cast<size_t>(m0 + m) * p.N + r] = acc[m];
    }
  }
}

template <int BITS>
void dequant_bits(const Problem& p, int r0, int r1) {
  constexpr int per_word = 32 / BITS;
  constexpr uint32_t mask = (1u << BITS) - 1;
  const int K = p.K, G = p.G, gs = p.group_size;
  const int words = K / per_word;
  thread_local std::vector<float> sb;
  sb.resize(2 * static_cast<size_t>(G));
  float* sc = sb.data();
  float* bi = sb.data() + G;
  for (int r = r0; r < r1; ++r) {
    row_scales(p, r, sc, bi);
    const uint32_t* wr = p.w + static_cast<size_t>(r) * words;
    float* o = p.out + static_cast<size_t>(r) * K;
    for (int k = 0; k < K; ++k) {
      const int g = k / gs;
      o[k] = sc[g] * static_cast<float>((wr[k / per_word] >> (BITS * (k % per_word))) & mask) + bi[g];
    }
  }
}

// Weight row w (K values of BITS bits each, packed little end first into a bit stream: MLX's
// affine layout for any bits, whole uint32 words for 2, 4 and 8) unpacked to one byte a value.
// For 3, 5 and 6 bits a block of 32 values is 4 * BITS bytes, read through a zero-padded copy so
// that an 8-byte window never reads past the row.
template <int BITS>
void unpack_row(const uint32_t* w, int K, uint8_t* q) {
  constexpr uint32_t mask = (1u << BITS) - 1;
  if constexpr (32 % BITS == 0) {
    constexpr int per_word = 32 / BITS;
    for (int k = 0; k < K; ++k) q[k] = static_cast<uint8_t>((w[k / per_word] >> (BITS * (k % per_word))) & mask);
  } else {
    // eight values are BITS whole bytes: one 64-bit window each
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(w);
    uint8_t blk[4 * BITS + 8];
    std::memset(blk + 4 * BITS, 0, 8);
    for (int b = 0; b < K / 32; ++b) {
      std::memcpy(blk, bytes + static_cast<size_t>(b) * 4 * BITS, 4 * BITS);
      for (int g = 0; g < 4; ++g) {
        uint64_t v;
        std::memcpy(&v, blk + BITS * g, 8);
        for (int j = 0; j < 8; ++j) q[b * 32 + 8 * g + j] = static_cast<uint8_t>((v >> (BITS * j)) & mask);
      }
    }
  }
}

// The integer kernel: each weight row unpacked once to bytes, then for each row of x its 32-bit
// sum per block against x's bytes, scaled in float by the group's scale times x's block scale and
// added in block order; the same operations for a row whatever rows run beside it.
template <int BITS>
void rows_int8_bits(const Problem& p, int r0, int r1) {
  const int K = p.K, G = p.G, M = p.M, nb = K / 32, per = p.group_size / 32;
  const size_t row_words = static_cast<size_t>(K) * BITS / 32;
  thread_local std::vector<float> sb;
  thread_local std::vector<uint8_t> qb;
  sb.resize(2 * static_cast<size_t>(G));
  qb.resize(K);
  float* sc = sb.data();
  float* bi = sb.data() + G;
  uint8_t* q = qb.data();
  for (int r = r0; r < r1; ++r) {
    row_scales(p, r, sc, bi);
    unpack_row<BITS>(p.w + static_cast<size_t>(r) * row_words, K, q);
    for (int m = 0; m < M; ++m) {
      const int8_t* xm = p.xq + static_cast<size_t>(m) * p.xstride;
      const float* dm = p.xd + static_cast<size_t>(m) * nb;
      float acc = 0.f;
      for (int b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int i = 0; i < 32; ++i) s += static_cast<int32_t>(q[b * 32 + i]) * xm[b * 32 + i];
        acc += static_cast<float>(s) * (sc[b / per] * dm[b]);
      }
      const float* xs = p.xsum + static_cast<size_t>(m) * G;
      const float* xo = p.xoff + static_cast<size_t>(m) * G;
      for (int g = 0; g < G; ++g) acc += bi[g] * xs[g] + sc[g] * xo[g];
      p.out[static_cast<size_t>(m) * p.N + r] = acc;
    }
  }
}

} // namespace

void quantize_x_int8(const float* x, int K, int group_size, int bits, int layout, int padded, int8_t* xq, float* xd,
                     float* xsum, float* xoff) {
  const int nb = K / 32, per = group_size / 32;
  for (int g = 0; g < K / group_size; ++g) xsum[g] = xoff[g] = 0.f; // xoff stays 0: q is taken as it is
  // x's bytes past its last block (and a partial last chunk's unused places) are zeros
  for (int i = layout == 4 && bits == 4 ? nb / 4 * 128 : K; i < padded; ++i) xq[i] = 0;
  for (int b = 0; b < nb; ++b) {
    const float* xb = x + b * 32;
    float am = 0.f;
    for (int i = 0; i < 32; ++i) am = std::max(am, std::fabs(xb[i]));
    const float d = am / 127.f;
    const float id = am > 0.f ? 127.f / am : 0.f;
    int8_t v[32];
    int qsum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::nearbyint(xb[i] * id)); // |x * id| <= 127
      v[i] = static_cast<int8_t>(q);
      qsum += q;
    }
    xd[b] = d;
    xsum[b / per] += d * static_cast<float>(qsum); // the rounded x's sum (kernels.h says why)
    if (layout == 4 && bits == 4) {
      int8_t* chunk = xq + (b / 4) * 128 + (b % 4) * 16;
      for (int i = 0; i < 16; ++i) {
        chunk[i] = v[2 * i];
        chunk[64 + i] = v[2 * i + 1];
      }
    } else {
      std::memcpy(xq + b * 32, v, 32);
    }
  }
}

void unpack_row(const uint32_t* w, int bits, int K, uint8_t* q) {
  switch (bits) {
    case 2: return unpack_row<2>(w, K, q);
    case 3: return unpack_row<3>(w, K, q);
    case 4: return unpack_row<4>(w, K, q);
    case 5: return unpack_row<5>(w, K, q);
    case 6: return unpack_row<6>(w, K, q);
    default: return unpack_row<8>(w, K, q);
  }
}

void rows_generic_int8(const Problem& p, int r0, int r1) {
  switch (p.bits) {
    case 2: return rows_int8_bits<2>(p, r0, r1);
    case 3: return rows_int8_bits<3>(p, r0, r1);
    case 4: return rows_int8_bits<4>(p, r0, r1);
    case 5: return rows_int8_bits<5>(p, r0, r1);
    case 6: return rows_int8_bits<6>(p, r0, r1);
    default: return rows_int8_bits<8>(p, r0, r1);
  }
}

void dequant_generic(const Problem& p, int r0, int r1) {
  if (p.bits == 4)
    dequant_bits<4>(p, r0, r1);
  else
    dequant_bits<8>(p, r0, r1);
}

void rows_generic(const Problem& p, int r0, int r1) {
  if (p.bits == 4)
    rows_bits<4>(p, r0, r1);
  else
    rows_bits<8>(p, r0, r1);
}

} // namespace mlxrt_qmv
