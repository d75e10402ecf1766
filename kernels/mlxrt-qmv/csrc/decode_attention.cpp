// The decode attention primitives (decode_attention.h): the step's key and value written into
// the cache's buffers at the step's row (CacheWrite: as MLX's slice update writes them, in place
// where MLX would donate the buffer; the key rotated as the Rope primitive rotates it, rope.h), and
// the attention over the buffers' first rows (DecodeAttention: the query rotated likewise, then
// run_attention, as the Attention primitive runs over MLX's slice views of them, or over the
// whole buffers).
#include "decode_attention.h"

#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "attention.h"
#include "rope.h"

namespace mlxrt_qmv {

namespace {

// A float32 input read in its logical (row-major) order: in place when row-contiguous, else
// gathered element by element (the projections' rows always are contiguous; a caller's view may
// not be).
struct Values {
  const float* data;
  bool contiguous;
  mx::Shape shape;
  mx::Strides strides;
  int64_t size;

  explicit Values(const mx::array& a)
      : data(a.data<float>()), contiguous(a.flags().row_contiguous), shape(a.shape()), strides(a.strides()),
        size(static_cast<int64_t>(a.size())) {}

  // The values in order: the data itself, or copied into buf.
  const float* read(std::vector<float>& buf) const {
    if (contiguous) return data;
    buf.resize(size);
    for (int64_t i = 0; i < size; ++i) buf[i] = data[mx::elem_to_loc(static_cast<int>(i), shape, strides)];
    return buf.data();
  }
};

// MLX's rule for an array written into (its slice update's): out takes in's buffer when MLX would
// donate it (nothing else holds in: not the caller, nor a view of it, nor a graph still to run)
// and in is laid out as out must be; otherwise out has a buffer of its own, which the step fills
// with in's values first (copy_into).
bool take_buffer(const mx::array& in, mx::array& out) {
  if (in.flags().row_contiguous && in.data_size() == in.size() && mx::is_donatable(in, out)) {
    out.copy_shared_buffer(in);
    return true;
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  return false;
}

void copy_into(const Values& in, float* out) {
  if (in.contiguous) {
    std::memcpy(out, in.data, static_cast<size_t>(in.size) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < in.size; ++i) out[i] = in.data[mx::elem_to_loc(static_cast<int>(i), in.shape, in.strides)];
}

// The first rows of a written cache buffer (1, H, S, D): the view MLX's slice of them is (the
// same data and strides), or the buffer itself when rows is S.
View4 cache_view(const mx::array& cache, int rows) {
  View4 v{cache.data<float>(), {1, cache.shape(1), rows, cache.shape(3)}, {0, 0, 0, 0}};
  for (int i = 0; i < 4; ++i) v.stride[i] = cache.strides()[i];
  return v;
}

// The cosines and sines of rope's position (its offset) for each of its dims / 2 pairs, as the
// Rope primitive computes them for one position, in this thread's buffers.
struct Angles {
  const float* cs;
  const float* sn;
};

Angles angles_at(const RopeAt& rope) {
  thread_local std::vector<float> inv_freq, cs, sn; // kept between calls: no allocation per step
  const int half = rope.dims / 2;
  inv_freq.resize(half);
  cs.resize(half);
  sn.resize(half);
  rope_inv_freq(inv_freq.data(), half, rope.base);
  rope_angles(inv_freq.data(), half, 0.f, static_cast<float>(rope.offset), rope.scale, cs.data(), sn.data());
  return {cs.data(), sn.data()};
}

} // namespace

bool decode_attention_supported(const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& k_cache,
                                const mx::array& v_cache, int offset, int row, int length, int dims,
                                mx::StreamOrDevice s) {
  const auto f32 = [](const mx::array& a) { return a.dtype() == mx::float32; };
  if (mx::to_stream(s).device != mx::Device::cpu || !f32(q) || !f32(k) || !f32(v) || !f32(k_cache) ||
      !f32(v_cache) || k_cache.ndim() != 4 || v_cache.ndim() != 4) {
    return false;
  }
  const int64_t Hk = k_cache.shape(1), S = k_cache.shape(2), D = k_cache.shape(3), Dv = v_cache.shape(3);
  const int64_t qn = static_cast<int64_t>(q.size());
  return k_cache.shape(0) == 1 && v_cache.shape(0) == 1 && v_cache.shape(1) == Hk && v_cache.shape(2) == S &&
      Hk > 0 && D > 0 && Dv > 0 && offset >= 0 && row >= 0 && row < S && length > 0 && length <= S &&
      static_cast<int64_t>(k.size()) == Hk * D &&
      static_cast<int64_t>(v.size()) == Hk * Dv && qn > 0 && qn % D == 0 && (qn / D) % Hk == 0 && dims > 0 &&
      dims % 2 == 0 && dims <= D;
}

std::vector<mx::array> decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                                        const mx::array& k_cache, const mx::array& v_cache, int offset, int row,
                                        int length, float scale, int dims, bool traditional, float base,
                                        float rope_scale, mx::StreamOrDevice s) {
  if (!decode_attention_supported(q, k, v, k_cache, v_cache, offset, row, length, dims, s)) {
    throw std::invalid_argument(
        "[decode_attention] takes float32 on the CPU: one token's q (Hq·D values), k (Hk·D), v (Hk·Dv), the "
        "caches (1, Hk, S, D) and (1, Hk, S, Dv), offset >= 0, 0 <= row < S, 0 < length <= S, and an even rope "
        "dims <= D");
  }
  const auto stream = mx::to_stream(s);
  const RopeAt rope{offset, dims, traditional, base, rope_scale};
  auto keys = mx::array(k_cache.shape(), mx::float32, std::make_shared<CacheWrite>(stream, row, rope), {k, k_cache});
  auto values = mx::array(v_cache.shape(), mx::float32,
                          std::make_shared<CacheWrite>(stream, row, RopeAt{0, 0, false, 0.f, 0.f}), {v, v_cache});
  const int Hq = static_cast<int>(q.size() / k_cache.shape(3));
  auto out = mx::array({1, 1, Hq * v_cache.shape(3)}, mx::float32,
                       std::make_shared<DecodeAttention>(stream, scale, length, rope), {q, keys, values});
  return {out, keys, values};
}

bool CacheWrite::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CacheWrite&>(other);
  return row_ == o.row_ && rope_ == o.rope_;
}

void CacheWrite::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& cache = inputs[1];
  auto& out = outputs[0];
  const bool kept = take_buffer(cache, out);
  const int64_t H = cache.shape(1), D = cache.shape(3);
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.dispatch([x = Values(inputs[0]), old = kept ? std::nullopt : std::optional<Values>(Values(cache)),
                    op = out.data<float>(), s1 = out.strides()[1], s2 = out.strides()[2], H, D, at = row_,
                    rope = rope_]() {
    // a cache buffer something else still holds: the step writes into a copy of it, as MLX's does
    if (old) copy_into(*old, op);
    thread_local std::vector<float> buf; // kept between calls
    const float* xp = x.read(buf);
    float* const row = op + at * s2;
    if (rope.dims == 0) {
      for (int64_t h = 0; h < H; ++h) std::memcpy(row + h * s1, xp + h * D, static_cast<size_t>(D) * sizeof(float));
      return;
    }
    const Angles a = angles_at(rope);
    for (int64_t h = 0; h < H; ++h) rope_row(xp + h * D, 1, row + h * s1, a.cs, a.sn, rope.dims, D, rope.traditional);
  });
}

