// The attention primitive's loop in AVX2/FMA (attention.h): eight lanes of a head dimension at a
// time, each key and value row loaded once for the query heads that share it (grouped-query
// attention), the softmax's exponentials eight scores at a time. Compiled with AVX2/FMA for this
// file only and run only where the CPU has them (attention_avx2_ok checks).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention.h"
#include "simd_avx2.h"

namespace mlxrt_qmv {

namespace {

constexpr int MAX_D = 256;
constexpr int MAX_GROUP = 16; // query heads a key head serves, taken together (more: in turns)

// q·k over D (a multiple of 8): two chains of FMAs over alternate 8-lane slices, then the lanes.
inline float dot8(const float* q, const float* k, int D) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int d = 0;
  for (; d + 16 <= D; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), a1);
  }
  if (d < D) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
  return hsum(_mm256_add_ps(a0, a1));
}

void group(const AttnProblem& p, int64_t b, int64_t hk, int64_t l, int64_t h0, int G) {
  const int64_t Hq = p.q.shape[1], L = p.q.shape[2], D = p.q.shape[3];
  const int64_t S = p.k.shape[2], Dv = p.v.shape[3];
  const float lowest = std::numeric_limits<float>::lowest(); // MLX's where(mask, s, finfo.min)
  const int64_t visible = p.mode == 1 ? S - L + l + 1 : S;
  const int64_t padded = (visible + 7) / 8 * 8;
  thread_local std::vector<float> qs_buf, sc_buf;
  qs_buf.resize(static_cast<size_t>(G) * D);
  sc_buf.resize(static_cast<size_t>(G) * padded);
  // the buffers' addresses once: each use of a thread_local in this shared library is a call
  float* const qs = qs_buf.data();
  float* const sc = sc_buf.data();
  for (int g = 0; g < G; ++g) {
    const float* qr = p.q.data + b * p.q.stride[0] + (h0 + g) * p.q.stride[1] + l * p.q.stride[2];
    for (int64_t d = 0; d < D; ++d) qs[g * D + d] = qr[d * p.q.stride[3]] * p.scale;
  }
  const float* kb = p.k.data + b * p.k.stride[0] + hk * p.k.stride[1];
  const float* vb = p.v.data + b * p.v.stride[0] + hk * p.v.stride[1];
  float mx[MAX_GROUP];
  for (int g = 0; g < G; ++g) mx[g] = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < visible; ++s) {
    const float* kr = kb + s * p.k.stride[2];
    for (int g = 0; g < G; ++g) {
      float v = dot8(qs + g * D, kr, static_cast<int>(D));
      const int64_t at = b * p.mask.stride[0] + (h0 + g) * p.mask.stride[1] + l * p.mask.stride[2] + s * p.mask.stride[3];
      if (p.mode == 2) {
        if (!p.mask.b[at]) v = lowest;
      } else if (p.mode == 3) {
        v += p.mask.f[at];
      }
      sc[g * padded + s] = v;
      mx[g] = std::max(mx[g], v);
    }
  }
  float inv[MAX_GROUP];
  for (int g = 0; g < G; ++g) {
    float* row = sc + g * padded;
    for (int64_t s = visible; s < padded; ++s) row[s] = lowest; // exp(lowest - max) = 0, not read
    const __m256 m = _mm256_set1_ps(mx[g]);
    for (int64_t s = 0; s < padded; s += 8) _mm256_storeu_ps(row + s, exp8(_mm256_sub_ps(_mm256_loadu_ps(row + s), m)));
    float total = 0.f; // in key order: masked keys add exact zeros wherever they are
    for (int64_t s = 0; s < visible; ++s) total += row[s];
    inv[g] = 1.0f / total;
  }
  for (int g = 0; g < G; ++g) {
    const float* row = sc + g * padded;
    float* o = p.out + (((b * Hq) + h0 + g) * L + l) * Dv;
    for (int64_t d0 = 0; d0 < Dv; d0 += 64) { // 8 accumulators of 8 lanes a pass
      const int n = static_cast<int>(std::min<int64_t>(64, Dv - d0)) / 8;
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t s = 0; s < visible; ++s) {
        const __m256 w = _mm256_set1_ps(row[s] * inv[g]);
        const float* vr = vb + s * p.v.stride[2] + d0;
        for (int j = 0; j < n; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8 * j), acc[j]);
      }
      for (int j = 0; j < n; ++j) _mm256_storeu_ps(o + d0 + 8 * j, acc[j]);
    }
  }
}

} // namespace

bool attention_avx2_ok(const AttnProblem& p) {
  static const bool cpu = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const int64_t D = p.q.shape[3], Dv = p.v.shape[3];
  return cpu && p.k.stride[3] == 1 && p.v.stride[3] == 1 && D % 8 == 0 && Dv % 8 == 0 && D <= MAX_D && Dv <= MAX_D;
}

void attention_group_avx2(const AttnProblem& p, int64_t t) {
  const int64_t Hq = p.q.shape[1], L = p.q.shape[2], Hk = p.k.shape[1];
  const int64_t b = t / (Hk * L), hk = (t / L) % Hk, l = t % L;
  const int64_t groups = Hq / Hk;
  for (int64_t g0 = 0; g0 < groups; g0 += MAX_GROUP)
    group(p, b, hk, l, hk * groups + g0, static_cast<int>(std::min<int64_t>(MAX_GROUP, groups - g0)));
}

} // namespace mlxrt_qmv
