#include "bands.h"

#include <cstring>
#include <stdexcept>


namespace mlxrt_qmv {

mx::array band_rows(const mx::array& a, mx::StreamOrDevice s) {
  if (a.ndim() != 2 || a.shape(0) % BAND_ROWS != 0)
    throw std::invalid_argument("[band_rows] a 2-D array whose rows are a multiple of 16");
  const auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) throw std::invalid_argument("[band_rows] runs on the CPU only");
  return mx::array(a.shape(), a.dtype(), std::make_shared<BandRows>(stream), {mx::contiguous(a, false, stream)});
}

void BandRows::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& in = inputs[0];
  auto& out = outputs[0];
  // In place where nothing else will read `in` (a freshly loaded layer's weights once the layer
  // holds only the result): the band's rows go through a copy of one band.
  if (in.is_donatable() && in.flags().row_contiguous)
    out.copy_shared_buffer(in);
  else
    out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(in);
  encoder.set_output_array(out);
  const size_t rows = in.shape(0), cols = in.shape(1), item = in.itemsize();
  encoder.dispatch([src = in.data<uint8_t>(), dst = out.data<uint8_t>(), rows, cols, item]() {
    const size_t band = BAND_ROWS * cols * item;
    std::vector<uint8_t> copy(src == dst ? band : 0);
    for (size_t t = 0; t < rows / BAND_ROWS; ++t) {
      const uint8_t* from = src + t * band;
      if (src == dst) {
        std::memcpy(copy.data(), from, band);
        from = copy.data();
      }
      uint8_t* to = dst + t * band;
      for (size_t i = 0; i < BAND_ROWS; ++i)
        for (size_t j = 0; j < cols; ++j) std::memcpy(to + (j * BAND_ROWS + i) * item, from + (i * cols + j) * item, item);
    }
  });
}

} // namespace mlxrt_qmv
