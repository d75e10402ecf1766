// The portable kernel: plain C++ the compiler vectorizes for the target (NEON on aarch64,
// SSE2 on a baseline x86-64). Takes x as given (x_width 0).
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
  for (int r = r0; r < r1; ++r) {
    row_scales(p, r, sc, bi);
    const uint32_t* wr = p.w + static_cast<size_t>(r) * words;
    float acc[8] = {0};
    for (int g = 0; g < G; ++g) {
      float t[8] = {0};
      for (int e = 0; e < gs; e += 32) {
        const int k = g * gs + e;
        const uint32_t* wp = wr + k / per_word;
        for (int i = 0; i < 32; ++i) q[i] = static_cast<float>((wp[i / per_word] >> (BITS * (i % per_word))) & mask);
        for (int m = 0; m < M; ++m) {
          const float* xm = p.x + static_cast<size_t>(m) * K + k;
          float s = 0.f;
          for (int i = 0; i < 32; ++i) s += q[i] * xm[i];
          t[m] += s;
        }
      }
      for (int m = 0; m < M; ++m) acc[m] += sc[g] * t[m] + bi[g] * p.xsum[static_cast<size_t>(m) * G + g];
    }
    for (int m = 0; m < M; ++m) p.out[static_cast<size_t>(m) * p.N + r] = acc[m];
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

} // namespace

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
