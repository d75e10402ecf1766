// mlxrt_qmv's elementwise and row primitives: swiglu, softmax, log_softmax (a decode step's
// log-probabilities), argmax (a greedy draw from them) and exp, each MLX's float32 results bit for bit, and geglu (Gemma's MLP
// activation), within a stated bound of MLX's. First, mlx-lm's swiglu,
// silu(gate) * x, as one op. MLX's CPU
// backend on x86-64 runs its sigmoid one element at a time through a software fma (std::fma in
// its simd::exp): ~14 ns an element, ~1 ms a layer for a 32-token SmolLM2 prefill chunk, a sixth
// of the chunk's time. The primitive computes the same operations in the same order (the same
// float32 results, bit for bit), eight elements at a time where the CPU has AVX2 and FMA.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qmv.h"

namespace mx = mlx::core;

namespace mlxrt_qmv {

// nn.silu(gate) * x, i.e. gate * mx.sigmoid(gate) * x: one primitive for float32 gate and x of
// the same shape on the CPU, MLX's own ops otherwise.
mx::array swiglu(const mx::array& gate, const mx::array& x, mx::StreamOrDevice s = {});

// out[i] = gate[i] * sigmoid(gate[i]) * x[i] for n contiguous elements, MLX's arithmetic.
void swiglu_generic(const float* gate, const float* x, float* out, int64_t n);
void swiglu_avx2(const float* gate, const float* x, float* out, int64_t n);

// gelu_approx(gate) * up (mlx.nn's tanh-approximated GELU, 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))),
// times the up projection: Gemma 2 and 3's MLP activation) as one primitive for float32 gate and up
// of the same shape on the CPU, MLX's own ops otherwise. Not MLX's bits: MLX's CPU backend runs its
// compiled graph one element at a time through libm's powf and tanhf (~15 ns an element, 16 % of a
// Gemma 3 270M prefill); this computes the same function as g / (1 + e^(-2z)), z = √(2/π)·(g +
// 0.044715·g³) (the identity 0.5·(1 + tanh z) = 1 / (1 + e^(-2z)), which also avoids 1 + tanh's
// cancellation for negative g), e^w by its own polynomial, eight at a time where the CPU has AVX2.
// Its bound against a float64 reference and against MLX's float32 is docs/performance.md's
// ("A vectorized GELU"). Every element is computed by the same operations wherever it lies: the
// vector loop's tail goes through a padded vector, and the portable loop is those operations one
// lane at a time (the same bits), so a row's result never depends on the array's length or the
// rows beside it. Saturates as MLX's: ±0 for g below ~-10 (e^(-2z) overflows to inf), g itself
// above ~5 (1 + e^(-2z) rounds to 1), NaN for NaN and -inf, inf for inf.
mx::array geglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s = {});

// The operations of one element, shared by both loops so their constants are one. -2·√(2/π) and
// that times 0.044715: w = g·(kLinear + kCubic·g²) = -2z. e^w for w in [kLowest, kHighest] by
// Cody and Waite's reduction (w = n·ln 2 + r, ln 2 in a high part exact in products by n and a low
// part) and Cephes' degree-5 polynomial for (e^r - 1 - r) / r²; w above kHighest is inf.
namespace geglu_const {
inline constexpr float kLinear = -1.5957691216057308f, kCubic = -0.07135481627260025f;
inline constexpr float kLowest = -87.0f, kHighest = 88.0f, kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                       kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
} // namespace geglu_const

// out[i] = gelu_approx(gate[i]) * up[i] for n contiguous elements, the same bits in both loops.
void geglu_generic(const float* gate, const float* up, float* out, int64_t n);
void geglu_avx2(const float* gate, const float* up, float* out, int64_t n);

class Geglu : public PlainPrimitive {
 public:
  using PlainPrimitive::PlainPrimitive;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override {
    return "MlxrtGeglu";
  }
};

// mx.softmax(x, axis=-1) for float32 x on the CPU as one primitive with MLX's float32 results,
// bit for bit (MLX's CPU softmax: the row's maximum, simd::exp of each element less it, their sum
// in order, each exponential times the sum's reciprocal), the exponentials eight at a time where
// the CPU has AVX2 and FMA: MLX's runs one element at a time through a software fma, ~19 ns an
// element, which made a long prompt's prefill attention (MLX's fallback graph) the bulk of its
// time. Other dtypes or devices: mx.softmax.
//
// causal_start >= 0: x's last two axes are (queries, keys) scores and query i may see keys up to
// causal_start + i — the result is MLX's softmax of where(mask, x, finfo.min) for that causal
// mask (the masked keys' exponentials are exact zeros and add nothing to the sums, which run in
// key order), without the mask or the where: what mx.fast's fallback graph computes for a
// causal chunk of queries whose first query is at key position causal_start.
mx::array softmax(const mx::array& x, int causal_start = -1, mx::StreamOrDevice s = {});

