// mlxrt_qmv's fused primitives: the three mx.fast operations a decoder layer runs besides its
// products. On the CPU MLX computes each of them from its fallback graph (rms_norm ~8 ops, rope
// ~40, a decode step's attention ~12), and a decode step of a 30-layer model spends more time
// dispatching those ~2,800 small ops than in its products. Each function here is one primitive
// for what it supports on the CPU and the mx::fast operation itself otherwise, so callers may
// always call it.
#pragma once

#include <optional>
#include <string>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qmv.h"

namespace mx = mlx::core;

namespace mlxrt_qmv {

// The most query positions the attention primitive takes (a decode step, a few speculative
// drafts); for a longer prefill chunk attention() builds MLX's fallback graph, whose products go
// through the BLAS, with the Softmax primitive (activation.h) in it.
constexpr int MAX_QUERIES = 16;

// mx::fast::rms_norm(x, weight, eps): one primitive for float32 x (and weight) on the CPU.
mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps, mx::StreamOrDevice s = {});

// mx::fast::rope(x, dims, traditional, base, scale, offset) with the default frequencies: one
// primitive for float32 x of 3 or 4 dimensions on the CPU. offset is an integer scalar or one
// per batch row (x.shape(0) entries), as MLX takes it.
mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale, const mx::array& offset,
               mx::StreamOrDevice s = {});

// mx::fast::scaled_dot_product_attention(q, k, v, scale, mask_mode, mask) without sinks: one
// primitive for float32 q, k, v of 4 dimensions (grouped heads included) with at most
// MAX_QUERIES query positions on the CPU (more: MLX's fallback graph with the Softmax primitive,
// mx.fast's bits; a long prompt's queries in pieces, see fused.cpp). mask_mode is "", "causal" or "array" (then mask, a bool or float mask
// broadcastable to (B, heads, queries, keys)).
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                    const std::string& mask_mode, const std::optional<mx::array>& mask, mx::StreamOrDevice s = {});

// Whether attention() runs the primitive for these arguments (not MLX's own).
bool attention_supported(const mx::array& q, const mx::array& k, const mx::array& v, mx::StreamOrDevice s = {});

class RmsNorm : public SameShapePrimitive {
 public:
  RmsNorm(mx::Stream stream, float eps, bool has_weight) : SameShapePrimitive(stream), eps_(eps), has_weight_(has_weight) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive& other) const override;
  const char* name() const override {
    return "MlxrtRmsNorm";
  }

 private:
  float eps_;
  bool has_weight_;
};

class Rope : public SameShapePrimitive {
 public:
  Rope(mx::Stream stream, int dims, bool traditional, float base, float scale)
      : SameShapePrimitive(stream), dims_(dims), traditional_(traditional), base_(base), scale_(scale) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive& other) const override;
  const char* name() const override {
    return "MlxrtRope";
  }

 private:
  int dims_;
  bool traditional_;
  float base_;
  float scale_;
};

class Attention : public CpuPrimitive {
 public:
  // mask: 0 none, 1 causal, 2 a bool array, 3 an additive float array (the fourth input).
  Attention(mx::Stream stream, float scale, int mask) : CpuPrimitive(stream), scale_(scale), mask_(mask) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;
  const char* name() const override {
    return "MlxrtAttention";
  }

 private:
  float scale_;
  int mask_;
};

} // namespace mlxrt_qmv
