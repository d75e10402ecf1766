// The fused primitives (fused.h): their ops, which fall back to mx::fast where they do not
// apply, and their CPU evaluation. The arithmetic follows MLX's fallback graphs step by step in
// float32 (the same operations in the same order where the order matters), so results agree
// with MLX's to float rounding.
#include "fused.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "mlx/fast.h"
#include "activation.h"
#include "attention.h"
#include "qmv.h"
#include "rope.h"

namespace mlxrt_qmv {

namespace {

bool on_cpu(mx::StreamOrDevice s) {
  return mx::to_stream(s).device == mx::Device::cpu;
}

// Σ a[i]·b[i*stride] in eight partial sums (vectorizable without reassociating a single sum).
inline float dot(const float* a, const float* b, int n, int64_t stride) {
  if (stride == 1) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
  }
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i * stride];
  return s;
}

// out[i] += w·v[i*stride]
inline void axpy(float* out, float w, const float* v, int n, int64_t stride) {
  if (stride == 1) {
    for (int i = 0; i < n; ++i) out[i] += w * v[i];
  } else {
    for (int i = 0; i < n; ++i) out[i] += w * v[i * stride];
  }
}

View4 view4(const mx::array& a) {
  View4 v{a.data<float>(), {1, 1, 1, 1}, {0, 0, 0, 0}};
  const int pad = 4 - static_cast<int>(a.ndim());
  for (int i = 0; i < static_cast<int>(a.ndim()); ++i) {
    v.shape[pad + i] = a.shape(i);
    v.stride[pad + i] = a.strides()[i];
  }
  return v;
}

} // namespace

// ---------------------------------------------------------------- rms_norm

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps, mx::StreamOrDevice s) {
  const bool ok = on_cpu(s) && x.dtype() == mx::float32 && x.ndim() >= 1 && x.shape(-1) > 0 &&
      (!weight || (weight->dtype() == mx::float32 && weight->ndim() == 1 && weight->shape(0) == x.shape(-1)));
  if (!ok) return mx::fast::rms_norm(x, weight, eps, s);
  std::vector<mx::array> inputs = {x};
  if (weight) inputs.push_back(*weight);
  return mx::array(x.shape(), mx::float32, std::make_shared<RmsNorm>(mx::to_stream(s), eps, weight.has_value()),
                   std::move(inputs));
}

bool RmsNorm::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const RmsNorm&>(other);
  return eps_ == o.eps_ && has_weight_ == o.has_weight_;
}

void RmsNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  const int D = x.shape(-1);
  const int64_t rows = static_cast<int64_t>(x.size() / D);
  const float* w = has_weight_ ? inputs[1].data<float>() : nullptr;
  const int64_t wstride = has_weight_ ? inputs[1].strides()[0] : 0;
  encoder.dispatch([xp = x.data<float>(), shape = x.shape(), strides = x.strides(), contiguous = x.flags().row_contiguous,
                    w, wstride, op = out.data<float>(), D, rows, eps = eps_]() {
    thread_local std::vector<float> row;
    if (!contiguous) row.resize(D);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xp + r * D;
      if (!contiguous) {
        for (int i = 0; i < D; ++i) row[i] = xp[mx::elem_to_loc(r * D + i, shape, strides)];
        xr = row.data();
      }
      const float mean = dot(xr, xr, D, 1) * (1.0f / static_cast<float>(D));
      const float inv = 1.0f / std::sqrt(mean + eps);
      float* o = op + r * D;
      if (w == nullptr) {
        for (int i = 0; i < D; ++i) o[i] = xr[i] * inv;
      } else {
        for (int i = 0; i < D; ++i) o[i] = (xr[i] * inv) * w[i * wstride];
      }
    }
  });
}

// ---------------------------------------------------------------- rope

mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale, const mx::array& offset,
               mx::StreamOrDevice s) {
  const bool ok = on_cpu(s) && x.dtype() == mx::float32 && (x.ndim() == 3 || x.ndim() == 4) && dims > 0 &&
      dims % 2 == 0 && dims <= x.shape(-1) && mx::issubdtype(offset.dtype(), mx::integer) && offset.ndim() <= 1 &&
      (offset.size() == 1 || (x.ndim() == 4 && static_cast<int>(offset.size()) == x.shape(0)));
  if (!ok) return mx::fast::rope(x, dims, traditional, base, scale, offset, std::nullopt, s);
  return mx::array(x.shape(), mx::float32, std::make_shared<Rope>(mx::to_stream(s), dims, traditional, base, scale),
                   {x, mx::astype(offset, mx::int32, s)});
}

