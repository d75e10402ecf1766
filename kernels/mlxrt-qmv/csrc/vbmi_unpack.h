// Unpacking 3-, 5- and 6-bit values to one byte each in registers with AVX-512 VBMI, which the
// AVX-512 integer loops share (kernel_avx512_vnni.cpp's row-major ones, the band loops'
// bands_tile.h). Include only from files built with AVX-512 F/BW; the unpacking itself is
// compiled for VBMI by its target attribute, and run only where the CPU has it.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace mlxrt_qmv {

// BITS (3, 5 or 6) bits a value to one byte a value, 64 values a step, with AVX-512 VBMI (Ice
// Lake, Zen 4; not every VNNI CPU has it, so chosen at run time): eight values are BITS whole
// bytes, so vpermb puts group j's bytes at the start of 64-bit lane j (perm) and vpmultishiftqb
// takes value i's byte from bit i * BITS of its lane (shift); the bits above it, masked off, are
// the next values'.
template <int BITS>
struct VbmiUnpack {
  alignas(64) uint8_t perm[64];
  alignas(64) uint8_t shift[64];
  constexpr VbmiUnpack() : perm{}, shift{} {
    for (int j = 0; j < 8; ++j)
      for (int k = 0; k < 8; ++k) {
        perm[8 * j + k] = static_cast<uint8_t>(j * BITS + k);
        shift[8 * j + k] = static_cast<uint8_t>(k * BITS);
      }
  }
};
template <int BITS>
constexpr VbmiUnpack<BITS> vbmi_unpack{};

// The 64 values of the 8 * BITS bytes at the start of v, one a byte; bytes of lanes past `keep`
// (16 dwords) zero.
template <int BITS>
__attribute__((target("avx512vbmi"), always_inline)) inline __m512i unpack64(__m512i v, __m512i perm, __m512i shift,
                                                                               __mmask16 keep) {
  const __m512i u = _mm512_multishift_epi64_epi8(shift, _mm512_permutexvar_epi8(perm, v));
  return _mm512_maskz_and_epi32(keep, u, _mm512_set1_epi8(static_cast<char>((1 << BITS) - 1)));
}

} // namespace mlxrt_qmv
