// The MlxrtQuantizedMatvec primitive: its op, its CPU evaluation (x laid out once, output rows
// split over a small pool of threads) and the choice of kernel for this CPU.
#include "qmv.h"

#include "bands.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels.h"
#include "mlx/backend/common/utils.h"

namespace mlxrt_qmv {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::atoi(v);
}

int default_threads() {
  int n = env_int("MLXRT_QMV_THREADS", 0);
  if (n > 0) return n;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, n);
}

// Workers that wait for a job, spin a little after each one (MLXRT_QMV_SPIN_US, default 100 µs:
// a decode step's products come tens of µs apart, and a sleeping thread takes about as long to
// wake), then sleep on a condition variable. A job shares its work out itself (an atomic row
// counter) and the caller works too, so the caller never waits for a worker that has not been
// scheduled yet (on a loaded machine it may not run for milliseconds): once the caller finds no
// work left it closes the job and waits only for the workers inside it; a worker that arrives
// later sees it closed and leaves.
class Pool {
 public:
  explicit Pool(int n) : spin_us_(env_int("MLXRT_QMV_SPIN_US", 100)) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const {
    return static_cast<int>(workers_.size()) + 1;
  }
  void run(const std::function<void(int)>& job) {
    // One job at a time: a second caller (another model's engine thread) works alone.
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (workers_.empty() || !busy.owns_lock()) {
      job(0);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &job;
      closed_.store(false);
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    job(0);
    closed_.store(true); // seq_cst with inside_: a worker either is counted or sees it closed
    int spins = 0;
    while (inside_.load() != 0) {
      if (++spins < 4096)
        cpu_relax();
      else
        std::this_thread::yield();
    }
  }

 private:
  void loop(int id) {
    uint64_t seen = 0; // the generation at construction: a job posted before this thread ran is still new
    for (;;) {
      uint64_t g = gen_.load();
      if (g == seen && spin_us_ > 0) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
        while ((g = gen_.load()) == seen) {
          for (int i = 0; i < 32; ++i) cpu_relax();
          if (std::chrono::steady_clock::now() > until) break;
        }
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_.load() != seen; });
        g = gen_.load();
      }
      seen = g;
      if (stop_) return;
      inside_.fetch_add(1);
      if (!closed_.load() && gen_.load() == g) (*job_)(id);
      inside_.fetch_sub(1);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> inside_{0};
  std::atomic<bool> closed_{true};
  const std::function<void(int)>* job_ = nullptr;
  bool stop_ = false;
  int spin_us_;
};

std::mutex pool_mu;
std::shared_ptr<Pool> the_pool;
std::atomic<int> wanted_threads{0};

std::shared_ptr<Pool> pool() {
  std::lock_guard<std::mutex> lk(pool_mu);
  int n = wanted_threads.load();
  if (n <= 0) {
    n = default_threads();
    wanted_threads.store(n);
  }
  if (!the_pool || the_pool->size() != n) {
    the_pool.reset();
    the_pool = std::make_shared<Pool>(n);
  }
  return the_pool;
}

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  const std::string s = v;
  return s == "1" || s == "on" || s == "true" || s == "yes";
}

