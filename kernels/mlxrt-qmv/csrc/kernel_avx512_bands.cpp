// The AVX-512 VNNI loops for 8- and 4-bit weights in bands of 16 rows (bands_tile.h), built with
// AVX-512 F/BW/VL/VNNI; 3-, 5- and 6-bit bands go to kernel_avx512_bands_vbmi.cpp.
#include "bands_tile.h"

namespace mlxrt_qmv {

void rows_avx512_bands(const Problem& p, int r0, int r1) {
  if (p.bits == 8)
    bands_tile::rows<8>(p, r0, r1);
  else if (p.bits == 4)
    bands_tile::rows<4>(p, r0, r1);
  else
    rows_avx512_bands_vbmi(p, r0, r1);
}

} // namespace mlxrt_qmv
