// One output row's scales and biases as float32, whatever their stored type (portable).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace mlxrt_qmv {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((man & 0x400) == 0) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void row_scales(const Problem& p, int r, float* sc, float* bi) {
  const size_t off = static_cast<size_t>(r) * p.G;
  switch (p.stype) {
    case ScaleType::f32:
      std::memcpy(sc, static_cast<const float*>(p.scales) + off, sizeof(float) * p.G);
      std::memcpy(bi, static_cast<const float*>(p.biases) + off, sizeof(float) * p.G);
      break;
    case ScaleType::f16:
      for (int g = 0; g < p.G; ++g) {
        sc[g] = half_to_float(static_cast<const uint16_t*>(p.scales)[off + g]);
        bi[g] = half_to_float(static_cast<const uint16_t*>(p.biases)[off + g]);
      }
      break;
    case ScaleType::bf16:
      for (int g = 0; g < p.G; ++g) {
        sc[g] = bf16_to_float(static_cast<const uint16_t*>(p.scales)[off + g]);
        bi[g] = bf16_to_float(static_cast<const uint16_t*>(p.biases)[off + g]);
      }
      break;
  }
}

} // namespace mlxrt_qmv