// The kernel. By default x goes in 8 bits per block of 32 and meets the weights in integer
// multiply-adds (as llama.cpp's Q8 activations): AVX-512 VNNI loops where the CPU has AVX-512
// F/BW/VL/VNNI, AVX2 ones where it has AVX2/FMA/F16C, portable ones elsewhere. MLXRT_QMV_EXACT=1
// keeps x near exact instead: 15 bits on AVX2 ("avx2 q15", the default before mlxrt-qmv 0.5),
// floats in the portable loops. MLXRT_QMV_KERNEL forces one by name ("portable" for the portable
// loops of either kind, "generic" for the portable float ones; an unknown name or one the CPU
// cannot run gets the default). docs/performance.md has their errors.
const Kernel& kernel() {
  static const Kernel k = [] {
    const char* forced = std::getenv("MLXRT_QMV_KERNEL");
    const std::string want = forced != nullptr ? forced : "";
    const bool exact = env_on("MLXRT_QMV_EXACT");
    const Kernel generic{"generic", rows_generic, 0, dequant_generic};
    Kernel portable{"portable int8", rows_generic_int8, 0, dequant_generic, true};
    portable.int8_layout = 0;
    if (want == "generic" || (want == "portable" && exact)) return generic;
    if (want == "portable" || want == "portable int8") return portable;
#if defined(__x86_64__) || defined(_M_X64)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      if (want == "avx2+fma") return Kernel{"avx2+fma", rows_avx2, 8, dequant_avx2};
      if (want == "avx2 q15") return Kernel{"avx2 q15", rows_avx2_q15, 0, dequant_avx2, true, quantize_x_avx2, true};
      const Kernel avx2_int8{"avx2 int8", rows_avx2_q8, 0, dequant_avx2, true, quantize_x_avx2};
      if (want == "avx2 int8") return avx2_int8;
      if (exact) return Kernel{"avx2 q15", rows_avx2_q15, 0, dequant_avx2, true, quantize_x_avx2, true};
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        Kernel vnni{"avx512 vnni", rows_avx512_vnni, 0, dequant_avx2, true};
        vnni.int8_layout = 4;
        vnni.x_pad = 128;
        vnni.quantize_int8 = quantize_x_int8_avx512;
        return vnni;
      }
      return avx2_int8;
    }
#endif
    return exact ? generic : portable;
  }();
  return k;
}

// Below this many weight bytes one thread does the whole product: waking others costs more.
constexpr size_t SINGLE_THREAD_BYTES = 64 * 1024;

// Runs fn over the output rows of p, on the pool's threads when the weights are big enough.
// The threads a product may use: all of the pool's, except for a lone row of x (a decode step
// of one sequence), which leaves one CPU to the threads that run beside the kernel — MLX's stream
// thread between products and the Python thread building the next step. On 2 CPUs a SmolLM2
// decode step took 14.5-15.3 ms with both threads in the products against 13.2 ms with one,
// while a batch of 8 rows took 36 ms with both against 55-61 ms with one (quiet machine).
// MLXRT_QMV_LONE_THREADS sets the threads a lone row uses (default: one fewer than the pool).
// A lone row's product of at least MLXRT_QMV_LONE_SPLIT_MB megabytes of weights (default 64: a
// tied output head of a large vocabulary, Gemma 3's 262K rows, 160 MB) takes every thread of the
// pool even so: one product that long amortizes the worker's wake-up, and the Python thread beside
// it has time to spare. Gemma 3 270M's bare decode loop 14.02 -> 13.26 ms a token; SmolLM2's 28 MB
// head on both threads was slower (5.61 -> 5.70 ms), so smaller products keep one thread.
int threads_for(const std::shared_ptr<Pool>& pl, bool lone, size_t bytes = 0) {
  const int n = pl ? pl->size() : 1;
  if (!lone || n <= 1) return n;
  static const size_t split = static_cast<size_t>(env_int("MLXRT_QMV_LONE_SPLIT_MB", 64)) << 20;
  if (split > 0 && bytes >= split) return n;
  static const int lone_threads = env_int("MLXRT_QMV_LONE_THREADS", 0);
  return lone_threads > 0 ? std::min(n, lone_threads) : n - 1;
}

// Runs job on `threads` of the pool's threads (the caller's included); the others skip it.
void run_on(const std::shared_ptr<Pool>& pl, int threads, const std::function<void(int)>& job) {
  if (threads <= 1) {
    job(0);
    return;
  }
  if (threads >= pl->size()) {
    pl->run(job);
    return;
  }
  std::function<void(int)> some = [&](int id) {
    if (id < threads) job(id);
  };
  pl->run(some);
}

// Runs fn over [0, n) in chunks of `chunk` that `threads` of the pool's threads take in turn
// (an atomic counter); on the calling thread alone when threads <= 1.
void run_chunks(const std::shared_ptr<Pool>& pl, int threads, int n, int chunk, const std::function<void(int, int)>& fn) {
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::atomic<int> next{0};
  std::function<void(int)> job = [&](int) {
    for (;;) {
      const int r0 = next.fetch_add(chunk, std::memory_order_relaxed);
      if (r0 >= n) return;
      fn(r0, std::min(n, r0 + chunk));
    }
  };
  run_on(pl, threads, job);
}

