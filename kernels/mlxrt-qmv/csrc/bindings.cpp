// The Python module mlxrt_qmv._ext. It shares nanobind's "mlx" domain with mlx.core, so it
// takes and returns mx.array objects as they are.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "mlx/version.h"
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
         int bits) { return mlxrt_qmv::quantized_matmul(x, w, scales, biases, group_size, bits); },
      "x"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a,
      "x @ dequantize(w, scales, biases).T (mx.quantized_matmul, transpose=True, affine mode); the primitive "
      "for bits 4/8, group sizes 32/64/128 and at most MAX_ROWS rows of x on the CPU, mx.quantized_matmul "
      "otherwise.");
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
  m.def("kernel_name", &mlxrt_qmv::kernel_name,
        "The kernel this CPU runs: 'avx2 q15' (the default with AVX2), 'avx2 int8' or 'avx2+fma' (on request, "
        "MLXRT_QMV_KERNEL), or 'generic'.");
  m.def("threads", &mlxrt_qmv::threads, "Threads the primitive splits output rows over.");
  m.def("set_threads", &mlxrt_qmv::set_threads, "n"_a, "Set the thread count for later calls (<= 0: the default).");
  m.attr("MAX_ROWS") = mlxrt_qmv::MAX_ROWS;
  // The MLX whose headers this was built with: its C++ ABI is the only one it may load into.
  m.attr("MLX_VERSION") =
      MLXRT_QMV_STR(MLX_VERSION_MAJOR) "." MLXRT_QMV_STR(MLX_VERSION_MINOR) "." MLXRT_QMV_STR(MLX_VERSION_PATCH);
}
