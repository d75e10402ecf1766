// The swiglu, geglu, softmax, log_softmax, argmax and exp primitives (activation.h): their ops, portable loops
// and CPU evaluation.
#include "activation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "mlx/utils.h"
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

// The loop NAME_avx2 where the CPU has AVX2 and FMA (kernel_avx2_act.cpp: x86-64 builds only)
// and MLXRT_QMV_KERNEL does not force the portable loops, else the portable NAME_generic.
#if defined(__x86_64__) || defined(_M_X64)
bool avx2_fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !portable_forced();
  return ok;
}
#define MLXRT_LOOP(NAME) (avx2_fma() ? NAME##_avx2 : NAME##_generic)
#else
#define MLXRT_LOOP(NAME) NAME##_generic
#endif

} // namespace

void swiglu_generic(const float* gate, const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (gate[i] * mlx_sigmoid(gate[i])) * x[i];
}

mx::array swiglu(const mx::array& gate, const mx::array& x, mx::StreamOrDevice s) {
  const bool ok = mx::to_stream(s).device == mx::Device::cpu && gate.dtype() == mx::float32 &&
      x.dtype() == mx::float32 && gate.shape() == x.shape() && gate.size() > 0;
  if (!ok) return mx::multiply(mx::multiply(gate, mx::sigmoid(gate, s), s), x, s);
  // The inputs as they are: a contiguous() here would be a primitive of its own in every gated MLP
  // (two a layer, 60 of a SmolLM2 decode step's ~900, each set up and dispatched though it copies
  // nothing for the products' fresh rows); eval_cpu gathers the rare strided input itself.
  return mx::array(gate.shape(), mx::float32, std::make_shared<Swiglu>(mx::to_stream(s)), {gate, x});
}

namespace {

// ``a``'s elements in row-major order: its own buffer where it is dense and row-major, else a
// gathered copy in ``scratch``.
const float* row_major(const mx::array& a, std::vector<float>& scratch) {
  if (a.flags().row_contiguous && a.data_size() == a.size()) return a.data<float>();
  scratch.resize(a.size());
  const float* p = a.data<float>();
  for (size_t i = 0; i < a.size(); ++i) scratch[i] = p[mx::elem_to_loc(static_cast<int64_t>(i), a.shape(), a.strides())];
  return scratch.data();
}

} // namespace

namespace {

using Elementwise2 = void (*)(const float*, const float*, float*, int64_t);

// out = run(a, b) elementwise for a primitive of two float32 inputs of out's shape (swiglu, geglu):
// strided inputs gathered, and split over the kernel's threads once there is enough work to pay
// for waking them (pieces of 4096, a multiple of every loop's vector width).
void eval_elementwise2(const std::vector<mx::array>& inputs, mx::array& out, mx::Stream stream, Elementwise2 run) {
  const auto& a = inputs[0];
  const auto& b = inputs[1];
  auto& encoder = begin_eval(inputs, out, stream);
  encoder.dispatch([a, b, run, op = out.data<float>(), n = static_cast<int64_t>(out.size())]() {
    std::vector<float> as, bs;
    const float* ap = row_major(a, as);
    const float* bp = row_major(b, bs);
    constexpr int64_t piece = 4096;
    if (n < 4 * piece) {
      run(ap, bp, op, n);
      return;
    }
    parallel_for(static_cast<int>((n + piece - 1) / piece), static_cast<size_t>(n) * 12, [&](int p0, int p1) {
      const int64_t i0 = p0 * piece, i1 = std::min<int64_t>(n, p1 * piece);
      run(ap + i0, bp + i0, op + i0, i1 - i0);
    });
  });
}

} // namespace

void Swiglu::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  eval_elementwise2(inputs, outputs[0], stream(), MLXRT_LOOP(swiglu));
}

// ---------------------------------------------------------------- geglu

void geglu_generic(const float* gate, const float* up, float* out, int64_t n) {
  using namespace geglu_const;
  // geglu_avx2's operations one lane at a time (no fused multiply-adds there either), so the same
  // bits; the comparisons are written as _mm256_max_ps / _mm256_min_ps compute them (a NaN w
  // gives kLowest, and the NaN g then gives a NaN result).
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float w = g * (g * g * kCubic + kLinear);
    float c = w > kLowest ? w : kLowest;
    c = c < kHighest ? c : kHighest;
    const float fx = std::floor(c * kLog2e + 0.5f);
    float r = c - fx * kLn2Hi;
    r = r - fx * kLn2Lo;
    float y = kP0;
    y = y * r + kP1;
    y = y * r + kP2;
    y = y * r + kP3;
    y = y * r + kP4;
    y = y * r + kP5;
    y = y * (r * r) + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(fx) + 127) << 23;
    float two;
    std::memcpy(&two, &bits, sizeof two);
    const float e = w > kHighest ? std::numeric_limits<float>::infinity() : y * two;
    out[i] = g / (1.0f + e) * up[i];
  }
}