void split_rows(RowsFn fn, const Problem& p) {
  const int N = p.N;
  const size_t wbytes = static_cast<size_t>(N) * p.K * p.bits / 8;
  auto pl = wbytes >= SINGLE_THREAD_BYTES ? pool() : nullptr;
  const int threads = threads_for(pl, p.M == 1, wbytes);
  int chunk = std::max(1, std::min(64, N / (threads * 8)));
  if (p.band > 0) chunk = std::max(p.band, chunk / p.band * p.band); // whole bands
  run_chunks(pl, threads, N, chunk, [&](int r0, int r1) { fn(p, r0, r1); });
}

} // namespace

bool portable_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("MLXRT_QMV_KERNEL");
    const std::string want = v != nullptr ? v : "";
    return want == "portable" || want == "portable int8" || want == "generic";
  }();
  return forced;
}

void parallel_for(int n, size_t work_bytes, const std::function<void(int, int)>& fn, bool lone) {
  auto pl = work_bytes >= SINGLE_THREAD_BYTES && n > 1 ? pool() : nullptr;
  const int threads = threads_for(pl, lone);
  run_chunks(pl, threads, n, std::max(1, n / (threads * 4)), fn);
}

namespace {

template <typename T>
void run_dequant(const uint32_t* w, const T* scales, const T* biases, T* out, int N, int K, int group_size, int bits) {
  thread_local std::vector<float> buf;
  float* outf = reinterpret_cast<float*>(out);
  if constexpr (!std::is_same_v<T, float>) {
    buf.resize(static_cast<size_t>(N) * K);
    outf = buf.data();
  }
  ScaleType st = ScaleType::f32;
  if constexpr (std::is_same_v<T, mx::float16_t>) st = ScaleType::f16;
  if constexpr (std::is_same_v<T, mx::bfloat16_t>) st = ScaleType::bf16;
  Problem p{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, w, scales, biases, st, 0, N, K, K / group_size, group_size,
            bits, outf};
  split_rows(kernel().dequant, p);
  if constexpr (!std::is_same_v<T, float>) {
    for (size_t i = 0; i < static_cast<size_t>(N) * K; ++i) out[i] = static_cast<T>(outf[i]);
  }
}

// T: x's and the output's type; S: the scales' and biases' (T, or float16/bfloat16 beside float32
// x: a model whose scales are exact in 16 bits reads half the bytes for them, the same values).
template <typename T, typename S>
void run_typed(
    const T* x,
    const mx::Shape& xshape,
    const mx::Strides& xstrides,
    bool x_contiguous,
    const uint32_t* w,
    const S* scales,
    const S* biases,
    T* out,
    int M,
    int N,
    int K,
    int group_size,
    int bits,
    float centre,
    int band) {
  const Kernel& kern = kernel();
  const int G = K / group_size;
  const size_t MK = static_cast<size_t>(M) * K, MG = static_cast<size_t>(M) * G;
  // x as float32, then in the kernel's form: floats in its layout (xp), or int8 with block
  // scales and offsets (xq, xd, xoff); and its per-group sums (for the biases).
  thread_local std::vector<float> buf;
  thread_local std::vector<int8_t> qbuf;
  const size_t outsize = std::is_same_v<T, float> ? 0 : static_cast<size_t>(M) * N;
  // xp, x laid out for a float kernel, only where one runs: a long prefill's x is large
  const size_t xpsize = kern.int8_x ? 0 : MK;
  buf.resize(MK + xpsize + MG * 2 + MK / 32 + outsize);
  float* xf = buf.data();
  float* xp = xf + MK;
  float* xsum = xp + xpsize;
  float* xoff = xsum + MG;
  float* xd = xoff + MG;
  float* outf = std::is_same_v<T, float> ? reinterpret_cast<float*>(out) : xd + MK / 32;
  if (x_contiguous) {
    for (size_t i = 0; i < MK; ++i) xf[i] = static_cast<float>(x[i]);
  } else {
    for (size_t i = 0; i < MK; ++i) xf[i] = static_cast<float>(x[mx::elem_to_loc(static_cast<int64_t>(i), xshape, xstrides)]);
  }
  // the int8 kernels' rows of x, padded to their chunks
  const int xstride = kern.int8_layout >= 0 ? (K + kern.x_pad - 1) / kern.x_pad * kern.x_pad : K;
  if (kern.int8_x) qbuf.resize(kern.q15 ? 2 * MK : static_cast<size_t>(M) * xstride); // 8-bit Q15: MK int16 (x16)
  int16_t* x16 = kern.q15 && bits == 8 ? reinterpret_cast<int16_t*>(qbuf.data()) : nullptr;
  for (int m = 0; m < M; ++m) {
    const float* xr = xf + static_cast<size_t>(m) * K;
    if (kern.int8_layout >= 0) {
      (kern.quantize_int8 != nullptr ? kern.quantize_int8 : quantize_x_int8)(xr, K, group_size, band ? 8 : bits, kern.int8_layout, xstride, qbuf.data() + static_cast<size_t>(m) * xstride,
                      xd + static_cast<size_t>(m) * K / 32, xsum + static_cast<size_t>(m) * G,
                      xoff + static_cast<size_t>(m) * G);
      continue;
    }
    if (kern.int8_x) {
      kern.quantize(xr, K, group_size, bits, qbuf.data() + static_cast<size_t>(m) * K,
                    kern.q15 && bits == 4 ? qbuf.data() + MK + static_cast<size_t>(m) * K : nullptr,
                    kern.q15 && bits == 8 ? x16 + static_cast<size_t>(m) * K : nullptr, xd + static_cast<size_t>(m) * K / 32,
                 xsum + static_cast<size_t>(m) * G, xoff + static_cast<size_t>(m) * G);
      continue;
    }
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
      for (int e = 0; e < group_size; ++e) s += xr[g * group_size + e];
      xsum[static_cast<size_t>(m) * G + g] = s;
    }
    permute_x(xr, xp + static_cast<size_t>(m) * K, K, bits == 4 ? kern.x_width : 0);
  }
  ScaleType st = ScaleType::f32;
  if constexpr (std::is_same_v<S, mx::float16_t>) st = ScaleType::f16;
  if constexpr (std::is_same_v<S, mx::bfloat16_t>) st = ScaleType::bf16;
  Problem p{xp, xsum, kern.int8_x ? qbuf.data() : nullptr, kern.q15 ? qbuf.data() + MK : nullptr, x16, xd, xoff, xstride, w, scales, biases, st, M, N, K, G,
            group_size, bits, outf, centre, band};

