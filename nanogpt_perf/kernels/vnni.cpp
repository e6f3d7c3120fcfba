// Low-bit weights times int8 activations on a CPU's AVX-512 VNNI: nanogpt_perf::int4_vnni_mm and
// ::int8_vnni_mm, built and loaded by vnni.py, which also holds their layouts (pack_int4,
// pack_int8) and their references in torch ops.
//
// y (M, n_out) = x (M, K) @ w.T. Each row of x is quantized here to int8 per group of 32 inputs
// (x ~ d * a, d = max|x| / 127), so that one vpdpbusd multiplies 16 rows of unsigned 8-bit
// weight codes by 4 inputs at once, summing in int32; the codes' offset is taken out per group:
//   int4: w ~ (q - 8) * scale + zero, q in 0..15, a scale and a zero per row and group of 32:
//     y[n] = sum_g d_g scale[n, g] (sum_{k in g} q[n, k] a[k] - 8 sum_{k in g} a[k])
//                  + zero[n, g] sum_{k in g} x[k];
//   int8: w ~ (u - 128) * scale, u in 1..255, a scale per row:
//     y[n] = scale[n] sum_g d_g (sum_{k in g} u[n, k] a[k] - 128 sum_{k in g} a[k]).
// PyTorch's int4 CPU kernel dequantizes every weight to floats first, which on two cores takes
// longer than reading it. Layouts, for each block of 16 output rows, in 64-byte chunks:
//   int4 codes (N / 16, K / 8, 64) uint8: byte 4 r + j of chunk c holds row r's q at input
//     8 c + j (low nibble) and 8 c + 4 + j (high nibble); scale_zero (N / 16, K / 32, 2, 16)
//     int16: the bits of the block's 16 scales in bfloat16, then of its 16 zeros;
//   int8 codes (N / 16, K / 4, 64) uint8: byte 4 r + j of chunk c is row r's u at input 4 c + j;
//     scale (N) int32: the bits of the rows' float32 scales.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

constexpr int64_t GROUP = 32, ROWS = 16, CHUNK = 64;
// weights fetched this many bytes ahead of their use (int4's scales and zeros a quarter as far: a
// block's stream of them is a quarter as long): streams them ~12% faster on two cores
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
    float inverse = 127.f / amax;  // none where there is no step to divide by (or past float's)
    __m512 inv = _mm512_set1_ps(std::isfinite(inverse) ? inverse : 0.f);
    __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));  // rounded half to even
    __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
    _mm_storeu_si128((__m128i*)(a + g * GROUP), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128((__m128i*)(a + g * GROUP + 16), _mm512_cvtsepi32_epi8(qhi));
    d[g] = amax / 127.f;
    a_sum[g] = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)));
    x_sum[g] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
  }
}

__m512i four_inputs(const int8_t* a) {  // a[0..3] in every 32-bit lane
  int32_t bits;
  std::memcpy(&bits, a, 4);
  return _mm512_set1_epi32(bits);
}

__m512 bfloat16s(__m256i bits) {  // 16 bfloat16 to float: their bits moved to the top
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// one int4 block's 16 outputs for one row of x
__m512 int4_block(const uint8_t* codes, const uint16_t* scale_zero, const Row& x, int64_t K) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < K / GROUP; ++g) {
    __m512i dot = _mm512_setzero_si512();
    for (int64_t c = 0; c < GROUP / 8; ++c) {
      const uint8_t* chunk = codes + (g * GROUP / 8 + c) * CHUNK;
      _mm_prefetch((const char*)(chunk + AHEAD), _MM_HINT_T0);
      __m512i q = _mm512_loadu_si512(chunk);
      __m512i low = _mm512_and_si512(q, nibble);
      __m512i high = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
      dot = _mm512_dpbusd_epi32(dot, low, four_inputs(x.a + g * GROUP + 8 * c));
      dot = _mm512_dpbusd_epi32(dot, high, four_inputs(x.a + g * GROUP + 8 * c + 4));
    }
    const uint16_t* sz = scale_zero + g * 2 * ROWS;
    _mm_prefetch((const char*)sz + AHEAD / 4, _MM_HINT_T0);
    __m512 scale = bfloat16s(_mm256_loadu_si256((const __m256i*)sz));
    __m512 zero = bfloat16s(_mm256_loadu_si256((const __m256i*)(sz + ROWS)));
    __m512 sum = _mm512_sub_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(8 * x.a_sum[g]));
    acc = _mm512_fmadd_ps(sum, _mm512_mul_ps(scale, _mm512_set1_ps(x.d[g])), acc);
    acc = _mm512_fmadd_ps(zero, _mm512_set1_ps(x.x_sum[g]), acc);
  }
  return acc;
}

