#include "bands.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace mlxrt_qmv {

namespace {

// One band's 16 rows of K values (q: one byte a value, row by row) into the band's bytes (bands.h).
void pack_band(const uint8_t* q, int K, int bits, uint8_t* out) {
  for (int b = 0; b < K / 32; ++b) {
    uint8_t* o = out + static_cast<size_t>(b) * 64 * bits;
    const uint8_t* v = q + 32 * b; // row i's block: v[i * K ...]
    if (bits == 8) {
      for (int j = 0; j < 8; ++j)
        for (int i = 0; i < BAND_ROWS; ++i) std::memcpy(o + 64 * j + 4 * i, v + static_cast<size_t>(i) * K + 4 * j, 4);
    } else if (bits == 4) {
      for (int l = 0; l < 4; ++l)
        for (int i = 0; i < BAND_ROWS; ++i)
          for (int t = 0; t < 4; ++t) {
            const uint8_t* r = v + static_cast<size_t>(i) * K + 8 * l;
            o[64 * l + 4 * i + t] = static_cast<uint8_t>(r[t] | r[4 + t] << 4);
          }
    } else {
      // operand j's 64 values (4i + t: row i's value 4j + t) as a bit stream: every eight
      // values are `bits` whole bytes
      for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 8; ++e) { // values 8e .. 8e + 7: rows 2e and 2e + 1
          uint64_t word = 0;
          for (int k = 0; k < 8; ++k)
            word |= static_cast<uint64_t>(v[static_cast<size_t>(2 * e + k / 4) * K + 4 * j + k % 4]) << (k * bits);
          std::memcpy(o + 8 * bits * j + bits * e, &word, bits); // little-endian: the low bytes
        }
    }
  }
}

// One band of `cols` units of type U: element [j][i] = in[i][j].
template <typename U>
void transpose_band(const U* in, size_t cols, U* out) {
  for (size_t j = 0; j < cols; ++j)
    for (size_t i = 0; i < BAND_ROWS; ++i) out[j * BAND_ROWS + i] = in[i * cols + j];
}

} // namespace

mx::array band_rows(const mx::array& a, int bits, mx::StreamOrDevice s) {
  if (a.ndim() != 2 || a.shape(0) % BAND_ROWS != 0)
    throw std::invalid_argument("[band_rows] a 2-D array whose rows are a multiple of 16");
  if (bits != 0) {
    if (bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
      throw std::invalid_argument("[band_rows] weights of 3, 4, 5, 6 or 8 bits, not " + std::to_string(bits));
    if (a.dtype() != mx::uint32 || (static_cast<int64_t>(a.shape(1)) * 32) % (32 * bits) != 0)
      throw std::invalid_argument("[band_rows] packed uint32 weights whose rows are whole blocks of 32 values");
  }
  const auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) throw std::invalid_argument("[band_rows] runs on the CPU only");
  return mx::array(a.shape(), a.dtype(), std::make_shared<BandRows>(stream, bits), {mx::contiguous(a, false, stream)});
}

void BandRows::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& in = inputs[0];
  auto& out = outputs[0];
  // In place where nothing else will read `in` (a freshly loaded layer's weights once the layer
  // holds only the result): each band goes through a copy of itself.
  if (in.is_donatable() && in.flags().row_contiguous)
    out.copy_shared_buffer(in);
  else
    out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(in);
  encoder.set_output_array(out);
  const size_t rows = in.shape(0), cols = in.shape(1), item = in.itemsize();
  encoder.dispatch([src = in.data<uint8_t>(), dst = out.data<uint8_t>(), rows, cols, item, bits = bits_]() {
    const size_t band = BAND_ROWS * cols * item;
    const int K = static_cast<int>(cols * 32 / (bits > 0 ? bits : 32));
    // the bands on the primitive's threads, each through a copy of itself (in place, `src` is `dst`)
    parallel_for(static_cast<int>(rows / BAND_ROWS), rows * cols * item, [&](int t0, int t1) {
      thread_local std::vector<uint8_t> copy, q; // a band's copy (units), or its values (bits > 0)
      if (bits > 0)
        q.resize(static_cast<size_t>(BAND_ROWS) * K);
      else
        copy.resize(band);
      for (size_t t = t0; t < static_cast<size_t>(t1); ++t) {
        const uint8_t* from = src + t * band;
        uint8_t* to = dst + t * band;
        if (bits > 0) { // value by value: the band's rows unpacked, then packed as its operands
          for (int i = 0; i < BAND_ROWS; ++i)
            unpack_row(reinterpret_cast<const uint32_t*>(from + i * cols * item), bits, K, q.data() + static_cast<size_t>(i) * K);
          pack_band(q.data(), K, bits, to);
          continue;
        }
        std::memcpy(copy.data(), from, band);
        if (item == 4)
          transpose_band(reinterpret_cast<const uint32_t*>(copy.data()), cols, reinterpret_cast<uint32_t*>(to));
        else if (item == 2)
          transpose_band(reinterpret_cast<const uint16_t*>(copy.data()), cols, reinterpret_cast<uint16_t*>(to));
        else
          for (size_t i = 0; i < BAND_ROWS; ++i)
            for (size_t j = 0; j < cols; ++j) std::memcpy(to + (j * BAND_ROWS + i) * item, copy.data() + (i * cols + j) * item, item);
      }
    }, /*lone=*/true);
  });
}

} // namespace mlxrt_qmv