// Softmax of `rows` contiguous rows of n floats, MLX's arithmetic. causal_start >= 0: row r is
// query (first_row + r) % queries of its block and sees keys [0, causal_start + that query].
struct SoftmaxRows {
  int64_t n, first_row = 0, queries = 1, causal_start = -1;
  // The keys row r (of a run starting at first_row) sees: all n, or up to its causal bound.
  int64_t seen(int64_t r) const {
    const int64_t bound = causal_start + (first_row + r) % queries + 1;
    return causal_start < 0 || bound > n ? n : bound;
  }
};
void softmax_generic(const float* in, float* out, int64_t rows, const SoftmaxRows& a);
void softmax_avx2(const float* in, float* out, int64_t rows, const SoftmaxRows& a);

// logits - mx.logsumexp(logits, axis=-1, keepdims=True) for float32 logits on the CPU as one
// primitive, MLX's float32 results bit for bit: MLX's LogSumExp (the row's maximum, NaN if any
// element is; simd::exp of each element less it, summed in order; log of the sum plus the
// maximum, or the maximum itself where it is infinite), then each element less that. The
// engine's log-probabilities of every decode step: over a 49,152-token vocabulary MLX's runs
// its exponentials one at a time through a software fma, 0.8 ms a row (5.8 ms a batch of 8),
// against ~0.1 ms here. Other dtypes or devices: MLX's own ops.
mx::array log_softmax(const mx::array& x, mx::StreamOrDevice s = {});

// mx.exp(x) for float32 x on the CPU as one primitive, MLX's bits (its simd::exp, one element at
// a time through a software fma there, ~15 ns an element; eight at a time here where the CPU has
// AVX2 and FMA): what a sampler's nucleus (top-p) filter exponentiates over the sorted vocabulary
// each token. Other dtypes or devices: mx.exp.
mx::array exp(const mx::array& x, mx::StreamOrDevice s = {});
void exp_generic(const float* in, float* out, int64_t n);
void exp_avx2(const float* in, float* out, int64_t n);

class Exp : public PlainPrimitive {
 public:
  using PlainPrimitive::PlainPrimitive;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override {
    return "MlxrtExp";
  }
};

// log_softmax of `rows` contiguous rows of n floats, MLX's arithmetic.
void log_softmax_generic(const float* in, float* out, int64_t rows, int64_t n);
void log_softmax_avx2(const float* in, float* out, int64_t rows, int64_t n);

class LogSoftmax : public PlainPrimitive {
 public:
  using PlainPrimitive::PlainPrimitive;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override {
    return "MlxrtLogSoftmax";
  }
};

// mx.argmax(x, axis=-1) for float32 x on the CPU as one primitive, MLX's result: for each row the
// index (uint32) of its first NaN if it has one, else of the first element equal to its maximum
// (a greedy draw from a decode step's log-probabilities). MLX's CPU loop compares one element at
// a time through a strided index, 0.27 ms a row of Gemma 3's 262,144-token vocabulary (2 ms a
// step of a batch of 8); here the maximum and then its first place are found eight at a time
// where the CPU has AVX2. Other dtypes or devices: mx.argmax.
mx::array argmax(const mx::array& x, mx::StreamOrDevice s = {});
int64_t argmax_generic(const float* in, int64_t n);
int64_t argmax_avx2(const float* in, int64_t n);

class Argmax : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {mx::Shape(inputs[0].shape().begin(), inputs[0].shape().end() - 1)};
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
  const char* name() const override {
    return "MlxrtArgmax";
  }
};

class Softmax : public SameShapePrimitive {
 public:
  Softmax(mx::Stream stream, int causal_start) : SameShapePrimitive(stream), causal_start_(causal_start) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive& other) const override {
    return causal_start_ == static_cast<const Softmax&>(other).causal_start_;
  }
  const char* name() const override {
    return "MlxrtSoftmax";
  }

 private:
  int causal_start_;
};

class Swiglu : public PlainPrimitive {
 public:
  using PlainPrimitive::PlainPrimitive;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override {
    return "MlxrtSwiglu";
  }
};

} // namespace mlxrt_qmv