// one int8 block's 16 outputs for one row of x
__m512 int8_block(const uint8_t* codes, const float* scale, const Row& x, int64_t K) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < K / GROUP; ++g) {
    __m512i dot = _mm512_setzero_si512();
    for (int64_t c = 0; c < GROUP / 4; ++c) {
      const uint8_t* chunk = codes + (g * GROUP / 4 + c) * CHUNK;
      _mm_prefetch((const char*)(chunk + AHEAD), _MM_HINT_T0);
      __m512i u = _mm512_loadu_si512(chunk);
      dot = _mm512_dpbusd_epi32(dot, u, four_inputs(x.a + g * GROUP + 4 * c));
    }
    __m512 sum = _mm512_sub_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(128 * x.a_sum[g]));
    acc = _mm512_fmadd_ps(sum, _mm512_set1_ps(x.d[g]), acc);
  }
  return _mm512_mul_ps(acc, _mm512_loadu_ps(scale));
}

template <typename T>
void store(T* y, __m512 v, int64_t n) {
  float f[ROWS];
  _mm512_storeu_ps(f, v);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(f[i]);
}

// y (M, n_out) of x (M, K) in T: its rows quantized, then block(b, row) for every block of 16
// outputs b, the blocks split among the threads
template <typename T, typename Block>
at::Tensor rows_by_blocks(const at::Tensor& x, int64_t blocks, int64_t n_out, Block block) {
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
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t m = 0; m < M; ++m) {
        const float* s = sp + m * 3 * G;
        __m512 v = block(b, Row{ap + m * K, s, s + G, s + 2 * G});
        store(yp + m * n_out + b * ROWS, v, std::min(ROWS, n_out - b * ROWS));
      }
    }
  });
  return y;
}

// what keeps the reads and writes in bounds; the rest is vnni.py's to get right
void check(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
           int64_t scales_per_block, int64_t n_out, int bits) {
  const int64_t K = x.dim() == 2 ? x.size(1) : 0, blocks = codes.size(0);
  TORCH_CHECK(K > 0 && K % GROUP == 0 && codes.numel() == blocks * K * ROWS * bits / 8 &&
                  scales.numel() == blocks * scales_per_block && n_out <= blocks * ROWS &&
                  n_out > (blocks - 1) * ROWS && codes.is_contiguous() && scales.is_contiguous(),
              "vnni_mm: shapes that do not fit together");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "vnni_mm: x must be float32 or bfloat16");
}

// rows_by_blocks in x's dtype
template <typename Block>
at::Tensor in_dtype(const at::Tensor& x, int64_t blocks, int64_t n_out, Block block) {
  if (x.scalar_type() == at::kBFloat16)
    return rows_by_blocks<at::BFloat16>(x.contiguous(), blocks, n_out, block);
  return rows_by_blocks<float>(x.contiguous(), blocks, n_out, block);
}

at::Tensor int4_vnni_mm(const at::Tensor& x, const at::Tensor& codes,
                        const at::Tensor& scale_zero, int64_t n_out) {
  const int64_t K = x.size(-1);
  check(x, codes, scale_zero, K / GROUP * 2 * ROWS, n_out, 4);
  const auto* cp = codes.data_ptr<uint8_t>();
  const auto* zp = reinterpret_cast<const uint16_t*>(scale_zero.data_ptr<int16_t>());
  auto block = [&](int64_t b, const Row& row) {
    return int4_block(cp + b * K * ROWS / 2, zp + b * K / GROUP * 2 * ROWS, row, K);
  };
  return in_dtype(x, codes.size(0), n_out, block);
}

at::Tensor int8_vnni_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                        int64_t n_out) {
  const int64_t K = x.size(-1);
  check(x, codes, scale, ROWS, n_out, 8);
  const auto* cp = codes.data_ptr<uint8_t>();
  const auto* sp = reinterpret_cast<const float*>(scale.data_ptr<int32_t>());
  auto block = [&](int64_t b, const Row& row) {
    return int8_block(cp + b * K * ROWS, sp + b * ROWS, row, K);
  };
  return in_dtype(x, codes.size(0), n_out, block);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanogpt_perf, m) {
  m.def("int4_vnni_mm(Tensor x, Tensor codes, Tensor scale_zero, int n_out) -> Tensor");
  m.def("int8_vnni_mm(Tensor x, Tensor codes, Tensor scale, int n_out) -> Tensor");
}

TORCH_LIBRARY_IMPL(nanogpt_perf, CPU, m) {
  m.impl("int4_vnni_mm", int4_vnni_mm);
  m.impl("int8_vnni_mm", int8_vnni_mm);
}
