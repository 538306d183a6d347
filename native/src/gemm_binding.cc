// JS binding of the matmul kernels for tests and benchmarks: matmul(kind, A, B, C, M, N, K,
// accumulate) runs synchronously on the calling thread (plus the kernels' OpenMP team), and
// gemmThreads(n) sets / reports the OpenMP thread count used by later calls from this thread.
#include <napi.h>
#include <omp.h>

#include <string>

#include "kernels.h"

namespace ooze {
const char* gemm_kernel_name();  // gemm.cc
}
#include "registry.h"

namespace {

Napi::Float32Array F32(const Napi::CallbackInfo& info, size_t i, const char* name, size_t need) {
  if (!info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array) {
    throw Napi::TypeError::New(info.Env(), std::string("matmul: ") + name + " must be a Float32Array");
  }
  Napi::Float32Array a = info[i].As<Napi::Float32Array>();
  if (a.ElementLength() < need) {
    throw Napi::RangeError::New(info.Env(), std::string("matmul: ") + name + " has " +
                                                std::to_string(a.ElementLength()) +
                                                " elements, the shape needs " + std::to_string(need));
  }
  return a;
}

Napi::Value Matmul(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 8 || !info[0].IsString()) {
    throw Napi::TypeError::New(env, "matmul(kind, A, B, C, M, N, K, accumulate): 8 arguments expected");
  }
  const std::string kind = info[0].As<Napi::String>().Utf8Value();
  for (int i = 4; i < 7; ++i) {
    if (!info[i].IsNumber() || info[i].As<Napi::Number>().Int64Value() < 0 ||
        info[i].As<Napi::Number>().Int64Value() > (1LL << 30)) {
      throw Napi::TypeError::New(env, "matmul: M, N and K must be numbers in [0, 2^30]");
    }
  }
  const int M = info[4].As<Napi::Number>().Int32Value();
  const int N = info[5].As<Napi::Number>().Int32Value();
  const int K = info[6].As<Napi::Number>().Int32Value();
  const bool acc = info[7].ToBoolean().Value();
  const size_t m = M, n = N, k = K;
  Napi::Float32Array A = F32(info, 1, "A", m * k);
  Napi::Float32Array B = F32(info, 2, "B", n * k);
  Napi::Float32Array C = F32(info, 3, "C", m * n);
  if (kind == "nt") {
    ooze::matmul_nt(A.Data(), B.Data(), C.Data(), M, N, K, acc);
  } else if (kind == "nn") {
    ooze::matmul_nn(A.Data(), B.Data(), C.Data(), M, N, K, acc);
  } else if (kind == "tn") {
    ooze::matmul_tn(A.Data(), B.Data(), C.Data(), M, N, K, acc);
  } else {
    throw Napi::TypeError::New(env, "matmul: kind must be \"nt\", \"nn\" or \"tn\", got \"" + kind + "\"");
  }
  return env.Undefined();
}

Napi::Value GemmThreads(const Napi::CallbackInfo& info) {
  if (info.Length() > 0 && info[0].IsNumber()) {
    const int n = info[0].As<Napi::Number>().Int32Value();
    if (n < 1) throw Napi::RangeError::New(info.Env(), "gemmThreads(n): n must be >= 1");
    omp_set_num_threads(n);
  }
  return Napi::Number::New(info.Env(), omp_get_max_threads());
}

Napi::Value GemmKernel(const Napi::CallbackInfo& info) {
  return Napi::String::New(info.Env(), ooze::gemm_kernel_name());
}

void init_gemm(Napi::Env env, Napi::Object exports) {
  exports.Set("gemmKernel", Napi::Function::New(env, GemmKernel, "gemmKernel"));
  exports.Set("matmul", Napi::Function::New(env, Matmul, "matmul"));
  exports.Set("gemmThreads", Napi::Function::New(env, GemmThreads, "gemmThreads"));
}

}  // namespace

OOZE_REGISTER(gemm, init_gemm);