mx::array geglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s) {
  const bool ok = mx::to_stream(s).device == mx::Device::cpu && gate.dtype() == mx::float32 &&
      up.dtype() == mx::float32 && gate.shape() == up.shape() && gate.size() > 0;
  if (!ok) { // mlx.nn.gelu_approx's operations, then the product
    const auto half = mx::array(0.5f, gate.dtype()), one = mx::array(1.0f, gate.dtype());
    const auto cube = mx::multiply(mx::array(0.044715f, gate.dtype()), mx::power(gate, mx::array(3, gate.dtype()), s), s);
    const auto z = mx::multiply(mx::array(0.7978845608028654f, gate.dtype()), mx::add(gate, cube, s), s);
    const auto gelu = mx::multiply(mx::multiply(half, gate, s), mx::add(one, mx::tanh(z, s), s), s);
    return mx::multiply(gelu, up, s);
  }
  // the inputs as they are, as swiglu's (eval_cpu gathers a strided one)
  return mx::array(gate.shape(), mx::float32, std::make_shared<Geglu>(mx::to_stream(s)), {gate, up});
}

void Geglu::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  eval_elementwise2(inputs, outputs[0], stream(), MLXRT_LOOP(geglu));
}

// ---------------------------------------------------------------- softmax

void softmax_generic(const float* in, float* out, int64_t rows, const SoftmaxRows& a) {
  const int64_t n = a.n;
  for (int64_t r = 0; r < rows; ++r, in += n, out += n) {
    const int64_t seen = a.seen(r);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < seen; ++i) m = std::max(in[i], m);
    float total = 0.f;
    for (int64_t i = 0; i < seen; ++i) {
      out[i] = mlx_exp(in[i] - m);
      total = total + out[i];
    }
    const float inv = 1 / total;
    for (int64_t i = 0; i < seen; ++i) out[i] = out[i] * inv;
    for (int64_t i = seen; i < n; ++i) out[i] = 0.f;
  }
}

mx::array softmax(const mx::array& x, int causal_start, mx::StreamOrDevice s) {
  const bool ok = mx::to_stream(s).device == mx::Device::cpu && x.dtype() == mx::float32 && x.ndim() >= 1 &&
      x.shape(-1) > 0 && x.size() > 0 && (causal_start < 0 || x.ndim() >= 2);
  if (!ok) {
    if (causal_start < 0) return mx::softmax(x, std::vector<int>{-1}, true, s);
    const int queries = x.shape(-2), keys = x.shape(-1);
    const auto mask = mx::greater_equal(mx::expand_dims(mx::arange(causal_start, causal_start + queries, s), 1, s),
                                        mx::expand_dims(mx::arange(0, keys, s), 0, s), s);
    const auto lowest = mx::array(mx::finfo(x.dtype()).min, x.dtype());
    return mx::softmax(mx::where(mask, x, lowest, s), std::vector<int>{-1}, true, s);
  }
  return mx::array(x.shape(), mx::float32, std::make_shared<Softmax>(mx::to_stream(s), causal_start),
                   {mx::contiguous(x, false, s)});
}

void Softmax::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  // in place where MLX may reuse the input's buffer (as its own softmax does): a prefill chunk's
  // scores are the largest array of its attention; each element is read before it is written
  auto& encoder = mx::cpu::get_command_encoder(stream());
  if (x.is_donatable() && x.flags().row_contiguous && x.data_size() == x.size()) {
    out.copy_shared_buffer(x);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  encoder.set_input_array(x);
  encoder.set_output_array(out);
  const int64_t n = x.shape(-1);
  const SoftmaxRows shape{n, 0, causal_start_ < 0 ? 1 : x.shape(-2), causal_start_};
  encoder.dispatch([ip = x.data<float>(), op = out.data<float>(), shape, rows = static_cast<int64_t>(x.size()) / n]() {
    const auto run = MLXRT_LOOP(softmax);
    const int64_t n = shape.n;
    // rows in pieces of ~16K elements over the kernel's threads, when there are enough
    const int64_t piece = std::max<int64_t>(1, 16384 / n);
    const int64_t pieces = (rows + piece - 1) / piece;
    if (pieces < 2) {
      run(ip, op, rows, shape);
      return;
    }
    parallel_for(static_cast<int>(pieces), static_cast<size_t>(rows * n) * 8, [&](int p0, int p1) {
      const int64_t r0 = p0 * piece, r1 = std::min<int64_t>(rows, p1 * piece);
      SoftmaxRows part = shape;
      part.first_row = r0;
      run(ip + r0 * n, op + r0 * n, r1 - r0, part);
    });
  });
}

