// The AVX-512 loops for 3-, 5- and 6-bit weights in bands of 16 rows (bands_tile.h), built with
// VBMI as well (vpermb, vpmultishiftqb unpack them): run only where the CPU has it (band_bits()).
#include "bands_tile.h"

namespace mlxrt_qmv {

void rows_avx512_bands_vbmi(const Problem& p, int r0, int r1) {
  if (p.bits == 5)
    bands_tile::rows<5>(p, r0, r1);
  else if (p.bits == 6)
    bands_tile::rows<6>(p, r0, r1);
  else
    bands_tile::rows<3>(p, r0, r1);
}

} // namespace mlxrt_qmv
