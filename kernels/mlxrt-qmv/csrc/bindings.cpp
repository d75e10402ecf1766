// The Python module mlxrt_qmv._ext. It shares nanobind's "mlx" domain with mlx.core, so it
// takes and returns mx.array objects as they are.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "mlx/version.h"
#include "activation.h"
#include "decode_attention.h"
#include "sort.h"
#include "fused.h"
#include "bands.h"
#include "qmv.h"

#define MLXRT_QMV_STR2(x) #x
#define MLXRT_QMV_STR(x) MLXRT_QMV_STR2(x)

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_ext, m) {
  m.doc() = "A quantized matrix-vector product for MLX's CPU backend (a custom primitive).";
  m.def(
      "quantized_matmul",
      [](const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases, int group_size,
         int bits, float centre, int band) {
        return mlxrt_qmv::quantized_matmul(x, w, scales, biases, group_size, bits, centre, band);
      },
      "x"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a, "centre"_a = 0.f, "band"_a = 0,
      "x @ dequantize(w, scales, biases).T (mx.quantized_matmul, transpose=True, affine mode); the primitive "
      "for bits 4/8, group sizes 32/64/128 and at most MAX_ROWS rows of x on the CPU, mx.quantized_matmul "
      "otherwise. float32 x with float16 or bfloat16 scales and biases (API 7): a float32 result, the scales "
      "read as stored (not copied to float32 per call). centre > 0 (API 7) promises biases == -centre * scales "
      "exactly (a symmetric block format): a lone row's AVX-512 loops then compute the biases instead of "
      "reading them; the result is the same. band=16 (API 9): w, scales and biases are in bands of 16 rows "
      "(band_rows), for the widths BAND_BITS names; ValueError where this kernel cannot read them so.");
  m.def(
      "band_rows", [](const mx::array& a, int bits) { return mlxrt_qmv::band_rows(a, bits); }, "a"_a, "bits"_a = 0,
      "a (2-D, rows a multiple of 16) in bands of 16 rows, the same shape and dtype: element [t][j][i] of the "
      "result is a[16t + i][j] (scales, biases); bits (3, 4, 5, 6, 8): a is uint32 weights of that width, laid "
      "out value by value as the kernel reads them (bands.h). quantized_matmul(..., band=16) reads weights, "
      "scales and biases so. Where a is not referenced once it is computed, its buffer is rewritten in place.");
  m.attr("BAND_ROWS") = mlxrt_qmv::BAND_ROWS;
  m.attr("BAND_BITS") = nb::tuple(nb::cast(mlxrt_qmv::band_bits()));
  m.def(
      "dequantize",
      [](const mx::array& w, const mx::array& scales, const mx::array& biases, int group_size, int bits) {
        return mlxrt_qmv::dequantize(w, scales, biases, group_size, bits);
      },
      "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a,
      "mx.dequantize(w, scales, biases, group_size, bits) in affine mode, at memory speed on the CPU.");
  m.def(
      "supported",
      [](const mx::array& x, const mx::array& w, int group_size, int bits) {
        return mlxrt_qmv::supported(x, w, group_size, bits);
      },
      "x"_a, "w"_a, "group_size"_a, "bits"_a, "Whether quantized_matmul runs the primitive for these arguments.");
  m.def(
      "softmax", [](const mx::array& x, int causal_start) { return mlxrt_qmv::softmax(x, causal_start); }, "x"_a,
      "causal_start"_a = -1,
      "mx.softmax(x, axis=-1) with MLX's float32 results bit for bit: one primitive for float32 x on the CPU "
      "(exponentials eight at a time where the CPU has AVX2/FMA), mx.softmax otherwise. causal_start >= 0: x's "
      "last two axes are (queries, keys) and query i sees keys up to causal_start + i, as mx.softmax of "
      "where(that causal mask, x, finfo.min).");
  m.def(
      "argmax", [](const mx::array& x) { return mlxrt_qmv::argmax(x); }, "x"_a,
      "mx.argmax(x, axis=-1) with MLX's result (the first NaN of a row, else the first place of its maximum; "
      "uint32): one primitive for float32 x on the CPU (eight at a time where the CPU has AVX2), mx.argmax "
      "otherwise (API 9).");
  m.def(
      "exp", [](const mx::array& x) { return mlxrt_qmv::exp(x); }, "x"_a,
      "mx.exp(x) with MLX's float32 results bit for bit: one primitive for float32 x on the CPU (eight at a time "
      "where the CPU has AVX2/FMA), mx.exp otherwise.");
  m.def(
      "sort", [](const mx::array& x) { return mlxrt_qmv::sort(x); }, "x"_a,
      "mx.sort(x, axis=-1) with MLX's results: one primitive for float32 x on the CPU (a stable radix sort: "
      "ascending, NaNs last, equal values in their order), mx.sort otherwise.");
  m.def(
      "log_softmax", [](const mx::array& x) { return mlxrt_qmv::log_softmax(x); }, "x"_a,
      "x - mx.logsumexp(x, axis=-1, keepdims=True) with MLX's float32 results bit for bit: one primitive for "
      "float32 x on the CPU (exponentials eight at a time where the CPU has AVX2/FMA), MLX's ops otherwise.");
  m.def(
      "swiglu", [](const mx::array& gate, const mx::array& x) { return mlxrt_qmv::swiglu(gate, x); }, "gate"_a, "x"_a,
      "nn.silu(gate) * x (mlx-lm's swiglu), the same float32 bits: one primitive for float32 operands of one "
      "shape on the CPU, MLX's ops otherwise.");
  m.def(
      "geglu", [](const mx::array& gate, const mx::array& up) { return mlxrt_qmv::geglu(gate, up); }, "gate"_a,
      "up"_a,
      "nn.gelu_approx(gate) * up (Gemma's MLP activation): one primitive for float32 operands of one shape on the "
      "CPU (API 8), within a stated bound of MLX's float32 (not its bits: docs/performance.md, \"A vectorized "
      "GELU\"), each element's bits the same wherever it lies; MLX's ops otherwise.");
  m.def(
      "rms_norm",
      [](const mx::array& x, const std::optional<mx::array>& weight, float eps) {
        return mlxrt_qmv::rms_norm(x, weight, eps);
      },
      "x"_a, "weight"_a.none(), "eps"_a,
      "mx.fast.rms_norm(x, weight, eps): one primitive for float32 on the CPU, mx.fast.rms_norm otherwise.");
  m.def(
      "rope",
      [](const mx::array& x, int dims, bool traditional, float base, float scale,
         const std::variant<int, mx::array>& offset) {
        const mx::array off = std::holds_alternative<int>(offset) ? mx::array(std::get<int>(offset), mx::int32)
                                                                  : std::get<mx::array>(offset);
        return mlxrt_qmv::rope(x, dims, traditional, base, scale, off);
      },
      "x"_a, "dims"_a, "traditional"_a, "base"_a, "scale"_a, "offset"_a,
      "mx.fast.rope(x, dims, traditional=, base=, scale=, offset=) with the default frequencies: one primitive "
      "for float32 x of 3 or 4 dimensions on the CPU, mx.fast.rope otherwise.");
  m.def(
      "attention",
      [](const mx::array& q, const mx::array& k, const mx::array& v, float scale,
         const std::variant<std::monostate, std::string, mx::array>& mask) {
        std::string mode;
        std::optional<mx::array> arr;
        if (std::holds_alternative<std::string>(mask)) mode = std::get<std::string>(mask);
        if (std::holds_alternative<mx::array>(mask)) {
          mode = "array";
          arr = std::get<mx::array>(mask);
        }
        return mlxrt_qmv::attention(q, k, v, scale, mode, arr);
      },
      "q"_a, "k"_a, "v"_a, "scale"_a, "mask"_a.none() = nb::none(),
      "mx.fast.scaled_dot_product_attention(q, k, v, scale=, mask=) without sinks: one primitive for float32 "
      "and at most MAX_QUERIES query positions on the CPU, MLX's own otherwise.");
  m.def(
      "attention_supported",
      [](const mx::array& q, const mx::array& k, const mx::array& v) { return mlxrt_qmv::attention_supported(q, k, v); },
      "q"_a, "k"_a, "v"_a, "Whether attention runs the primitive for these arguments (masks aside).");
  m.def(
      "decode_attention",
      [](const mx::array& q, const mx::array& k, const mx::array& v, mx::array& k_cache, mx::array& v_cache,
         int offset, float scale, int dims, bool traditional, float base, float rope_scale, std::optional<int> row,
         std::optional<int> length) {
        auto outs = mlxrt_qmv::decode_attention(q, k, v, k_cache, v_cache, offset, row.value_or(offset),
                                                length.value_or(offset + 1), scale, dims, traditional, base,
                                                rope_scale);
        // the caches updated as `k_cache[..., offset, :] = ...` updates an array (mlx's __setitem__)
        k_cache.overwrite_descriptor(outs[1]);
        v_cache.overwrite_descriptor(outs[2]);
        return outs[0];
      },
      "q"_a, "k"_a, "v"_a, "k_cache"_a, "v_cache"_a, "offset"_a, "scale"_a, "dims"_a, "traditional"_a, "base"_a,
      "rope_scale"_a, "row"_a.none() = nb::none(), "length"_a.none() = nb::none(),
      "One token's attention step over mlx-lm's KVCache or RotatingKVCache buffers in three primitives (float32, "
      "CPU, batch 1): rotates q (Hq*D values) and k (Hk*D) at position offset as rope(x, dims, traditional, base, "
      "rope_scale, offset) does, writes k and v (Hk*Dv) into row `row` (default offset; API 8) of k_cache (1, Hk, "
      "S, D) and v_cache (1, Hk, S, Dv) (those arrays are updated in place, as item assignment updates an array), "
      "and returns attention(q, k_cache[:, :, :length], v_cache[:, :, :length], scale) as (1, 1, Hq*Dv), length "
      "defaulting to offset + 1 (API 8): those primitives' bits. ValueError for other arguments "
      "(decode_attention_supported).");
  m.def(
      "decode_attention_supported",
      [](const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& k_cache,
         const mx::array& v_cache, int offset, int dims, std::optional<int> row, std::optional<int> length) {
        return mlxrt_qmv::decode_attention_supported(q, k, v, k_cache, v_cache, offset, row.value_or(offset),
                                                     length.value_or(offset + 1), dims);
      },
      "q"_a, "k"_a, "v"_a, "k_cache"_a, "v_cache"_a, "offset"_a, "dims"_a, "row"_a.none() = nb::none(),
      "length"_a.none() = nb::none(),
      "Whether decode_attention takes these arguments.");
  m.attr("MAX_QUERIES") = mlxrt_qmv::MAX_QUERIES;
  m.def("kernel_name", &mlxrt_qmv::kernel_name,
        "The kernel this process runs: 'avx512 vnni', 'avx2 int8' or 'portable int8' (x in 8 bits, the default for "
        "the CPU), 'avx2 q15' or 'generic' (MLXRT_QMV_EXACT=1), or on request (MLXRT_QMV_KERNEL) 'avx2+fma'.");
  m.def("threads", &mlxrt_qmv::threads, "Threads the primitive splits output rows over.");
  m.def("set_threads", &mlxrt_qmv::set_threads, "n"_a, "Set the thread count for later calls (<= 0: the default).");
  // The kernel's row limit: read at import, after which the kernel (chosen from the environment
  // once) no longer changes.
  m.attr("MAX_ROWS") = mlxrt_qmv::max_rows();
  m.attr("BITS") = nb::tuple(nb::cast(mlxrt_qmv::bits_supported()));
  m.attr("FAST_BITS") = nb::tuple(nb::cast(mlxrt_qmv::fast_bits()));
  // The MLX whose headers this was built with: its C++ ABI is the only one it may load into.
  // The interface mlxrt requires (runtime/engine/qmv.py's API), one integer: raised whenever a
  // function, attribute or behaviour mlxrt relies on is added, removed or changed, so that mlxrt
  // checks one number instead of probing for names, and refuses a stale build with a message
  // that says to rebuild it (./scripts/setup).
  m.attr("API") = 9;
  m.attr("MLX_VERSION") =
      MLXRT_QMV_STR(MLX_VERSION_MAJOR) "." MLXRT_QMV_STR(MLX_VERSION_MINOR) "." MLXRT_QMV_STR(MLX_VERSION_PATCH);
}
