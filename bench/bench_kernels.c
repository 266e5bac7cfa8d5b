/* bench_kernels — throughput of the non-GEMM kernels on GPT-2-small shapes:
 * causal attention forward/backward in GFLOP/s against the backend's own
 * 2048^3 GEMM rate (and that GEMM with bf16 products, dsc_kernels_set_matmul_dtype), and LayerNorm / RMSNorm /
 * GELU, the gradient norm's sum of squares and mixed precision's bf16 rounding in GB/s against a plain copy of
 * the same bytes (memmove on the CPU, device-to-device copy on CUDA), the
 * memory-bound ceiling these kernels can approach.
 *
 * Run: build/bench/bench_kernels [cpu|cuda] [--threads N]
 * Attention FLOPs: forward 2*B*NH*T^2*HS (QK^T and PV over the causal half),
 * backward 2.5x forward (FlashAttention's convention). Bytes: every tensor
 * the kernel must read or write once. Best of 3 timed batches; never asserts. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/kernels.h"
#include "dsc/precision.h"

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_kernels: %s\n", dsc_status_message(s));
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Small random values (on the host, then copied), so softmax and norms see realistic data. */
static dsc_tensor tensor(dsc_device dev, int ndim, const int64_t *shape) {
    dsc_tensor host, t;
    die(dsc_tensor_alloc(&host, DSC_DTYPE_F32, ndim, shape, DSC_CPU, DSC_MEM_OTHER));
    float *h = host.data;
    uint32_t state = 12345;
    for (int64_t i = 0; i < dsc_tensor_numel(&host); i++) {
        state = state * 1664525u + 1013904223u;
        h[i] = ((float)(state >> 8) / 16777216.0f - 0.5f);
    }
    die(dsc_tensor_alloc(&t, DSC_DTYPE_F32, ndim, shape, dev, DSC_MEM_OTHER));
    die(dsc_tensor_copy(&t, &host));
    dsc_tensor_free(&host);
    return t;
}
#define TENSOR(dev, ...)                                                                                          \
    tensor((dev), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

typedef enum {
    OP_GEMM,
    OP_GEMM_BF16,
    OP_ATTN_FWD,
    OP_ATTN_BWD,
    OP_LN_FWD,
    OP_LN_BWD,
    OP_RMS_FWD,
    OP_RMS_BWD,
    OP_GELU_FWD,
    OP_GELU_BWD,
    OP_SUM_SQUARES,
    OP_ROUND_BF16,
    OP_COPY
} bench_op;

/* Every tensor any operation needs, at one set of shapes. */
typedef struct bench {
    dsc_device dev;
    dsc_tensor q, k, v, out, lse, dout, dq, dk, dv;    /* attention (B, T, NH, HS), lse (B, NH, T) */
    dsc_tensor x, y, dx, dy, w, b, dw, db, mean, rstd; /* rows (N, C), params (C), stats (N) */
    dsc_tensor sq_a, sq_b, sq_out;                     /* (2048, 2048) */
} bench;

static dsc_status run_op(bench *B, bench_op op) {
    switch (op) {
    case OP_GEMM:
        return dsc_kernel_gemm(&B->sq_out, &B->sq_a, &B->sq_b, NULL, false, false, 1.0f, 0.0f);
    case OP_GEMM_BF16: { /* bf16 training's products */
        dsc_dtype was = dsc_kernels_set_matmul_dtype(DSC_DTYPE_BF16);
        dsc_status s = dsc_kernel_gemm(&B->sq_out, &B->sq_a, &B->sq_b, NULL, false, false, 1.0f, 0.0f);
        dsc_kernels_set_matmul_dtype(was);
        return s;
    }
    case OP_ATTN_FWD:
        return dsc_kernel_attention_forward(&B->out, &B->lse, &B->q, &B->k, &B->v);
    case OP_ATTN_BWD:
        return dsc_kernel_attention_backward(&B->dq, &B->dk, &B->dv, &B->dout, &B->q, &B->k, &B->v, &B->out,
                                             &B->lse);
    case OP_LN_FWD:
        return dsc_kernel_layernorm_forward(&B->y, &B->mean, &B->rstd, &B->x, &B->w, &B->b, 1e-5f);
    case OP_LN_BWD:
        return dsc_kernel_layernorm_backward(&B->dx, &B->dw, &B->db, &B->dy, &B->x, &B->w, &B->mean, &B->rstd);
    case OP_RMS_FWD:
        return dsc_kernel_rmsnorm_forward(&B->y, &B->rstd, &B->x, &B->w, 1e-5f);
    case OP_RMS_BWD:
        return dsc_kernel_rmsnorm_backward(&B->dx, &B->dw, &B->dy, &B->x, &B->w, &B->rstd);
    case OP_GELU_FWD:
        return dsc_kernel_gelu_forward(&B->y, &B->x);
    case OP_GELU_BWD:
        return dsc_kernel_gelu_backward(&B->dx, &B->dy, &B->x);
    case OP_SUM_SQUARES: {
        double sum;
        return dsc_kernel_sum_squares(&sum, &B->x);
    }
    case OP_ROUND_BF16: /* host memory only: the rounding loops are the CPU's */
        dsc_round_to_dtype_from(B->y.data, B->x.data, dsc_tensor_numel(&B->x), DSC_DTYPE_BF16);
        return NULL;
    case OP_COPY:
        return dsc_tensor_copy(&B->y, &B->x);
    }
    return NULL;
}

/* Best rate (units per second) of 3 batches of at least ~0.2 s; `units` per call. */
static double measure(bench *B, bench_op op, double units) {
    double best = 0;
    die(run_op(B, op));
    die(dsc_device_synchronize(B->dev));
    for (int trial = 0; trial < 3; trial++) {
        int reps = 0;
        double t0 = now(), t;
        do {
            die(run_op(B, op));
            reps++;
            die(dsc_device_synchronize(B->dev));
            t = now() - t0;
        } while (t < 0.2);
        if (units * reps / t > best) best = units * reps / t;
    }
    return best;
}

int main(int argc, char **argv) {
    bench B = {.dev = DSC_CPU};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "cuda") == 0)
            B.dev = (dsc_device){DSC_DEVICE_CUDA, 0};
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            dsc_kernels_set_num_threads(atoi(argv[++i]));
        else if (strcmp(argv[i], "cpu") != 0) {
            fprintf(stderr, "usage: bench_kernels [cpu|cuda] [--threads N]\n");
            return 2;
        }
    }
    die(dsc_device_synchronize(B.dev)); /* fails when the device is not built in or not present */
    char name[32];
    bool gpu = B.dev.type == DSC_DEVICE_CUDA;
    /* GPT-2 small: C = 768, NH = 12, HS = 64, T = 1024; the CPU gets one sequence, the GPU eight. */
    int64_t b = gpu ? 8 : 1, t = 1024, nh = 12, hs = 64, c = nh * hs, n = b * t;
    dsc_device d = B.dev;
    B.q = TENSOR(d, b, t, nh, hs), B.k = TENSOR(d, b, t, nh, hs), B.v = TENSOR(d, b, t, nh, hs);
    B.out = TENSOR(d, b, t, nh, hs), B.lse = TENSOR(d, b, nh, t), B.dout = TENSOR(d, b, t, nh, hs);
    B.dq = TENSOR(d, b, t, nh, hs), B.dk = TENSOR(d, b, t, nh, hs), B.dv = TENSOR(d, b, t, nh, hs);
    B.x = TENSOR(d, n, c), B.y = TENSOR(d, n, c), B.dx = TENSOR(d, n, c), B.dy = TENSOR(d, n, c);
    B.w = TENSOR(d, c), B.b = TENSOR(d, c), B.dw = TENSOR(d, c), B.db = TENSOR(d, c);
    B.mean = TENSOR(d, n), B.rstd = TENSOR(d, n);
    B.sq_a = TENSOR(d, 2048, 2048), B.sq_b = TENSOR(d, 2048, 2048), B.sq_out = TENSOR(d, 2048, 2048);
    printf("bench_kernels on %s (threads %d): B=%lld T=%lld NH=%lld HS=%lld, rows N=%lld C=%lld; OpenBLAS runs "
           "its %s "
           "kernels\n",
           dsc_device_name(B.dev, name, sizeof name), dsc_kernels_get_num_threads(), (long long)b, (long long)t,
           (long long)nh, (long long)hs, (long long)n, (long long)c, openblas_get_corename());

    double peak = measure(&B, OP_GEMM, 2.0 * 2048 * 2048 * 2048) / 1e9;
    double attn_flops = 2.0 * (double)(b * nh * t * t * hs);
    printf("  %-22s %9.1f GFLOP/s  (reference)\n", "gemm 2048^3", peak);
    double bf16 = measure(&B, OP_GEMM_BF16, 2.0 * 2048 * 2048 * 2048) / 1e9;
    printf("  %-22s %9.1f GFLOP/s  vs %8.1f  ratio %.3f\n", "gemm 2048^3, bf16", bf16, peak, bf16 / peak);
    const struct {
        const char *name;
        bench_op op;
        double flops;
    } flop_ops[] = {{"attention forward", OP_ATTN_FWD, attn_flops},
                    {"attention backward", OP_ATTN_BWD, 2.5 * attn_flops}};
    for (int i = 0; i < 2; i++) {
        double g = measure(&B, flop_ops[i].op, flop_ops[i].flops) / 1e9;
        printf("  %-22s %9.1f GFLOP/s  vs %8.1f  ratio %.3f\n", flop_ops[i].name, g, peak, g / peak);
    }

    double row_bytes = 4.0 * (double)(n * c);
    double copy = measure(&B, OP_COPY, 2 * row_bytes) / 1e9;
    printf("  %-22s %9.1f GB/s     (reference)\n", "copy", copy);
    const struct {
        const char *name;
        bench_op op;
        double tensors; /* (N, C) tensors read or written */
    } byte_ops[] = {{"layernorm forward", OP_LN_FWD, 2},   {"layernorm backward", OP_LN_BWD, 3},
                    {"rmsnorm forward", OP_RMS_FWD, 2},    {"rmsnorm backward", OP_RMS_BWD, 3},
                    {"gelu forward", OP_GELU_FWD, 2},      {"gelu backward", OP_GELU_BWD, 3},
                    {"sum of squares", OP_SUM_SQUARES, 1}, {"bf16 rounding", OP_ROUND_BF16, 2}};
    for (size_t i = 0; i < sizeof byte_ops / sizeof byte_ops[0]; i++) {
        if (gpu && byte_ops[i].op == OP_ROUND_BF16) continue;
        double g = measure(&B, byte_ops[i].op, byte_ops[i].tensors * row_bytes) / 1e9;
        printf("  %-22s %9.1f GB/s     vs %8.1f  ratio %.2f\n", byte_ops[i].name, g, copy, g / copy);
    }
    dsc_tensor *all[] = {&B.q,  &B.k,    &B.v,    &B.out,  &B.lse,  &B.dout,  &B.dq, &B.dk,
                         &B.dv, &B.x,    &B.y,    &B.dx,   &B.dy,   &B.w,     &B.b,  &B.dw,
                         &B.db, &B.mean, &B.rstd, &B.sq_a, &B.sq_b, &B.sq_out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dsc_tensor_free(all[i]);
    return 0;
}
