// The rotary embedding's arithmetic, shared by the Rope primitive (fused.cpp) and the decode
// attention primitive (decode_attention.cpp), which rotates a step's query and key itself: one
// copy of the code, compiled with the same flags in both files (no -mfma), so both give the
// same bits. MLX's fallback graph for mx.fast.rope computes the same operations in float32.
#pragma once

#include <cmath>
#include <cstdint>

namespace mlxrt_qmv {

// inv_freq[i] = exp(-i · log(base) / half), as MLX's fallback computes it.
inline void rope_inv_freq(float* inv_freq, int half, float base) {
  const float step = static_cast<float>(std::log(base) / half);
  for (int i = 0; i < half; ++i) inv_freq[i] = std::exp(static_cast<float>(-i) * step);
}

// The cosines and sines of position t + offset (scaled by scale) for each of the half pairs.
inline void rope_angles(const float* inv_freq, int half, float t, float offset, float scale, float* cs, float* sn) {
  const float pos = (t + offset) * scale;
  for (int i = 0; i < half; ++i) {
    const float theta = pos * inv_freq[i];
    cs[i] = std::cos(theta);
    sn[i] = std::sin(theta);
  }
}

// One row of D values (x read at element stride sd) rotated into o (contiguous): the first dims
// values in pairs (adjacent with traditional, else i and i + dims/2), the rest copied.
inline void rope_row(const float* xr, int64_t sd, float* o, const float* c, const float* sv, int dims, int64_t D,
                     bool traditional) {
  const int half = dims / 2;
  for (int i = 0; i < half; ++i) {
    const int64_t i1 = traditional ? 2 * i : i, i2 = traditional ? 2 * i + 1 : i + half;
    const float x1 = xr[i1 * sd], x2 = xr[i2 * sd];
    o[i1] = x1 * c[i] - x2 * sv[i];
    o[i2] = x1 * sv[i] + x2 * c[i];
  }
  for (int64_t i = dims; i < D; ++i) o[i] = xr[i * sd];
}

} // namespace mlxrt_qmv
