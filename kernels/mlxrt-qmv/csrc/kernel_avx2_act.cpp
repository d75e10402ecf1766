// swiglu, softmax, log_softmax, argmax and exp (activation.h) eight floats at a time: MLX's scalar arithmetic in AVX2, operation for
// operation, so the results are the same bits; and geglu, geglu_generic's operations eight lanes at a time (the
// same bits as it). Compiled with AVX2/FMA for this file only (and -ffp-contract=off: a product followed by a sum
// must stay two roundings, as in MLX's build) and run only where the CPU has them (activation.cpp checks).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "activation.h"
#include "simd_avx2.h"

namespace mlxrt_qmv {

namespace {

inline __m256 sigmoid8(__m256 v) { // MLX's Sigmoid
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 y = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v))));
  return _mm256_blendv_ps(_mm256_sub_ps(one, y), y, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
}

// A row's largest element other than NaN, eight at a time, and the place of its first NaN in
// nan_at (-1: none): what log_softmax and argmax both start from (MLX's maximum keeps the first NaN
// it meets; its argmax returns that NaN's place).
float row_max(const float* in, int64_t n, int64_t& nan_at) {
  const int64_t whole = n / 8 * 8;
  __m256 vm = _mm256_set1_ps(-__builtin_inff()), nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    vm = _mm256_max_ps(v, vm);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  for (int64_t i = whole; i < n; ++i) {
    any_nan = any_nan || std::isnan(in[i]);
    m = in[i] > m ? in[i] : m;
  }
  nan_at = -1;
  if (any_nan)
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(in[i])) {
        nan_at = i;
        break;
      }
  return m;
}

} // namespace

void swiglu_avx2(const float* gate, const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), _mm256_loadu_ps(x + i)));
  }
  if (i < n) swiglu_generic(gate + i, x + i, out + i, n - i);
}

namespace {

// gelu_approx(g) * u, geglu_generic's operations in the same order (activation.h, geglu_const).
inline __m256 geglu8(__m256 g, __m256 u) {
  using namespace geglu_const;
  const __m256 one = _mm256_set1_ps(1.0f), highest = _mm256_set1_ps(kHighest);
  const __m256 w = _mm256_mul_ps(g, _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(kCubic)),
                                                  _mm256_set1_ps(kLinear)));
  const __m256 c = _mm256_min_ps(_mm256_max_ps(w, _mm256_set1_ps(kLowest)), highest);
  const __m256 fx = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(c, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_sub_ps(c, _mm256_mul_ps(fx, _mm256_set1_ps(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(fx, _mm256_set1_ps(kLn2Lo)));
  __m256 y = _mm256_set1_ps(kP0);
  for (const float p : {kP1, kP2, kP3, kP4, kP5}) y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(p));
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(r, r)), r), one);
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  __m256 e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  e = _mm256_blendv_ps(e, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(w, highest, _CMP_GT_OQ));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

} // namespace

void geglu_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, geglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) { // the last elements through the same vector, padded with zeros
    alignas(32) float g[8] = {0, 0, 0, 0, 0, 0, 0, 0}, u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) g[j - i] = gate[j], u[j - i] = up[j];
    _mm256_store_ps(g, geglu8(_mm256_load_ps(g), _mm256_load_ps(u)));
    for (int64_t j = i; j < n; ++j) out[j] = g[j - i];
  }
}

void softmax_avx2(const float* in, float* out, int64_t rows, const SoftmaxRows& a) {
  alignas(32) float tail[8];
  const int64_t n = a.n;
  for (int64_t r = 0; r < rows; ++r, in += n, out += n) {
    // a causal row's masked keys: exact zeros, left out of the maximum and the sum
    const int64_t seen = a.seen(r);
    const int64_t whole = seen / 8 * 8;
    __m256 vm = _mm256_set1_ps(-__builtin_inff());
    for (int64_t i = 0; i < whole; i += 8) vm = _mm256_max_ps(_mm256_loadu_ps(in + i), vm);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    for (int64_t i = whole; i < seen; ++i) m = in[i] > m ? in[i] : m;
    const __m256 mv = _mm256_set1_ps(m);
    for (int64_t i = 0; i < whole; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(in + i), mv)));
    if (whole < seen) { // the same exponential for the last elements, through a padded copy
      for (int j = 0; j < 8; ++j) tail[j] = whole + j < seen ? in[whole + j] : m;
      _mm256_store_ps(tail, exp8(_mm256_sub_ps(_mm256_load_ps(tail), mv)));
      for (int64_t i = whole; i < seen; ++i) out[i] = tail[i - whole];
    }
    float total = 0.f; // in order, as MLX's one-lane loop sums them
    for (int64_t i = 0; i < seen; ++i) total += out[i];
    const __m256 inv = _mm256_set1_ps(1 / total);
    for (int64_t i = 0; i < whole; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), inv));
    const float invs = 1 / total;
    for (int64_t i = whole; i < seen; ++i) out[i] = out[i] * invs;
    for (int64_t i = seen; i < n; ++i) out[i] = 0.f;
  }
}

void log_softmax_avx2(const float* in, float* out, int64_t rows, int64_t n) {
  alignas(32) float e[8];
  const int64_t whole = n / 8 * 8;
  for (int64_t r = 0; r < rows; ++r, in += n, out += n) {
    // the maximum; MLX's one-lane loop keeps the first NaN it meets, so any NaN gives NaN
    int64_t nan_at;
    float m = row_max(in, n, nan_at);
    if (nan_at >= 0) m = in[nan_at];
    // the exponentials eight at a time, summed one by one in order, as MLX's loop sums them
    const __m256 mv = _mm256_set1_ps(m);
    float total = 0.f;
    for (int64_t i = 0; i < whole; i += 8) {
      _mm256_store_ps(e, exp8(_mm256_sub_ps(_mm256_loadu_ps(in + i), mv)));
      for (int j = 0; j < 8; ++j) total += e[j];
    }
    if (whole < n) {
      for (int j = 0; j < 8; ++j) e[j] = whole + j < n ? in[whole + j] : m;
      _mm256_store_ps(e, exp8(_mm256_sub_ps(_mm256_load_ps(e), mv)));
      for (int64_t i = whole; i < n; ++i) total += e[i - whole];
    }
    const float lse = std::isinf(m) ? m : std::log(total) + m;
    const __m256 lv = _mm256_set1_ps(lse);
    for (int64_t i = 0; i < whole; i += 8) _mm256_storeu_ps(out + i, _mm256_sub_ps(_mm256_loadu_ps(in + i), lv));
    for (int64_t i = whole; i < n; ++i) out[i] = in[i] - lse;
  }
}

int64_t argmax_avx2(const float* in, int64_t n) {
  int64_t nan_at;
  const float m = row_max(in, n, nan_at);
  if (nan_at >= 0) return nan_at;
  // the maximum's first place (all -inf: 0, as MLX's)
  const int64_t whole = n / 8 * 8;
  const __m256 mv = _mm256_set1_ps(m);
  for (int64_t i = 0; i < whole; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(in + i), mv, _CMP_EQ_OQ));
    if (hit != 0) return i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  for (int64_t i = whole; i < n; ++i)
    if (in[i] == m) return i;
  return 0;
}

void exp_avx2(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_loadu_ps(in + i)));
  if (i < n) { // the same exponential for the last elements, through a padded copy
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) tail[j - i] = in[j];
    _mm256_store_ps(tail, exp8(_mm256_load_ps(tail)));
    for (int64_t j = i; j < n; ++j) out[j] = tail[j - i];
  }
}

} // namespace mlxrt_qmv