bool DecodeAttention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const DecodeAttention&>(other);
  return scale_ == o.scale_ && length_ == o.length_ && rope_ == o.rope_;
}

std::vector<mx::Shape> DecodeAttention::output_shapes(const std::vector<mx::array>& inputs) {
  const int Hq = static_cast<int>(inputs[0].size() / inputs[1].shape(3));
  return {{1, 1, Hq * inputs[2].shape(3)}};
}

void DecodeAttention::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  const int64_t D = inputs[1].shape(3);
  const int64_t Hq = static_cast<int64_t>(inputs[0].size()) / D;
  const View4 kv = cache_view(inputs[1], length_), vv = cache_view(inputs[2], length_);
  encoder.dispatch([q = Values(inputs[0]), kv, vv, Hq, D, op = out.data<float>(), scale = scale_, rope = rope_]() {
    thread_local std::vector<float> buf, qs; // kept between calls
    const float* qp = q.read(buf);
    const Angles a = angles_at(rope);
    // the rotated queries as the Rope primitive lays them out, (1, Hq, 1, D)
    qs.resize(static_cast<size_t>(Hq * D));
    for (int64_t h = 0; h < Hq; ++h) rope_row(qp + h * D, 1, qs.data() + h * D, a.cs, a.sn, rope.dims, D, rope.traditional);
    const View4 qv{qs.data(), {1, Hq, 1, D}, {Hq * D, D, D, 1}};
    run_attention(AttnProblem{qv, kv, vv, MaskView{}, scale, 0, op});
  });
}

} // namespace mlxrt_qmv
