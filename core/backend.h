/* core/backend.h — PRIVATE (not installed): a compute device as an object.
 *
 * A backend type (CPU always, CUDA when built) is a table of functions: the
 * memory half serves the allocator and tensor copies, `kernels` is the
 * operation table the public wrappers in kernels/ call. Each backend type
 * registers its table when the library loads (kernels/cpu/cpu_memory.c,
 * kernels/cuda/cuda_memory.cu); core knows none of them.
 *
 * A backend object (dsc_backend) is one device of a type with its context:
 * the device, the compute stream every operation on that device runs on
 * (CUDA; NULL on the CPU), and the type's private state (cuBLAS handle,
 * scratch). dsc_backend_get creates it once, the first time the device is
 * named, and keeps it for the life of the process; every later lookup of the
 * device returns the same object. Nothing finds a device from a pointer:
 * the device comes from the tensor's `device` field.
 *
 * Thread-safety: the registry is process-global. Types are registered while
 * the library loads (before main); dsc_backend_get may be called from any
 * thread (creation is serialised by a lock). Operations on one backend object
 * are ordered by its stream; callers that share a device between threads
 * order their own work. */
#ifndef DSC_CORE_BACKEND_H
#define DSC_CORE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/memory.h"
#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_backend dsc_backend;
struct dsc_kernel_ops;

/* What one backend type provides. */
typedef struct dsc_backend_iface {
    const char *name;
    /* Devices of this type present; NULL when the type has one device that any index names (cpu). */
    int (*device_count)(void);
    /* Creates the context of backend->device (stream, handles, scratch) into backend->stream and
     * backend->ctx; called once per device. NULL when there is nothing to create. */
    dsc_status (*init)(dsc_backend *backend);
    /* Zero-filled, DSC_MEM_ALIGN-aligned memory on the backend's device. */
    dsc_status (*mem_alloc)(const dsc_backend *backend, void **ptr, size_t bytes);
    void (*mem_free)(const dsc_backend *backend, void *ptr);
    /* Copies between this device and the host (complete on return) or within the device (ordered on
     * the compute stream). */
    dsc_status (*memcpy_to_host)(const dsc_backend *backend, void *dst, const void *src, size_t bytes);
    dsc_status (*memcpy_from_host)(const dsc_backend *backend, void *dst, const void *src, size_t bytes);
    dsc_status (*memcpy_device)(const dsc_backend *backend, void *dst, const void *src, size_t bytes);
    /* Waits until everything queued on the compute stream is done. */
    dsc_status (*synchronize)(const dsc_backend *backend);
    const struct dsc_kernel_ops *kernels;
} dsc_backend_iface;

/* One device of a backend type and its context. */
struct dsc_backend {
    const dsc_backend_iface *iface;
    dsc_device device;
    void *stream; /* the compute stream (cudaStream_t) of this device; NULL on the CPU */
    void *ctx;    /* the type's private context */
};

/* Installs the table for `type`; called by each backend type when the library loads. */
void dsc_backend_register(dsc_device_type type, const dsc_backend_iface *iface);

/* The backend object of `device`, created on first use; an error names the device when its type is
 * not built in, the device is not present, or its context cannot be created. */
dsc_status dsc_backend_get(dsc_device device, const dsc_backend **out);

/* Weight rows widened per thread and workspace panel by linear_packed. */
#define DSC_LINEAR_PACKED_PANEL 128

/* The operation table of a backend type: raw pointers and extents, validated
 * already by the public wrappers (kernels/), on the device of `backend`. */
