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
    auto value = [&](int i, int k) { return q[static_cast<size_t>(i) * K + 32 * b + k]; }; // row i, block column k
    if (bits == 8) {
      for (int j = 0; j < 8; ++j)
        for (int i = 0; i < BAND_ROWS; ++i)
          for (int t = 0; t < 4; ++t) o[64 * j + 4 * i + t] = value(i, 4 * j + t);
    } else if (bits == 4) {
      for (int l = 0; l < 4; ++l)
        for (int i = 0; i < BAND_ROWS; ++i)
          for (int t = 0; t < 4; ++t)
            o[64 * l + 4 * i + t] = static_cast<uint8_t>(value(i, 8 * l + t) | value(i, 8 * l + 4 + t) << 4);
    } else {
      std::memset(o, 0, static_cast<size_t>(64) * bits);
      for (int j = 0; j < 8; ++j)
        for (int v = 0; v < 64; ++v) { // value v = 4i + t of operand j, at bit v * bits of its run
          const unsigned x = value(v / 4, 4 * j + v % 4);
          const int at = 8 * bits * j * 8 + v * bits;
          for (int k = 0; k < bits; ++k) o[(at + k) / 8] |= static_cast<uint8_t>(((x >> k) & 1u) << ((at + k) % 8));
        }
    }
  }
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
    std::vector<uint8_t> copy(src == dst || bits > 0 ? band : 0), q(bits > 0 ? static_cast<size_t>(BAND_ROWS) * K : 0);
    for (size_t t = 0; t < rows / BAND_ROWS; ++t) {
      const uint8_t* from = src + t * band;
      uint8_t* to = dst + t * band;
      if (bits > 0) { // value by value: the band's rows unpacked, then packed as its operands
        for (int i = 0; i < BAND_ROWS; ++i)
          unpack_row(reinterpret_cast<const uint32_t*>(from + i * cols * item), bits, K, q.data() + static_cast<size_t>(i) * K);
        pack_band(q.data(), K, bits, to);
        continue;
      }
      if (src == dst) {
        std::memcpy(copy.data(), from, band);
        from = copy.data();
      }
      for (size_t i = 0; i < BAND_ROWS; ++i)
        for (size_t j = 0; j < cols; ++j) std::memcpy(to + (j * BAND_ROWS + i) * item, from + (i * cols + j) * item, item);
    }
  });
}

} // namespace mlxrt_qmv
