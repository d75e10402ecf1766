// One sequence's decode-step attention over mlx-lm's KVCache or RotatingKVCache in three
// primitives. mlx-lm's layer runs, per layer and step, a reshape of each of q, k and v into heads,
// the rotary embedding of q and k, two slice updates (the step's key and value written into a row
// of the cache's buffer: its offset for a KVCache, its write index for a RotatingKVCache) and two
// slices (the buffer's first offset + 1 rows, or the whole buffer once it holds that many), the
// attention and a reshape back: eleven primitives, each set up by MLX on the calling thread and
// dispatched on its stream. Here a CacheWrite each for the key (rotated) and the value, and a
// DecodeAttention (the query rotated, the attention over the written buffers' first rows) compute
// the same values with the same code (rope.h, run_attention in attention.h), so their results are
// those primitives' bits. The writes are primitives of one output each: MLX donates an input's
// buffer to an output only where the input's array is held by nothing but the one primitive that
// reads it (array::is_donatable), which the several outputs of one primitive would not be (each
// holds its inputs).
#pragma once

#include <vector>

#include "qmv.h"

namespace mlxrt_qmv {

// The step of one token of one sequence, for float32 on the CPU: q (Hq·D values: the query
// projection's row (1, 1, Hq·D), or its heads (1, Hq, 1, D)), k (Hk·D values) and v (Hk·Dv),
// k_cache (1, Hk, S, D) and v_cache (1, Hk, S, Dv), the cache's buffers, the token at position
// offset (>= 0), written into buffer row `row` (0 <= row < S), attending to the buffers' first
// `length` rows (0 < length <= S). A KVCache's step is row = offset, length = offset + 1; a
// RotatingKVCache's is row = its write index (after its wrap), length = min(offset + 1, S), the rows
// in buffer order. Returns {out, k_cache', v_cache'}: k_cache' is k_cache with row `row` set to
// rope(k) at position offset, v_cache' likewise with v, and out (1, 1, Hq·Dv) the attention of
// rope(q) (heads grouped onto Hk) over their first length rows, no mask, as
// mx.fast.scaled_dot_product_attention(rope(q), k_cache'[:, :, :length], v_cache'[:, :, :length],
// scale) laid out as mlx-lm's output reshape gives it. rope is mx.fast.rope(·, dims, traditional,
// base, rope_scale, offset) with the default frequencies. The new caches take the old ones'
// buffers where MLX would donate them (nothing else holds them), as MLX's slice update does; else
// they are copies. Throws std::invalid_argument for arguments outside this
// (decode_attention_supported says which are inside).
std::vector<mx::array> decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                                        const mx::array& k_cache, const mx::array& v_cache, int offset, int row,
                                        int length, float scale, int dims, bool traditional, float base,
                                        float rope_scale, mx::StreamOrDevice s = {});

// Whether decode_attention takes these arguments.
bool decode_attention_supported(const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& k_cache,
                                const mx::array& v_cache, int offset, int row, int length, int dims,
                                mx::StreamOrDevice s = {});

// The rotation at a position and its parameters (dims 0: none, the row is copied as it is).
struct RopeAt {
  int offset;
  int dims;
  bool traditional;
  float base;
  float scale;
  bool operator==(const RopeAt&) const = default;
};

// cache (1, H, S, D) with row `row` set to x's H·D values, rotated by rope when rope.dims > 0.
class CacheWrite : public CpuPrimitive {
 public:
  CacheWrite(mx::Stream stream, int row, RopeAt rope) : CpuPrimitive(stream), row_(row), rope_(rope) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[1].shape()};
  }
  const char* name() const override {
    return "MlxrtCacheWrite";
  }

 private:
  int row_;
  RopeAt rope_;
};

// The attention of rope(q) over the first `length` rows of the written caches.
class DecodeAttention : public CpuPrimitive {
 public:
  DecodeAttention(mx::Stream stream, float scale, int length, RopeAt rope)
      : CpuPrimitive(stream), scale_(scale), length_(length), rope_(rope) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;
  const char* name() const override {
    return "MlxrtDecodeAttention";
  }

 private:
  float scale_;
  int length_;
  RopeAt rope_;
};

} // namespace mlxrt_qmv
