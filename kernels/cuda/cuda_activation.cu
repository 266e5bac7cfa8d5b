/* Elementwise activations (GELU tanh form, SiLU, SwiGLU) and the row softmax
 * on CUDA: grid-stride loops for the former, one warp per row for softmax. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

__device__ __forceinline__ float sigmoidf(float x) {
    return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float silu_grad(float x) {
    float s = sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
}

__device__ __forceinline__ float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x)));
}

static __global__ void gelu_forward_kernel(float *out, const float *x, int64_t n) {
    GRID_STRIDE(i, n) out[i] = gelu(x[i]);
}

/* The linear layer's epilogue in one pass: y (rows, oc) += bias, act = gelu(y). */
static __global__ void bias_gelu_kernel(float *act, float *y, const float *bias, int64_t rows, int64_t oc) {
    GRID_STRIDE(i, rows * oc) {
        float v = y[i] + (bias ? bias[i % oc] : 0.0f);
        y[i] = v;
        act[i] = gelu(v);
    }
}

static __global__ void gelu_backward_kernel(float *dx, const float *dout, const float *x, int64_t n) {
    GRID_STRIDE(i, n) {
        float xi = x[i];
        float th = tanhf(GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi));
        float grad =
            0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * xi * xi);
        dx[i] = grad * dout[i];
    }
}

static __global__ void silu_forward_kernel(float *out, const float *x, int64_t n) {
    GRID_STRIDE(i, n) out[i] = x[i] * sigmoidf(x[i]);
}

static __global__ void silu_backward_kernel(float *dx, const float *dout, const float *x, int64_t n) {
    GRID_STRIDE(i, n) dx[i] = dout[i] * silu_grad(x[i]);
}

static __global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up, int64_t n) {
    GRID_STRIDE(i, n) out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

static __global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout, const float *gate,
                                              const float *up, int64_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i], u = up[i], d = dout[i]; /* read before written: dgate, dup may be gate, up */
        dup[i] = d * g * sigmoidf(g);
        dgate[i] = d * u * silu_grad(g);
    }
}

static __global__ void softmax_kernel(float *out, const float *x, int64_t n, int64_t c) {
    int64_t row = blockIdx.x * (int64_t)WARPS_PER_BLOCK + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n) return;
    const float *xr = x + row * c; /* may alias out */
    float mx = -INFINITY, sum = 0;
    for (int64_t i = lane; i < c; i += 32)
        mx = fmaxf(mx, xr[i]);
    mx = warp_max(mx);
    for (int64_t i = lane; i < c; i += 32)
        sum += expf(xr[i] - mx);
    float inv = 1.0f / warp_sum(sum);
    for (int64_t i = lane; i < c; i += 32)
        out[row * c + i] = expf(xr[i] - mx) * inv;
}

/* cuBLAS without the bias, then the bias and GELU together: one pass over y instead of
 * dsc_kernel_linear_forward's bias kernel and a GELU kernel after it. */
dsc_status dsc_cuda_linear_gelu(const dsc_backend *backend, float *act, float *y, const float *x, const float *w,
                                const float *bias, int64_t n, int64_t oc, int64_t c) {
    DSC_TRY(dsc_cuda_gemm(backend, y, x, w, NULL, 1, n, oc, c, false, true, 1.0f, 0.0f));
    LAUNCH_ELEMENTWISE(bias_gelu_kernel, backend, n * oc, act, y, bias, n, oc);
}

dsc_status dsc_cuda_gelu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n) {
    LAUNCH_ELEMENTWISE(gelu_forward_kernel, backend, n, out, x, n);
}
dsc_status dsc_cuda_gelu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                  int64_t n) {
    LAUNCH_ELEMENTWISE(gelu_backward_kernel, backend, n, dx, dout, x, n);
}
dsc_status dsc_cuda_silu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n) {
    LAUNCH_ELEMENTWISE(silu_forward_kernel, backend, n, out, x, n);
}
dsc_status dsc_cuda_silu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                  int64_t n) {
    LAUNCH_ELEMENTWISE(silu_backward_kernel, backend, n, dx, dout, x, n);
}
dsc_status dsc_cuda_swiglu_forward(const dsc_backend *backend, float *out, const float *gate, const float *up,
                                   int64_t n) {
    LAUNCH_ELEMENTWISE(swiglu_forward_kernel, backend, n, out, gate, up, n);
}
dsc_status dsc_cuda_swiglu_backward(const dsc_backend *backend, float *dgate, float *dup, const float *dout,
                                    const float *gate, const float *up, int64_t n) {
    LAUNCH_ELEMENTWISE(swiglu_backward_kernel, backend, n, dgate, dup, dout, gate, up, n);
}

dsc_status dsc_cuda_softmax(const dsc_backend *backend, float *out, const float *x, int64_t n, int64_t c) {
    if (n == 0 || c == 0) return NULL;
    cuda_context *cx;
    DSC_TRY(dsc_cuda_enter(backend, &cx));
    softmax_kernel<<<cuda_warp_blocks(n), CUDA_BLOCK, 0, cx->stream>>>(out, x, n, c);
    CUDA_LAUNCHED(softmax_kernel);
    return NULL;
}
