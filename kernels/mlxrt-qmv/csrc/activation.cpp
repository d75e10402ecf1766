// The swiglu primitive (activation.h): its op, the portable loop and the CPU evaluation.
#include "activation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "qmv.h"

namespace mlxrt_qmv {

namespace {

// MLX's simd::exp (mlx/backend/cpu/simd/math.h) for one float: 2^(x·log2 e), its integer part
// by bit shifting and its fraction by a Cephes polynomial, through std::fma as MLX's scalar
// Simd<float, 1> runs it.
inline float mlx_exp(float x_init) {
  float x = x_init * 1.442695f;
  const float ipart = static_cast<float>(std::floor(static_cast<double>(x) + 0.5)); // MLX adds 0.5 as a double
  const float fpart = x - ipart;
  x = 1.535336188319500e-4f;
  x = std::fma(x, fpart, 1.339887440266574e-3f);
  x = std::fma(x, fpart, 9.618437357674640e-3f);
  x = std::fma(x, fpart, 5.550332471162809e-2f);
  x = std::fma(x, fpart, 2.402264791363012e-1f);
  x = std::fma(x, fpart, 6.931472028550421e-1f);
  x = std::fma(x, fpart, 1.000000000000000f);
  const int32_t epart = (static_cast<int32_t>(ipart) + 127) << 23;
  float two;
  std::memcpy(&two, &epart, sizeof two);
  float result = std::isnan(x_init) ? x_init : two * x;
  if (x_init > 88.0f) result = std::numeric_limits<float>::infinity();
  if (x_init < -88.0f) result = 0.f;
  return result;
}

// MLX's Sigmoid (mlx/backend/cpu/unary_ops.h).
inline float mlx_sigmoid(float v) {
  const float y = 1.0f / (1.0f + mlx_exp(std::abs(v)));
  return v < 0 ? y : 1.0f - y;
}

using Loop = void (*)(const float*, const float*, float*, int64_t);

Loop loop() {
#if defined(__x86_64__) || defined(_M_X64)
  static const Loop chosen = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? swiglu_avx2 : swiglu_generic;
  return chosen;
#else
  return swiglu_generic;
#endif
}

} // namespace

void swiglu_generic(const float* gate, const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (gate[i] * mlx_sigmoid(gate[i])) * x[i];
}

mx::array swiglu(const mx::array& gate, const mx::array& x, mx::StreamOrDevice s) {
  const bool ok = mx::to_stream(s).device == mx::Device::cpu && gate.dtype() == mx::float32 &&
      x.dtype() == mx::float32 && gate.shape() == x.shape() && gate.size() > 0;
  if (!ok) return mx::multiply(mx::multiply(gate, mx::sigmoid(gate, s), s), x, s);
  // The loop reads both inputs in place: contiguous() is a no-op copy for what already is.
  return mx::array(gate.shape(), mx::float32, std::make_shared<Swiglu>(mx::to_stream(s)),
                   {mx::contiguous(gate, false, s), mx::contiguous(x, false, s)});
}

void Swiglu::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& g = inputs[0];
  const auto& x = inputs[1];
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  encoder.dispatch([gp = g.data<float>(), xp = x.data<float>(), op = out.data<float>(), n = static_cast<int64_t>(out.size())]() {
    const Loop run = loop();
    // Split over the kernel's threads once there is enough work to pay for waking them.
    constexpr int64_t piece = 4096;
    if (n < 4 * piece) {
      run(gp, xp, op, n);
      return;
    }
    parallel_for(static_cast<int>((n + piece - 1) / piece), static_cast<size_t>(n) * 12, [&](int p0, int p1) {
      const int64_t i0 = p0 * piece, i1 = std::min<int64_t>(n, p1 * piece);
      run(gp + i0, xp + i0, op + i0, i1 - i0);
    });
  });
}

} // namespace mlxrt_qmv
