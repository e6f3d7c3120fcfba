// int4 weights times int8 activations on a CPU's AVX-512 VNNI: nanogpt_perf::int4_vnni_mm, built
// and loaded by int4_vnni.py, which also holds its layout (pack) and its reference in torch ops.
//
// y (M, n_out) = x (M, K) @ w.T, w ~ (q - 8) * scale + zero, q in 0..15, a scale and a zero for
// every output row and group of 32 inputs. Each row of x is quantized here to int8 per group of
// 32 (x ~ d * a, d = max|x| / 127), so that one vpdpbusd multiplies 16 rows by 4 inputs at once:
//   y[n] = sum_g  d_g * scale[n, g] * (sum_{k in g} q[n, k] a[k] - 8 sum_{k in g} a[k])
//               + zero[n, g] * sum_{k in g} x[k].
// PyTorch's own int4 kernel dequantizes every weight to floats first, which on two cores takes
// longer than reading it. Layout, for each block of 16 output rows:
//   codes (N / 16, K / 8, 64) uint8: byte 4 r + j of a block's chunk c holds row r's q at input
//     8 c + j (low nibble) and 8 c + 4 + j (high nibble);
//   scale_zero (N / 16, K / 32, 2, 16) int16: the bits of the block's 16 scales in bfloat16,
//     then of its 16 zeros.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>

namespace {

constexpr int64_t GROUP = 32, ROWS = 16;
// codes fetched this many bytes ahead of their use, the scales and zeros a quarter as far (a
// block's stream of them is a quarter as long): streams the weights ~12% faster on two cores
constexpr int64_t AHEAD = 2048;

// a row of x quantized: a (K) int8, then per group its d and the sums of a and of x
struct Row {
  const int8_t* a;
  const float *d, *a_sum, *x_sum;
};

template <typename T>
void quantize_row(const T* x, int64_t K, int8_t* a, float* d, float* a_sum, float* x_sum) {
  float f[GROUP];
  for (int64_t g = 0; g < K / GROUP; ++g) {
    for (int64_t i = 0; i < GROUP; ++i) f[i] = static_cast<float>(x[g * GROUP + i]);
    __m512 lo = _mm512_loadu_ps(f), hi = _mm512_loadu_ps(f + 16);
    float amax = std::max(_mm512_reduce_max_ps(_mm512_abs_ps(lo)),
                          _mm512_reduce_max_ps(_mm512_abs_ps(hi)));
    __m512 inv = _mm512_set1_ps(amax > 0 ? 127.f / amax : 0.f);
    __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));  // rounded half to even
    __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
    _mm_storeu_si128((__m128i*)(a + g * GROUP), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128((__m128i*)(a + g * GROUP + 16), _mm512_cvtsepi32_epi8(qhi));
    d[g] = amax / 127.f;
    a_sum[g] = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)));
    x_sum[g] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
  }
}

// one block's 16 outputs for one row of x
__m512 block_row(const uint8_t* codes, const uint16_t* scale_zero, const Row& x, int64_t K) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const int32_t* a4 = reinterpret_cast<const int32_t*>(x.a);  // a's inputs four at a time
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < K / GROUP; ++g) {
    __m512i dot = _mm512_setzero_si512();
    for (int64_t c = 0; c < GROUP / 8; ++c) {
      _mm_prefetch((const char*)(codes + (g * GROUP / 8 + c) * 64 + AHEAD), _MM_HINT_T0);
      __m512i q = _mm512_loadu_si512(codes + (g * GROUP / 8 + c) * 64);
      __m512i low = _mm512_and_si512(q, nibble);
      __m512i high = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
      dot = _mm512_dpbusd_epi32(dot, low, _mm512_set1_epi32(a4[g * 8 + 2 * c]));
      dot = _mm512_dpbusd_epi32(dot, high, _mm512_set1_epi32(a4[g * 8 + 2 * c + 1]));
    }
    _mm_prefetch((const char*)(scale_zero + g * 2 * ROWS) + AHEAD / 4, _MM_HINT_T0);
    // bfloat16 to float: the 16 bits moved to the top
    __m512i sz = _mm512_loadu_si512(scale_zero + g * 2 * ROWS);
    __m512 scale = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(sz)), 16));
    __m512 zero = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(sz, 1)), 16));
    __m512 sum = _mm512_sub_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(8 * x.a_sum[g]));
    acc = _mm512_fmadd_ps(sum, _mm512_mul_ps(scale, _mm512_set1_ps(x.d[g])), acc);
    acc = _mm512_fmadd_ps(zero, _mm512_set1_ps(x.x_sum[g]), acc);
  }
  return acc;
}

template <typename T>
void store(T* y, __m512 v, int64_t n) {
  float f[ROWS];
  _mm512_storeu_ps(f, v);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(f[i]);
}

template <typename T>
at::Tensor mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale_zero,
              int64_t n_out) {
  const int64_t M = x.size(0), K = x.size(1), G = K / GROUP;
  auto a = at::empty({M, K}, x.options().dtype(at::kChar));
  auto stats = at::empty({M, 3, G}, x.options().dtype(at::kFloat));  // d, a_sum, x_sum
  const T* xp = x.data_ptr<T>();
  int8_t* ap = a.data_ptr<int8_t>();
  float* sp = stats.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    float* s = sp + m * 3 * G;
    quantize_row(xp + m * K, K, ap + m * K, s, s + G, s + 2 * G);
  }
  auto y = at::empty({M, n_out}, x.options());
  T* yp = y.data_ptr<T>();
  const auto* cp = codes.data_ptr<uint8_t>();
  const auto* zp = reinterpret_cast<const uint16_t*>(scale_zero.data_ptr<int16_t>());
  at::parallel_for(0, codes.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t m = 0; m < M; ++m) {
        const float* s = sp + m * 3 * G;
        Row row{ap + m * K, s, s + G, s + 2 * G};
        __m512 v = block_row(cp + b * K * 8, zp + b * G * 2 * ROWS, row, K);
        store(yp + m * n_out + b * ROWS, v, std::min(ROWS, n_out - b * ROWS));
      }
    }
  });
  return y;
}

at::Tensor int4_vnni_mm(const at::Tensor& x, const at::Tensor& codes,
                        const at::Tensor& scale_zero, int64_t n_out) {
  // what keeps the reads in bounds; the rest is int4_vnni.py's to get right
  const int64_t K = x.size(1), blocks = codes.size(0);
  TORCH_CHECK(x.dim() == 2 && K % GROUP == 0 && codes.numel() == blocks * K * 8 &&
                  scale_zero.numel() == blocks * K / GROUP * 2 * ROWS &&
                  n_out <= blocks * ROWS && codes.is_contiguous() && scale_zero.is_contiguous(),
              "int4_vnni_mm: shapes that do not fit together");
  if (x.scalar_type() == at::kBFloat16) return mm<at::BFloat16>(x.contiguous(), codes, scale_zero, n_out);
  return mm<float>(x.contiguous().to(at::kFloat), codes, scale_zero, n_out);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanogpt_perf, m) {
  m.def("int4_vnni_mm(Tensor x, Tensor codes, Tensor scale_zero, int n_out) -> Tensor");
}

TORCH_LIBRARY_IMPL(nanogpt_perf, CPU, m) { m.impl("int4_vnni_mm", int4_vnni_mm); }