bool Rope::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Rope&>(other);
  return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ && scale_ == o.scale_;
}

void Rope::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  const auto& offset = inputs[1];
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  const View4 xv = view4(x);
  const int n_offsets = static_cast<int>(offset.size());
  encoder.dispatch([xv, offp = offset.data<int32_t>(), n_offsets, op = out.data<float>(), dims = dims_,
                    traditional = traditional_, base = base_, scale = scale_]() {
    const int64_t B = xv.shape[0], H = xv.shape[1], T = xv.shape[2], D = xv.shape[3];
    const int half = dims / 2;
    thread_local std::vector<float> inv_freq, cs, sn; // kept between calls: no allocation per op
    inv_freq.resize(half);
    cs.resize(static_cast<size_t>(T) * half);
    sn.resize(static_cast<size_t>(T) * half);
    rope_inv_freq(inv_freq.data(), half, base);
    for (int64_t b = 0; b < B; ++b) {
      if (b == 0 || n_offsets > 1) {  // positions (t + offset) · scale, their cosines and sines
        const float off = static_cast<float>(offp[n_offsets > 1 ? b : 0]);
        for (int64_t t = 0; t < T; ++t)
          rope_angles(inv_freq.data(), half, static_cast<float>(t), off, scale, cs.data() + t * half, sn.data() + t * half);
      }
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          const float* xr = xv.data + b * xv.stride[0] + h * xv.stride[1] + t * xv.stride[2];
          rope_row(xr, xv.stride[3], op + ((b * H + h) * T + t) * D, cs.data() + t * half, sn.data() + t * half, dims, D,
                   traditional);
        }
      }
    }
  });
}

// ---------------------------------------------------------------- attention

namespace {

// Key and value bytes above which a lone query's attention uses every kernel thread.
constexpr size_t LONE_ATTENTION_BYTES = 1 << 20;

// What attention() computes itself, whatever the number of queries: float32 q, k, v of 4
// dimensions on the CPU whose shapes agree (grouped heads included), no mask, "causal" (with at
// least as many keys as queries) or a bool / float32 array mask of at most 4 dimensions.
bool arguments_ok(const mx::array& q, const mx::array& k, const mx::array& v, const std::string& mask_mode,
                  const std::optional<mx::array>& mask, bool arr, mx::StreamOrDevice s) {
  const bool tensors = on_cpu(s) && q.dtype() == mx::float32 && k.dtype() == mx::float32 && v.dtype() == mx::float32 &&
      q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4 && q.shape(0) == k.shape(0) && k.shape(0) == v.shape(0) &&
      q.shape(-1) == k.shape(-1) && k.shape(1) == v.shape(1) && k.shape(2) == v.shape(2) && k.shape(1) > 0 &&
      q.shape(1) % k.shape(1) == 0 && k.shape(2) > 0;
  if (!tensors || !(mask_mode.empty() || mask_mode == "causal" || mask_mode == "array")) return false;
  if (arr && !(mask.has_value() && mask->ndim() <= 4 && (mask->dtype() == mx::bool_ || mask->dtype() == mx::float32))) return false;
  return !(mask_mode == "causal" && k.shape(2) < q.shape(2));
}

} // namespace

bool attention_supported(const mx::array& q, const mx::array& k, const mx::array& v, mx::StreamOrDevice s) {
  return arguments_ok(q, k, v, "", std::nullopt, false, s) && q.shape(2) <= MAX_QUERIES;
}

