// Helpers the AVX2 kernels share. Include only from files compiled with -mavx2 (CMakeLists.txt).
#pragma once

#include <immintrin.h>

namespace mlxrt_qmv {

// The sum of the four lanes of s.
inline float hsum(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The sum of the eight lanes of v.
inline float hsum(__m256 v) {
  return hsum(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

// MLX's simd::exp (mlx/backend/cpu/simd/math.h) eight floats at a time, operation for operation:
// the same bits as MLX's scalar Simd<float, 1> where the file is compiled with -ffp-contract=off
// (a product then a sum stays two roundings, as in MLX's build; CMakeLists.txt). static: each
// file its own copy, compiled with its own flags.
static inline __m256 exp8(__m256 x_init) {
  __m256 x = _mm256_mul_ps(x_init, _mm256_set1_ps(1.442695f));
  // floor(x + 0.5) with the sum exact (MLX adds 0.5 as a double): x rounded to nearest, ties up
  const __m256 r = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 tie = _mm256_cmp_ps(_mm256_sub_ps(x, r), _mm256_set1_ps(0.5f), _CMP_EQ_OQ);
  const __m256 ipart = _mm256_add_ps(r, _mm256_and_ps(tie, _mm256_set1_ps(1.0f)));
  const __m256 fpart = _mm256_sub_ps(x, ipart);
  x = _mm256_set1_ps(1.535336188319500e-4f);
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(1.339887440266574e-3f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(9.618437357674640e-3f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(5.550332471162809e-2f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(2.402264791363012e-1f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(6.931472028550421e-1f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(1.000000000000000f));
  const __m256i epart = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(ipart), _mm256_set1_epi32(127)), 23);
  __m256 result = _mm256_mul_ps(_mm256_castsi256_ps(epart), x);
  result = _mm256_blendv_ps(result, x_init, _mm256_cmp_ps(x_init, x_init, _CMP_UNORD_Q));
  result = _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x_init, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
  result = _mm256_blendv_ps(result, _mm256_setzero_ps(), _mm256_cmp_ps(x_init, _mm256_set1_ps(-88.0f), _CMP_LT_OQ));
  return result;
}

} // namespace mlxrt_qmv