  split_rows(kern.rows, p);
  if constexpr (!std::is_same_v<T, float>) {
    for (size_t i = 0; i < static_cast<size_t>(M) * N; ++i) out[i] = static_cast<T>(outf[i]);
  }
}

// Checks that the last three inputs (weights, scales, biases) are row contiguous, as the kernels
// read them, allocates the output and registers the arrays with the stream's encoder.
mx::cpu::CommandEncoder& start_eval(const char* name, const std::vector<mx::array>& inputs, mx::array& out,
                                    mx::Stream stream) {
  for (size_t i = inputs.size() - 3; i < inputs.size(); ++i) {
    if (!inputs[i].flags().row_contiguous)
      throw std::runtime_error(std::string("[") + name + "] the weights, scales and biases must be row contiguous");
  }
  return begin_eval(inputs, out, stream);
}

int rows_of(const mx::array& x) {
  return x.ndim() == 0 ? 0 : static_cast<int>(x.size() / x.shape(-1));
}

} // namespace

std::vector<int> bits_supported() {
  // The portable 8-bit loops also unpack 3-, 5- and 6-bit layers (a K-quant conversion's; 2 bits
  // measured no faster than MLX's own op for one row); the AVX2 ones take 4 and 8 bits only.
  if (kernel().int8_layout >= 0) return {3, 4, 5, 6, 8};
  return {4, 8};
}

std::vector<int> fast_bits() {
#if defined(__x86_64__) || defined(_M_X64)
  if (kernel().rows == rows_avx512_vnni && packed_lone_rows_avx512()) return {3, 4, 5, 6, 8};
#endif
  return {4, 8};
}