// ---------------------------------------------------------------- log_softmax

void log_softmax_generic(const float* in, float* out, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r, in += n, out += n) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::isnan(in[i]) ? in[i] : (in[i] > m ? in[i] : m); // MLX's maximum
    float total = 0.f;
    for (int64_t i = 0; i < n; ++i) total = total + mlx_exp(in[i] - m);
    const float lse = std::isinf(m) ? m : std::log(total) + m;
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] - lse;
  }
}

mx::array log_softmax(const mx::array& x, mx::StreamOrDevice s) {
  const bool ok = mx::to_stream(s).device == mx::Device::cpu && x.dtype() == mx::float32 && x.ndim() >= 1 &&
      x.shape(-1) > 0 && x.size() > 0;
  if (!ok) return mx::subtract(x, mx::logsumexp(x, std::vector<int>{-1}, true, s), s);
  return mx::array(x.shape(), mx::float32, std::make_shared<LogSoftmax>(mx::to_stream(s)), {mx::contiguous(x, false, s)});
}

void LogSoftmax::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  const int64_t n = x.shape(-1), rows = static_cast<int64_t>(x.size()) / n;
  encoder.dispatch([ip = x.data<float>(), op = out.data<float>(), rows, n]() {
    const auto run = MLXRT_LOOP(log_softmax);
    // a batch's rows over the kernel's threads (one row of a 49K vocabulary is ~0.1 ms)
    parallel_for(static_cast<int>(rows), static_cast<size_t>(rows * n) * 8, [&](int r0, int r1) {
      run(ip + r0 * n, op + r0 * n, r1 - r0, n);
    }, rows == 1);
  });
}

// ---------------------------------------------------------------- argmax

int64_t argmax_generic(const float* in, int64_t n) {
  int64_t at = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (std::isnan(in[at])) break; // MLX's: the first NaN wins
    if (in[i] > in[at] || std::isnan(in[i])) at = i;
  }
  return at;
}

mx::array argmax(const mx::array& x, mx::StreamOrDevice s) {
  const bool ok = mx::to_stream(s).device == mx::Device::cpu && x.dtype() == mx::float32 && x.ndim() >= 1 &&
      x.shape(-1) > 0 && x.size() > 0;
  if (!ok) return mx::argmax(x, -1, false, s);
  return mx::array(mx::Shape(x.shape().begin(), x.shape().end() - 1), mx::uint32,
                   std::make_shared<Argmax>(mx::to_stream(s)), {mx::contiguous(x, false, s)});
}

void Argmax::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  const int64_t n = x.shape(-1), rows = static_cast<int64_t>(x.size()) / n;
  encoder.dispatch([ip = x.data<float>(), op = out.data<uint32_t>(), rows, n]() {
    const auto run = MLXRT_LOOP(argmax);
    for (int64_t r = 0; r < rows; ++r) op[r] = static_cast<uint32_t>(run(ip + r * n, n));
  });
}

// ---------------------------------------------------------------- exp

void exp_generic(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = mlx_exp(in[i]);
}

mx::array exp(const mx::array& x, mx::StreamOrDevice s) {
  const bool ok = mx::to_stream(s).device == mx::Device::cpu && x.dtype() == mx::float32 && x.size() > 0;
  if (!ok) return mx::exp(x, s);
  return mx::array(x.shape(), mx::float32, std::make_shared<Exp>(mx::to_stream(s)), {mx::contiguous(x, false, s)});
}

void Exp::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  encoder.dispatch([ip = x.data<float>(), op = out.data<float>(), n = static_cast<int64_t>(x.size())]() {
    MLXRT_LOOP(exp)(ip, op, n);
  });
}

} // namespace mlxrt_qmv