struct dsc_kernel_ops {
    dsc_status (*gemm)(const dsc_backend *backend, float *out, const float *a, const float *b, const float *bias,
                       int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
                       float beta);
    dsc_status (*linear_backward_bias)(const dsc_backend *backend, float *dbias, const float *dy, int64_t n,
                                       int64_t oc);
    /* dw (oc, c) += round(dy^T @ x) and dbias (oc) += round(sum_rows dy), either NULL to skip, the
     * sums in f32 and rounded to `dtype` (bf16 / fp16) before they are added; dy (n, oc), x (n, c).
     * The operands multiply in the calling thread's product type (dsc_kernels_set_matmul_dtype). */
    dsc_status (*linear_grads_rounded)(const dsc_backend *backend, float *dw, float *dbias, const float *dy,
                                       const float *x, int64_t n, int64_t oc, int64_t c, dsc_dtype dtype);
    /* y (n, oc) = x (n, c) @ W^T (+ bias) stored in 2 bytes of y_type (bf16 / fp16), the operands
     * multiplied in the calling thread's product type: each sum rounded once. The CPU only (mixed
     * precision's logits). */
    dsc_status (*linear_narrow_y)(const dsc_backend *backend, void *y, dsc_dtype y_type, const float *x,
                                  const float *w, const float *bias, int64_t n, int64_t oc, int64_t c);
    /* The linear backward from dy (n, oc) stored in 2 bytes of dy_type, read widened, the operands
     * multiplied in the thread's product type: dx (n, c) = dy @ W and dw (oc, c) += round(dy^T @ x)
     * to grad_dtype (f32: as summed), either NULL to skip. The CPU only. */
    dsc_status (*linear_backward_narrow_dy)(const dsc_backend *backend, float *dx, float *dw, const void *dy,
                                            dsc_dtype dy_type, const float *x, const float *w, int64_t n,
                                            int64_t oc, int64_t c, dsc_dtype grad_dtype);
    /* y (n, oc) = x (n, c) @ W^T (+ bias) and act = gelu(y), W (oc, c) f32: the GELU MLP's first
     * layer with its epilogue fused. */
    dsc_status (*linear_gelu)(const dsc_backend *backend, float *act, float *y, const float *x, const float *w,
                              const float *bias, int64_t n, int64_t oc, int64_t c);
    /* y (n, oc) = x (n, c) @ W^T (+ bias), W (oc, c) stored in `format` (a dsc_weight_format) and
     * widened on the fly; workspace (workspace_floats) serves the many-row case of narrow formats:
     * each thread widens DSC_LINEAR_PACKED_PANEL rows at a time into its own c-wide slice. */
    dsc_status (*linear_packed)(const dsc_backend *backend, float *y, const float *x, const void *w, int format,
                                const float *bias, int64_t n, int64_t oc, int64_t c, float *workspace,
                                int64_t workspace_floats);
    dsc_status (*layernorm_forward)(const dsc_backend *backend, float *out, float *mean, float *rstd,
                                    const float *x, const float *w, const float *b, int64_t n, int64_t c,
                                    float eps);
    dsc_status (*layernorm_backward)(const dsc_backend *backend, float *dx, float *dw, float *db,
                                     const float *dout, const float *x, const float *w, const float *mean,
                                     const float *rstd, int64_t n, int64_t c);
    dsc_status (*rmsnorm_forward)(const dsc_backend *backend, float *out, float *rstd, const float *x,
                                  const float *w, int64_t n, int64_t c, float eps);
    dsc_status (*rmsnorm_backward)(const dsc_backend *backend, float *dx, float *dw, const float *dout,
                                   const float *x, const float *w, const float *rstd, int64_t n, int64_t c);
    dsc_status (*gelu_forward)(const dsc_backend *backend, float *out, const float *x, int64_t n);
    dsc_status (*gelu_backward)(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                int64_t n);
    dsc_status (*silu_forward)(const dsc_backend *backend, float *out, const float *x, int64_t n);
    dsc_status (*silu_backward)(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                int64_t n);
    dsc_status (*swiglu_forward)(const dsc_backend *backend, float *out, const float *gate, const float *up,
                                 int64_t n);
    dsc_status (*swiglu_backward)(const dsc_backend *backend, float *dgate, float *dup, const float *dout,
                                  const float *gate, const float *up, int64_t n);
    dsc_status (*softmax)(const dsc_backend *backend, float *out, const float *x, int64_t n, int64_t c);
    dsc_status (*attention_forward)(const dsc_backend *backend, float *out, float *lse, const float *q,
                                    const float *k, const float *v, int64_t b, int64_t t, int64_t nh, int64_t nkv,
                                    int64_t hs);
    dsc_status (*attention_backward)(const dsc_backend *backend, float *dq, float *dk, float *dv,
                                     const float *dout, const float *q, const float *k, const float *v,
                                     const float *out, const float *lse, int64_t b, int64_t t, int64_t nh,
                                     int64_t nkv, int64_t hs);
    dsc_status (*rope)(const dsc_backend *backend, float *out, const float *x, const int32_t *pos, int64_t b,
                       int64_t t, int64_t nh, int64_t hs, float theta, bool inverse);
    dsc_status (*embedding_forward)(const dsc_backend *backend, float *out, const int32_t *tokens,
                                    const float *wte, const float *wpe, int64_t n, int64_t t, int64_t v,
                                    int64_t c);
    dsc_status (*embedding_backward)(const dsc_backend *backend, float *dwte, float *dwpe, const float *dout,
                                     const int32_t *tokens, int64_t n, int64_t t, int64_t v, int64_t c);
    /* embedding_backward adding each row's sum rounded to `dtype` (bf16 / fp16). */
    dsc_status (*embedding_backward_rounded)(const dsc_backend *backend, float *dwte, float *dwpe,
                                             const float *dout, const int32_t *tokens, int64_t n, int64_t t,
                                             int64_t v, int64_t c, dsc_dtype dtype);
    dsc_status (*cross_entropy_forward)(const dsc_backend *backend, float *losses, const float *logits,
                                        const int32_t *targets, int64_t n, int64_t v);
    dsc_status (*cross_entropy_backward)(const dsc_backend *backend, float *dlogits, const float *logits,
                                         const int32_t *targets, int64_t n, int64_t v, float dloss);
    /* The same over logits (and dlogits, which may alias them) stored in 2 bytes of `type` (bf16 /
     * f16): the losses of the widened values, the gradients rounded. The CPU only. */
    dsc_status (*cross_entropy_forward_narrow)(const dsc_backend *backend, float *losses, const void *logits,
                                               dsc_dtype type, const int32_t *targets, int64_t n, int64_t v);
    dsc_status (*cross_entropy_backward_narrow)(const dsc_backend *backend, void *dlogits, const void *logits,
                                                dsc_dtype type, const int32_t *targets, int64_t n, int64_t v,
                                                float dloss);
    dsc_status (*adamw)(const dsc_backend *backend, float *p, const float *g, float *m, float *v, int64_t n,
                        float lr, float beta1, float beta2, float eps, float wd, int64_t step);
    dsc_status (*sgd)(const dsc_backend *backend, float *p, const float *g, float *buf, int64_t n, float lr,
                      float momentum, float wd, int64_t step);
    dsc_status (*lion)(const dsc_backend *backend, float *p, const float *g, float *m, int64_t n, float lr,
                       float beta1, float beta2, float wd);
    dsc_status (*lamb_direction)(const dsc_backend *backend, float *u, const float *p, const float *g, float *m,
                                 float *v, int64_t n, float beta1, float beta2, float eps, float wd);
    dsc_status (*sum_squares)(const dsc_backend *backend, double *out, const float *x, int64_t n);
    dsc_status (*sum)(const dsc_backend *backend, double *out, const float *x, int64_t n);
    dsc_status (*scale)(const dsc_backend *backend, float *x, float s, int64_t n);
    dsc_status (*axpy)(const dsc_backend *backend, float *y, float a, const float *x, int64_t n);
    dsc_status (*add)(const dsc_backend *backend, float *out, const float *a, const float *b, int64_t n);
    dsc_status (*all_finite)(const dsc_backend *backend, bool *out, const float *x, int64_t n);
    /* Sets x to +0.0 whatever it held (scale by 0 would keep NaN). */
    dsc_status (*zero)(const dsc_backend *backend, float *x, int64_t n);
    /* MoE row movement over routes dest (s*K + j: row of the expert buffer, -1 = dropped):
     * scatter buf[dest] = x[s] (dispatch); gather out[s] (+)= sum_j (w ? w : 1) * y[dest]
     * (combine, and dispatch's backward with w NULL); combine_backward dy[dest] = w * dout[s],
     * dw[s*K + j] = dout[s] . y[dest] (0 dropped). Rows of buf / dy no route names are left as they are. */
    dsc_status (*moe_scatter)(const dsc_backend *backend, float *buf, int64_t rows, const float *x,
                              const int32_t *dest, int64_t s, int64_t k, int64_t m);
    dsc_status (*moe_gather)(const dsc_backend *backend, float *out, const float *y, int64_t rows,
                             const int32_t *dest, const float *w, int64_t s, int64_t k, int64_t m,
                             bool accumulate);
    dsc_status (*moe_combine_backward)(const dsc_backend *backend, float *dy, float *dw, int64_t rows,
                                       const float *dout, const float *y, const int32_t *dest, const float *w,
                                       int64_t s, int64_t k, int64_t m);
};

#ifdef __cplusplus
}
#endif
#endif