std::vector<int> band_bits() {
#if defined(__x86_64__) || defined(_M_X64)
  if (kernel().rows == rows_avx512_vnni) return packed_lone_rows_avx512() ? std::vector<int>{3, 4, 5, 6, 8} : std::vector<int>{4, 8};
#endif
  return {};
}

int max_rows() {
  // The 8-bit kernels give each row its own bits whatever the rows beside it, so a prefill of any
  // length runs them (and newcomers' prefills can run as one product); the others stop at
  // MAX_ROWS, past which dequantize + BLAS was faster for them.
  const Kernel& k = kernel();
  return k.int8_layout >= 0 || (k.int8_x && !k.q15) ? MAX_ROWS_INT8 : MAX_ROWS;
}

std::string kernel_name() {
  return kernel().name;
}

int threads() {
  return pool()->size();
}

void set_threads(int n) {
  wanted_threads.store(n > 0 ? n : default_threads());
}

bool supported(const mx::array& x, const mx::array& w, int group_size, int bits, mx::StreamOrDevice s) {
  const auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) return false;
  if (bits != 4 && bits != 8 && !(kernel().int8_layout >= 0 && (bits == 3 || bits == 5 || bits == 6))) return false;
  if (group_size != 32 && group_size != 64 && group_size != 128) return false;
  if (w.ndim() != 2 || w.dtype() != mx::uint32 || x.ndim() < 1) return false;
  const int rows = rows_of(x);
  return rows >= 1 && rows <= max_rows() && x.shape(-1) == w.shape(1) * 32 / bits;
}

mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    float centre,
    int band,
    mx::StreamOrDevice s) {
  const bool ok = supported(x, w, group_size, bits, s) && scales.ndim() == 2 && biases.shape() == scales.shape() &&
      scales.shape(0) == w.shape(0) && scales.shape(1) * group_size == x.shape(-1);
  const auto dtype = mx::promote_types(x.dtype(), scales.dtype());
  const bool typed = dtype == mx::float32 || dtype == mx::float16 || dtype == mx::bfloat16;
  if (band != 0) { // no other op reads weights in bands: refuse rather than compute another product
    const auto widths = band_bits();
    if (band != BAND_ROWS || std::find(widths.begin(), widths.end(), bits) == widths.end())
      throw std::invalid_argument("[quantized_matmul] this kernel (" + kernel_name() + ") reads no " +
                                  std::to_string(bits) + "-bit weights in bands of " + std::to_string(band) + " rows");
    if (!ok || !typed || w.shape(0) % BAND_ROWS != 0)
      throw std::invalid_argument("[quantized_matmul] weights in bands: a CPU product of at most MAX_ROWS rows of "
                                  "float x, whose output rows are a multiple of 16");
  }
  if (!ok || !typed) return mx::quantized_matmul(x, w, scales, biases, true, group_size, bits, "affine", s);
  auto out_shape = x.shape();
  out_shape.back() = w.shape(0);
  // float32 x with 16-bit scales and biases: the kernels read those as stored (converted to
  // float32 per row, exactly), so no float32 copy of them is made per call.
  const bool half_scales = dtype == mx::float32 && biases.dtype() == scales.dtype() &&
      (scales.dtype() == mx::float16 || scales.dtype() == mx::bfloat16);
  const auto sdtype = half_scales ? scales.dtype() : dtype;
  return mx::array(
      std::move(out_shape),
      dtype,
      std::make_shared<QuantizedMatvec>(mx::to_stream(s), group_size, bits, centre > 0.f ? centre : 0.f, band),
      {mx::astype(x, dtype, s), w, mx::astype(scales, sdtype, s), mx::astype(biases, sdtype, s)});
}