namespace {

// A long prompt's scores are (batch, heads, queries, keys) floats: 295 MB a layer for a 2,048-token
// chunk over 4,000 SmolLM2 keys. attention_long takes the queries in pieces whose scores stay
// under this, each piece with only the keys a causal mask lets any of its queries see.
constexpr size_t LONG_SCORES_BYTES = 32 << 20;

mx::array slice_axis(const mx::array& a, int axis, int start, int stop, mx::StreamOrDevice s) {
  mx::Shape lo(a.ndim(), 0);
  mx::Shape hi = a.shape();
  const int ax = axis < 0 ? axis + static_cast<int>(a.ndim()) : axis;
  lo[ax] = start;
  hi[ax] = stop;
  return mx::slice(a, std::move(lo), std::move(hi), s);
}

mx::array attention_long(const mx::array& queries, const mx::array& keys, const mx::array& values, float scale, bool causal,
                         const std::optional<mx::array>& mask_arr, mx::StreamOrDevice s) {
  auto q = mx::multiply(mx::array(scale, mx::float32), queries, s);
  const int n_kv = keys.shape(1), n_repeats = queries.shape(1) / n_kv;
  auto k = keys;
  auto v = values;
  if (n_repeats > 1) {
    q = mx::unflatten(q, 1, {n_kv, n_repeats}, s);
    k = mx::expand_dims(k, 2, s);
    v = mx::expand_dims(v, 2, s);
  }
  const int L = queries.shape(2), S = keys.shape(2), offset = S - L;
  const size_t query_bytes = static_cast<size_t>(queries.shape(0)) * queries.shape(1) * S * sizeof(float);
  const int piece = query_bytes * L <= LONG_SCORES_BYTES
      ? L
      : std::max<int>(MAX_QUERIES, static_cast<int>(LONG_SCORES_BYTES / query_bytes));
  std::vector<mx::array> outs;
  for (int a = 0; a < L; a += piece) {
    const int b = std::min(L, a + piece);
    const bool whole = a == 0 && b == L;
    // with a causal mask, the keys after the piece's last query are masked for all its queries:
    // left out, they no longer add their exact zeros (a BLAS may round a product over fewer rows
    // or keys differently: the same bits with MLX's bundled BLAS and MKL, ~4e-7 with OpenBLAS)
    const int keys_seen = causal ? offset + b : S;
    const auto qp = whole ? q : slice_axis(q, -2, a, b, s);
    const auto kp = keys_seen == S ? k : slice_axis(k, -2, 0, keys_seen, s);
    const auto vp = keys_seen == S ? v : slice_axis(v, -2, 0, keys_seen, s);
    auto scores = mx::matmul(qp, mx::swapaxes(kp, -1, -2, s), s);
    if (causal) { // MLX's causal mask and where, inside the softmax (the same bits)
      outs.push_back(mx::matmul(softmax(scores, offset + a, s), vp, s));
      continue;
    }
    if (mask_arr) {
      mx::array mask = *mask_arr;
      if (!whole && mask.ndim() >= 2 && mask.shape(-2) > 1) mask = slice_axis(mask, -2, a, b, s);
      if (n_repeats > 1 && mask.ndim() >= 3) {
        mask = mask.shape(-3) == 1 ? mx::expand_dims(mask, -3, s) : mx::unflatten(mask, -3, {n_kv, n_repeats}, s);
      }
      scores = mask.dtype() == mx::bool_
          ? mx::where(mask, scores, mx::array(std::numeric_limits<float>::lowest(), mx::float32), s)
          : mx::add(scores, mask, s);
    }
    outs.push_back(mx::matmul(softmax(scores, -1, s), vp, s));
  }
  auto out = outs.size() == 1 ? outs[0] : mx::concatenate(std::move(outs), -2, s);
  if (n_repeats > 1) out = mx::flatten(out, 1, 2, s);
  return out;
}

} // namespace

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                    const std::string& mask_mode, const std::optional<mx::array>& mask, mx::StreamOrDevice s) {
  const bool arr = mask_mode == "array" || (mask_mode.empty() && mask.has_value());
  if (!arguments_ok(q, k, v, mask_mode, mask, arr, s)) {
    return mx::fast::scaled_dot_product_attention(q, k, v, scale, mask_mode == "array" ? "" : mask_mode,
                                                  arr ? mask : std::nullopt, std::nullopt, false, s);
  }
  // more queries than the primitive takes (a prefill chunk): MLX's own fallback graph for
  // mx.fast.scaled_dot_product_attention (mlx/fast.cpp), op for op, with its softmax the Softmax
  // primitive (activation.h: the same bits, ~20x faster); a long prompt's queries in pieces
  if (q.shape(2) > MAX_QUERIES) return attention_long(q, k, v, scale, mask_mode == "causal", arr ? mask : std::nullopt, s);
  std::vector<mx::array> inputs = {q, k, v};
  int mode = mask_mode == "causal" ? 1 : 0;
  if (arr) {
    auto shape = q.shape();
    shape.back() = k.shape(2);
    inputs.push_back(mx::broadcast_to(*mask, shape, s));  // a view: zero strides where it broadcasts
    mode = mask->dtype() == mx::bool_ ? 2 : 3;
  }
  return mx::array({q.shape(0), q.shape(1), q.shape(2), v.shape(3)}, mx::float32,
                   std::make_shared<Attention>(mx::to_stream(s), scale, mode), std::move(inputs));
}

bool Attention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Attention&>(other);
  return scale_ == o.scale_ && mask_ == o.mask_;
}

std::vector<mx::Shape> Attention::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[0].shape(0), inputs[0].shape(1), inputs[0].shape(2), inputs[2].shape(3)}};
}

