// Weights in bands of rows (mlxrt-qmv API 9): the layout the AVX-512 VNNI kernel reads 8-bit
// weights in for a batch's rows of x at a third of the row-major loops' float work
// (kernel_avx512_bands.cpp says why).
//
// A matrix of R rows (a multiple of BAND_ROWS) and C columns of some element type is laid out as
// R / 16 bands, each band column by column: element [t][j][i] of the result (band t, column j,
// row i of the band) is a[16t + i][j]. The array keeps its shape (R, C); only the order of its
// elements changes. For 8-bit weights the columns
// are uint32 words (four values of a row), so a band's 64-byte line holds four values of each of
// its 16 rows; the scales and biases, one column a group, give 16 rows' scales of a group in
// a row. quantized_matmul(..., band=16) reads all three so.
#pragma once

#include <vector>

#include "qmv.h"

namespace mlxrt_qmv {

constexpr int BAND_ROWS = 16;

// The weight widths quantized_matmul takes in bands with this process's kernel: 8 with the
// AVX-512 VNNI kernel (where a batch's products are faster so and a lone row's no slower), none
// with the others.
std::vector<int> band_bits();

// `a` (2-D, its rows a multiple of BAND_ROWS) laid out in bands, the same shape and type. Where
// `a` is no longer referenced once it is computed (MLX's donation), its buffer is permuted in
// place a band at a time, so that a layer's two layouts are never in memory together.
mx::array band_rows(const mx::array& a, mx::StreamOrDevice s = {});

class BandRows : public PlainPrimitive {
 public:
  using PlainPrimitive::PlainPrimitive;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override {
    return "MlxrtBandRows";
  }
};

} // namespace mlxrt_qmv