mx::array dequantize(const mx::array& w, const mx::array& scales, const mx::array& biases, int group_size, int bits,
                     mx::StreamOrDevice s) {
  const auto stream = mx::to_stream(s);
  const bool ok = stream.device == mx::Device::cpu && (bits == 4 || bits == 8) &&
      (group_size == 32 || group_size == 64 || group_size == 128) && w.ndim() == 2 && w.dtype() == mx::uint32 &&
      scales.ndim() == 2 && biases.shape() == scales.shape() && scales.shape(0) == w.shape(0) &&
      scales.shape(1) * group_size == w.shape(1) * 32 / bits && biases.dtype() == scales.dtype() &&
      (scales.dtype() == mx::float32 || scales.dtype() == mx::float16 || scales.dtype() == mx::bfloat16);
  if (!ok) return mx::dequantize(w, scales, biases, group_size, bits, "affine", std::nullopt, std::nullopt, s);
  return mx::array(
      {w.shape(0), w.shape(1) * 32 / bits},
      scales.dtype(),
      std::make_shared<Dequantize>(stream, group_size, bits),
      {w, scales, biases});
}

std::vector<mx::Shape> Dequantize::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[0].shape(0), inputs[0].shape(1) * 32 / bits_}};
}

void Dequantize::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& w = inputs[0];
  const auto& scales = inputs[1];
  const auto& biases = inputs[2];
  auto& out = outputs[0];
  auto& encoder = start_eval(name(), inputs, out, stream());
  const int N = out.shape(0), K = out.shape(1), gs = group_size_, bits = bits_;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    encoder.dispatch([wp = w.data<uint32_t>(), sp = scales.data<T>(), bp = biases.data<T>(), op = out.data<T>(), N, K,
                      gs, bits]() { run_dequant<T>(wp, sp, bp, op, N, K, gs, bits); });
  };
  if (out.dtype() == mx::float32) return launch(float{});
  if (out.dtype() == mx::float16) return launch(mx::float16_t{});
  return launch(mx::bfloat16_t{});
}

std::vector<mx::Shape> QuantizedMatvec::output_shapes(const std::vector<mx::array>& inputs) {
  auto shape = inputs[0].shape();
  shape.back() = inputs[1].shape(0);
  return {shape};
}

bool QuantizedPrimitive::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QuantizedPrimitive&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_;
}

bool QuantizedMatvec::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QuantizedMatvec&>(other);
  return QuantizedPrimitive::is_equivalent(other) && centre_ == o.centre_ && band_ == o.band_;
}

void CpuPrimitive::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(std::string("[") + name() + "] runs on the CPU only");
}

mx::cpu::CommandEncoder& begin_eval(const std::vector<mx::array>& inputs, mx::array& out, mx::Stream stream) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  return encoder;
}

void QuantizedMatvec::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  const auto& scales = inputs[2];
  const auto& biases = inputs[3];
  auto& out = outputs[0];
  auto& encoder = start_eval(name(), inputs, out, stream());
  const int K = x.shape(-1);
  const int M = static_cast<int>(x.size() / K);
  const int N = w.shape(0);
  const bool xc = x.flags().row_contiguous;
  const int gs = group_size_, bits = bits_;
  auto launch = [&](auto tag, auto stag) {
    using T = decltype(tag);
    using S = decltype(stag);
    encoder.dispatch([xp = x.data<T>(), xshape = x.shape(), xstrides = x.strides(), xc, wp = w.data<uint32_t>(),
                      sp = scales.data<S>(), bp = biases.data<S>(), op = out.data<T>(), M, N, K, gs, bits,
                      centre = centre_, band = band_]() {
      run_typed<T, S>(xp, xshape, xstrides, xc, wp, sp, bp, op, M, N, K, gs, bits, centre, band);
    });
  };
  if (out.dtype() == mx::float32 && scales.dtype() == mx::float16) return launch(float{}, mx::float16_t{});
  if (out.dtype() == mx::float32 && scales.dtype() == mx::bfloat16) return launch(float{}, mx::bfloat16_t{});
  if (scales.dtype() != out.dtype() || biases.dtype() != out.dtype())
    throw std::runtime_error("[MlxrtQuantizedMatvec] scales and biases of the output's type, or 16-bit beside float32");
  if (out.dtype() == mx::float32) return launch(float{}, float{});
  if (out.dtype() == mx::float16) return launch(mx::float16_t{}, mx::float16_t{});
  if (out.dtype() == mx::bfloat16) return launch(mx::bfloat16_t{}, mx::bfloat16_t{});
  throw std::runtime_error("[MlxrtQuantizedMatvec] floating point inputs only");
}

} // namespace mlxrt_qmv
