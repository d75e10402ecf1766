// mlxrt_qmv: a quantized matrix-vector product for MLX's CPU backend, as a custom primitive.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxrt_qmv {

// The most rows of x the primitive takes; quantized_matmul hands larger inputs to MLX. Up to
// ~32 rows it beats dequantize + BLAS (measured: benchmarks/qmv.py --rows).
constexpr int MAX_ROWS = 32;
// The most rows the 8-bit kernels take (a long prompt's prefill of several sequences at once).
constexpr int MAX_ROWS_INT8 = 1 << 16;
// The most rows of x the primitive takes with this process's kernel: MAX_ROWS_INT8 for the 8-bit
// kernels, MAX_ROWS for the others.
int max_rows();
// The weight widths the primitive computes with this process's kernel: 4 and 8, and with the
// AVX-512 and portable 8-bit kernels also 3, 5 and 6 (unpacked to bytes, then the 8-bit loops:
// the products of the same integers in 8-bit words, bit for bit).
std::vector<int> bits_supported();
// The widths whose product for a decode step's rows of x (1 to 7) this process's kernel computes
// at least as fast as for the same integers in 8-bit words, so a conversion may serve them as
// stored rather than widened (API 8): 4 and 8, and where the AVX-512 kernel runs on a CPU with
// VBMI also 3, 5 and 6 (unpacked in registers, kernel_avx512_vnni.cpp's tile_packed; elsewhere
// they are unpacked to a buffer first, ~2.4x the time of the 8-bit product for one row).
std::vector<int> fast_bits();

// x @ dequantize(w, scales, biases).T, as mx::quantized_matmul(x, w, scales, biases,
// transpose=true, group_size, bits) in affine mode computes it. Runs the primitive on the CPU
// for bits 4 or 8, group sizes 32/64/128 and at most MAX_ROWS rows of x; anything else (a GPU
// stream, more rows, other bits) is mx::quantized_matmul itself. centre > 0 promises that
// biases == -centre * scales exactly (Problem::centre); it changes no result. band == 16: w,
// scales and biases are in bands of 16 rows (bands.h: band_rows), for the widths band_bits()
// names; arguments the kernel cannot take so are refused (std::invalid_argument), never handed on.
mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    float centre = 0.f,
    int band = 0,
    mx::StreamOrDevice s = {});

// dequantize(w, scales, biases) as mx::dequantize computes it (affine mode), in the dtype of the
// scales, at memory speed on the CPU (MLX's own CPU dequantize runs at ~0.5 GB/s); other
// arguments go to mx::dequantize. mlxrt multiplies more than MAX_ROWS rows by its result
// through the BLAS.
mx::array dequantize(const mx::array& w, const mx::array& scales, const mx::array& biases, int group_size, int bits,
                     mx::StreamOrDevice s = {});

// Whether quantized_matmul would run the primitive for these arguments (not MLX's own).
bool supported(const mx::array& x, const mx::array& w, int group_size, int bits, mx::StreamOrDevice s = {});

// The kernel this CPU runs ("avx512 vnni", "avx2 int8", "portable int8", or on request "avx2 q15",
// "avx2+fma", "generic"; see kernel() in qmv.cpp).
std::string kernel_name();
// Whether MLXRT_QMV_KERNEL forces the portable loops ("portable", "portable int8", "generic"):
// then the fused and activation primitives run their portable loops too, not their AVX2 ones, so
// that a CPU with AVX2 runs what one without it does (CI runs the kernel's tests so a second time).
bool portable_forced();
// Threads the primitive splits output rows over (MLXRT_QMV_THREADS, default: the CPUs this
// process may run on); set_threads changes it for later calls.
int threads();
void set_threads(int n);

// Runs fn(begin, end) over [0, n) in chunks on the primitive's threads when the work reads at
// least a few tens of KiB (work_bytes), else on the calling thread (the fused primitives use it).
// lone: the work of one sequence's decode step, which leaves one of the threads out (see
// threads_for in qmv.cpp).
void parallel_for(int n, size_t work_bytes, const std::function<void(int, int)>& fn, bool lone = false);

// What every primitive of this package shares: it runs on the CPU only (eval_gpu throws).
class CpuPrimitive : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
};

// A primitive whose one output has its first input's shape: the ops that stand in for an MLX op
// on one array (a norm, the rotary embedding, an activation, softmax, sort).
class SameShapePrimitive : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
};

// One of those with no parameters of its own: any two are equivalent.
class PlainPrimitive : public SameShapePrimitive {
 public:
  using SameShapePrimitive::SameShapePrimitive;
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

// The start of a CPU evaluation: allocates out and registers the inputs and out with the
// stream's command encoder (which keeps them alive until the dispatched work has run).
mx::cpu::CommandEncoder& begin_eval(const std::vector<mx::array>& inputs, mx::array& out, mx::Stream stream);

// What both product primitives share: the quantization they read.
class QuantizedPrimitive : public CpuPrimitive {
 public:
  QuantizedPrimitive(mx::Stream stream, int group_size, int bits)
      : CpuPrimitive(stream), group_size_(group_size), bits_(bits) {}
  bool is_equivalent(const mx::Primitive& other) const override;

 protected:
  int group_size_;
  int bits_;
};

class QuantizedMatvec : public QuantizedPrimitive {
 public:
  QuantizedMatvec(mx::Stream stream, int group_size, int bits, float centre = 0.f, int band = 0)
      : QuantizedPrimitive(stream, group_size, bits), centre_(centre), band_(band) {}
  bool is_equivalent(const mx::Primitive& other) const override;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;
  const char* name() const override {
    return "MlxrtQuantizedMatvec";
  }

 private:
  float centre_; // Problem::centre
  int band_; // Problem::band
};

class Dequantize : public QuantizedPrimitive {
 public:
  using QuantizedPrimitive::QuantizedPrimitive;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;
  const char* name() const override {
    return "MlxrtDequantize";
  }
};

} // namespace mlxrt_qmv
