// Weights in bands of rows (mlxrt-qmv API 9): the layout the AVX-512 VNNI kernel reads quantized
// weights in, where a batch's rows of x take a third of the row-major loops' float work
// (bands_tile.h says why).
//
// band_rows(a) lays a matrix of R rows (a multiple of BAND_ROWS) and C columns out as R / 16
// bands, each band column by column: element [t][j][i] of the result (band t, column j, row i of
// the band) is a[16t + i][j]. The array keeps its shape (R, C); only the order of its elements
// changes. Scales and biases (one column a group) so give 16 rows' scales of a group in a row.
//
// band_rows(w, bits) does it for weights packed as MLX packs them (K = C * 32 / bits values a
// row, K a multiple of 32), value by value: each band's block of 32 columns of values is eight
// operands of 64 values, operand j holding values 4j..4j+3 of rows 0..15 in that order, stored
// as 8-bit: the 64 bytes; 4-bit: operands 2l and 2l + 1 in one 64-byte line, as its bytes' low
// and high nibbles; 3-, 5- and 6-bit: the 64 values' little-end-first bit stream (8 * bits bytes).
// For 8 bits that is band_rows(w) of the uint32 words. The bytes of a band are as many as before.
#pragma once

#include <vector>

#include "qmv.h"

namespace mlxrt_qmv {

constexpr int BAND_ROWS = 16;

// The weight widths quantized_matmul takes in bands with this process's kernel: 8 with the
// AVX-512 VNNI kernel (where a batch's products are faster so and a lone row's no slower), none
// with the others.
std::vector<int> band_bits();

// `a` (2-D, its rows a multiple of BAND_ROWS) laid out in bands, the same shape and type; bits
// (3, 4, 5, 6, 8): `a` is uint32 weights of that width, laid out value by value as above. Where
// `a` is no longer referenced once it is computed (MLX's donation), its buffer is rewritten in
// place a band at a time, so that a layer's two layouts are never in memory together.
mx::array band_rows(const mx::array& a, int bits = 0, mx::StreamOrDevice s = {});

class BandRows : public SameShapePrimitive {
 public:
  BandRows(mx::Stream stream, int bits) : SameShapePrimitive(stream), bits_(bits) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive& other) const override {
    return bits_ == static_cast<const BandRows&>(other).bits_;
  }
  const char* name() const override {
    return "MlxrtBandRows";
  }

 private:
  int bits_;
};

} // namespace mlxrt_qmv
