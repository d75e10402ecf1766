// mlxrt_qmv's activation primitive: mlx-lm's swiglu, silu(gate) * x, as one op. MLX's CPU
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

class Swiglu : public CpuPrimitive {
 public:
  explicit Swiglu(mx::Stream stream) : CpuPrimitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
  const char* name() const override {
    return "MlxrtSwiglu";
  }
};

} // namespace mlxrt_qmv