void Attention::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(inputs, out, stream());
  const View4 qv = view4(inputs[0]), kv = view4(inputs[1]), vv = view4(inputs[2]);
  MaskView mv;
  if (mask_ >= 2) {
    const auto& m = inputs[3];
    if (mask_ == 2) mv.b = m.data<uint8_t>();
    else mv.f = m.data<float>();
    for (int i = 0; i < 4; ++i) mv.stride[i] = m.strides()[i];
  }
  const AttnProblem ap{qv, kv, vv, mv, scale_, mask_, out.data<float>()};
  encoder.dispatch([ap]() { run_attention(ap); });
}

void run_attention(const AttnProblem& ap) {
#if defined(__x86_64__) || defined(_M_X64)
  if (!portable_forced() && attention_avx2_ok(ap)) {  // MLXRT_QMV_KERNEL=portable: the portable loop
    const int64_t B = ap.q.shape[0], L = ap.q.shape[2], Hk = ap.k.shape[1], S = ap.k.shape[2];
    const int64_t n = B * Hk * L;
    // each task reads its key head's keys and values once: S·(D + Dv) floats
    const size_t bytes = static_cast<size_t>(n) * S * (ap.q.shape[3] + ap.v.shape[3]) * sizeof(float);
    // a lone query (one sequence's decode step) keeps one CPU free, as a lone row's products
    // do, until its keys are many (LONE_ATTENTION_BYTES): then the step is the attention's
    parallel_for(static_cast<int>(n), bytes, [&](int t0, int t1) {
      for (int64_t t = t0; t < t1; ++t) attention_group_avx2(ap, t);
    }, B * L == 1 && bytes < LONE_ATTENTION_BYTES);
    return;
  }
#endif
  // the portable loop: one query head's row at a time
  const View4 &qv = ap.q, &kv = ap.k, &vv = ap.v;
  const MaskView& mv = ap.mask;
  float* const op = ap.out;
  const float scale = ap.scale;
  const int mode = ap.mode;
  const int64_t B = qv.shape[0], Hq = qv.shape[1], L = qv.shape[2], D = qv.shape[3];
  const int64_t Hk = kv.shape[1], S = kv.shape[2], Dv = vv.shape[3];
  const int64_t groups = Hq / Hk;
  const float lowest = std::numeric_limits<float>::lowest(); // MLX's where(mask, s, finfo.min)
  const int64_t n = B * Hq * L;
  // work per query row: S·(D + Dv) multiply-adds; spread rows over the pool when it pays
  const size_t bytes = static_cast<size_t>(n) * S * (D + Dv) * sizeof(float);
  parallel_for(static_cast<int>(n), bytes, [&](int r0, int r1) {
    thread_local std::vector<float> qs, sc, acc; // each thread's own, kept between calls
    qs.resize(D);
    sc.resize(S);
    acc.resize(Dv);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / (Hq * L), h = (r / L) % Hq, l = r % L;
      const int64_t hk = h / groups;
      const float* qr = qv.data + b * qv.stride[0] + h * qv.stride[1] + l * qv.stride[2];
      for (int64_t d = 0; d < D; ++d) qs[d] = qr[d * qv.stride[3]] * scale;
      const float* kb = kv.data + b * kv.stride[0] + hk * kv.stride[1];
      const float* vb = vv.data + b * vv.stride[0] + hk * vv.stride[1];
      // keys this query may see: all, or with "causal" those up to its own position (queries
      // are the last L of the S positions)
      const int64_t visible = mode == 1 ? S - L + l + 1 : S;
      float mx_ = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < visible; ++s) {
        float v = dot(qs.data(), kb + s * kv.stride[2], static_cast<int>(D), kv.stride[3]);
        if (mode == 2) {
          const uint8_t keep = mv.b[b * mv.stride[0] + h * mv.stride[1] + l * mv.stride[2] + s * mv.stride[3]];
          if (!keep) v = lowest;
        } else if (mode == 3) {
          v += mv.f[b * mv.stride[0] + h * mv.stride[1] + l * mv.stride[2] + s * mv.stride[3]];
        }
        sc[s] = v;
        mx_ = std::max(mx_, v);
      }
      float total = 0.f;
      for (int64_t s = 0; s < visible; ++s) {
        sc[s] = std::exp(sc[s] - mx_);
        total += sc[s];
      }
      const float inv = 1.0f / total;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t s = 0; s < visible; ++s) axpy(acc.data(), sc[s] * inv, vb + s * vv.stride[2], static_cast<int>(Dv), vv.stride[3]);
      std::memcpy(op + r * Dv, acc.data(), Dv * sizeof(float));
    }
  }, B * L == 1);
}

} // namespace mlxrt_qmv
