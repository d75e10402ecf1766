// What the attention primitives' CPU loops share (fused.cpp evaluates, kernel_avx2_attn.cpp holds
// the AVX2 loop, decode_attention.cpp runs them over a decode step's cache): the views of q, k, v
// and the mask, and one task's work.
#pragma once

#include <cstdint>

namespace mlxrt_qmv {

// A float32 array's element strides, padded on the left to four dimensions.
struct View4 {
  const float* data;
  int64_t shape[4];
  int64_t stride[4];
};

// The mask broadcast to (batch, heads, queries, keys): bool (b) or additive float (f), or none.
struct MaskView {
  const uint8_t* b = nullptr; // bool_ is one byte
  const float* f = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};
};

// softmax(q·kᵀ·scale + mask)·v for q (B, Hq, L, D), k (B, Hk, S, D), v (B, Hk, S, Dv) into out
// (B, Hq, L, Dv) contiguous. mode: 0 no mask, 1 causal (queries are the last L of the S
// positions), 2 bool mask, 3 additive float mask.
struct AttnProblem {
  View4 q, k, v;
  MaskView mask;
  float scale;
  int mode;
  float* out;
};

// Computes p on the calling thread (a primitive's dispatched work), over the kernel's threads
// where it pays: the AVX2 loop where attention_avx2_ok(p) and the portable loops are not forced
// (MLXRT_QMV_KERNEL=portable), the portable loop otherwise. The Attention and DecodeAttention
// primitives both run it, so their results are the same bits for the same q, k and v.
void run_attention(const AttnProblem& p);

// Whether attention_group_avx2 can take p: an x86-64 CPU with AVX2 and FMA, keys and values
// contiguous along their last axis, D and Dv multiples of 8 (at most 256).
bool attention_avx2_ok(const AttnProblem& p);

// Task t of B·Hk·L: batch row b, key head hk, query l, for the Hq / Hk query heads that share hk
// (each key and value row read once for all of them). Per (query head, key) the same operations
// whatever the batch or the other keys: a left-padded batch row's results are its own results
// alone, bit for bit (masked keys add exact zeros to the sums over keys, which run in key order).
void attention_group_avx2(const AttnProblem& p, int64_t t);

} // namespace mlxrt_qmv
