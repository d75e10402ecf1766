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

} // namespace mlxrt_qmv
