/* The linear layer over a weight in any dsc_weight_format on the CPU. Up to
 * DSC_CPU_STREAM_MAX_ROWS rows of x (decode) the threads split the weight's
 * rows and each streams its share once, widening in registers
 * (cpu_simd.c): the read is the whole cost, so nothing is packed or copied.
 * More rows (prefill) multiply as GEMMs: f32 weights directly, narrow ones
 * a panel of rows at a time widened into the caller's workspace, each
 * thread a single-threaded sgemm on its own panels (OpenMP's threads, or
 * the pool's in its scope: cpu_pool.h). */
#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_bf16_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_pool.h"
#include "kernels/cpu/cpu_q8_dot.h"
#include "kernels/cpu/cpu_q8_gemm.h"
#include "kernels/cpu/cpu_simd.h"

/* Weight rows per chunk in the streaming case (a few KB each: threads stay on contiguous rows). */
enum { ROW_CHUNK = 64 };
/* Q8_0 weights multiply x quantised to Q8_0 too (cpu_q8_dot.h), once per call for every chunk:
 * on the stack up to this many bytes (decode), else on the heap (batched decode). */
enum { Q8_STACK_BYTES = 16384 };

/* x (n, c) quantised into `stack` or a buffer *heap the caller frees; NULL (widen instead) if no memory. */
static const void *quantized_x(const float *x, int64_t n, int64_t c, void *stack, void **heap) {
    size_t bytes = (size_t)n * dsc_cpu_q8_act_row_bytes(c);
    void *buf = bytes <= Q8_STACK_BYTES ? stack : (*heap = malloc(bytes));
    if (buf) dsc_cpu_q8_quantize_rows(buf, x, n, c);
    return buf;
}

/* Rows i0 .. i0 + m of x (or of its quantised copy xq) against weight rows [r0, r1). */
static void dot_rows(float *y, int64_t ldy, const float *x, const void *xq, int64_t i0, int64_t m, const void *w,
                     dsc_weight_format f, int64_t c, int64_t r0, int64_t r1) {
    if (xq)
        dsc_cpu_q8_dot_rows(y, ldy, (const uint8_t *)xq + (size_t)i0 * dsc_cpu_q8_act_row_bytes(c), m, w, c, r0,
                            r1);
    else
        dsc_cpu_dot_rows(y, ldy, x + i0 * c, m, w, f, c, r0, r1);
}

/* x rows one pass over a weight chunk serves: Q8_0's dot takes more at once than the widening loops. */
static inline int64_t rows_per_pass(const void *xq) {
    _Static_assert(DSC_CPU_Q8_MAX_ROWS >= DSC_CPU_GEMV_MAX_ROWS, "the SwiGLU chunk's buffers hold the larger");
    return xq ? DSC_CPU_Q8_MAX_ROWS : DSC_CPU_GEMV_MAX_ROWS;
}

typedef struct stream_job {
    float *y;
    const float *x, *bias;
    const void *w, *xq; /* xq: x quantised (Q8_0 weights), or NULL */
    dsc_weight_format f;
    int64_t n, oc, c;
} stream_job;

static void stream_chunk(void *arg, int64_t ch) {
    const stream_job *J = arg;
    int64_t r0 = ch * ROW_CHUNK, r1 = r0 + ROW_CHUNK < J->oc ? r0 + ROW_CHUNK : J->oc;
    const int64_t pass = rows_per_pass(J->xq);
    for (int64_t i0 = 0; i0 < J->n; i0 += pass) {
        int64_t m = J->n - i0 < pass ? J->n - i0 : pass;
        dot_rows(J->y + i0 * J->oc, J->oc, J->x, J->xq, i0, m, J->w, J->f, J->c, r0, r1);
        for (int64_t i = i0; J->bias && i < i0 + m; i++)
            for (int64_t r = r0; r < r1; r++)
                J->y[i * J->oc + r] += J->bias[r];
    }
}

void dsc_cpu_stream_rows(float *y, const float *x, const void *w, dsc_weight_format f, const float *bias,
                         int64_t n, int64_t oc, int64_t c) {
    _Alignas(64) unsigned char stack[Q8_STACK_BYTES];
    void *heap = NULL;
    stream_job J = {.y = y, .x = x, .bias = bias, .w = w, .f = f, .n = n, .oc = oc, .c = c};
    if (f == DSC_WEIGHT_Q8_0) J.xq = quantized_x(x, n, c, stack, &heap);
    int64_t chunks = (oc + ROW_CHUNK - 1) / ROW_CHUNK;
    if (oc * c <= DSC_CPU_PARALLEL_MIN) {
        for (int64_t ch = 0; ch < chunks; ch++)
            stream_chunk(&J, ch);
    } else {
        /* The pool, not an OpenMP region: a decode token runs dozens of these, and a thread
         * that is late (descheduled on a busy machine) is not waited for (cpu_pool.h). */
        dsc_cpu_pool_run(stream_chunk, &J, chunks);
    }
    free(heap);
}

typedef struct swiglu_job {
    float *act;
    const float *x;
    const uint8_t *w;
    const void *xq; /* x quantised (Q8_0 weights), or NULL */
    dsc_weight_format f;
    int64_t n, F, c;
} swiglu_job;

/* Rows [r0, r1) of both halves, then the activation while they are in registers' reach. */
static void swiglu_chunk(void *arg, int64_t ch) {
    const swiglu_job *J = arg;
    const int64_t r0 = ch * ROW_CHUNK, nr = r0 + ROW_CHUNK < J->F ? ROW_CHUNK : J->F - r0;
    const size_t rb = dsc_cpu_row_bytes(J->f, J->c);
    float g[DSC_CPU_Q8_MAX_ROWS * ROW_CHUNK], u[DSC_CPU_Q8_MAX_ROWS * ROW_CHUNK];
    const int64_t pass = rows_per_pass(J->xq);
    for (int64_t i0 = 0; i0 < J->n; i0 += pass) {
        int64_t m = J->n - i0 < pass ? J->n - i0 : pass;
        dot_rows(g, ROW_CHUNK, J->x, J->xq, i0, m, J->w + (size_t)r0 * rb, J->f, J->c, 0, nr);
        dot_rows(u, ROW_CHUNK, J->x, J->xq, i0, m, J->w + (size_t)(J->F + r0) * rb, J->f, J->c, 0, nr);
        for (int64_t i = 0; i < m; i++)
            dsc_cpu_swiglu_rows(J->act + (i0 + i) * J->F + r0, g + i * ROW_CHUNK, u + i * ROW_CHUNK, nr);
    }
}

void dsc_cpu_stream_swiglu(float *act, const float *x, const void *w, dsc_weight_format f, int64_t n, int64_t F,
                           int64_t c) {
    _Alignas(64) unsigned char stack[Q8_STACK_BYTES];
    void *heap = NULL;
    swiglu_job J = {.act = act, .x = x, .w = w, .f = f, .n = n, .F = F, .c = c};
    if (f == DSC_WEIGHT_Q8_0) J.xq = quantized_x(x, n, c, stack, &heap);
    dsc_cpu_pool_run(swiglu_chunk, &J, (F + ROW_CHUNK - 1) / ROW_CHUNK);
    free(heap);
}

typedef struct panel_job {
    float *y;
    const float *x, *bias;
    const void *w;
    /* x as the integer or bf16 dot takes it (Q8_0 weights on AVX-512 VNNI, bf16 on AVX-512 BF16),
     * or NULL: the panels are widened and multiplied by sgemm */
    const void *xlow;
    dsc_weight_format f;
    float *workspace; /* one (panel, C) slot per thread */
    int64_t n, oc, c;
} panel_job;

/* Panel p of the weight's rows times x: y[:, rows of p]; the panel widened into slot `slot` and
 * multiplied by sgemm, or packed there for the Q8_0 or bf16 dot (cpu_q8_gemm.h, cpu_bf16_gemm.h). */
static void panel_gemm(const panel_job *P, int64_t p, int slot) {
    const int64_t panel = DSC_LINEAR_PACKED_PANEL, c = P->c, r0 = p * panel,
                  rows = P->oc - r0 < panel ? P->oc - r0 : panel;
    float *wide = P->workspace + (int64_t)slot * panel * c; /* (panel, C) */
#if defined(__x86_64__)
    if (P->xlow && P->f == DSC_WEIGHT_Q8_0) {
        dsc_cpu_q8_gemm_panel(P->y, P->oc, P->xlow, P->n, P->w, c, r0, rows, wide);
    } else if (P->xlow) {
        dsc_cpu_bf16_gemm_panel(P->y, P->oc, P->xlow, P->n, P->w, c, r0, rows, (uint32_t *)wide);
    } else
#endif
    {
        dsc_cpu_widen_rows(wide, P->w, P->f, c, r0, r0 + rows);
        /* y[:, r0 : r0 + rows] = x (N, C) @ wide^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)P->n, (int)rows, (int)c, 1.0f, P->x, (int)c,
                    wide, (int)c, 0.0f, P->y + r0, (int)P->oc);
    }
    for (int64_t i = 0; P->bias && i < P->n; i++)
        for (int64_t r = r0; r < r0 + rows; r++)
            P->y[i * P->oc + r] += P->bias[r];
}

static void widen_panel(void *arg, int64_t p) {
    panel_gemm(arg, p, dsc_cpu_pool_thread());
}

int64_t dsc_cpu_stream_max_rows(dsc_weight_format f) {
    /* Where the integer or bf16 dot runs, its GEMM beats streaming from 9 rows on (batched decode
     * of 32 sequences, Zen 4: Q8_0 620-669 -> 729-742 tok/s, bf16 422-475 -> 519-542; 4 rows
     * gained nothing more): one streaming pass serves 8 (Q8_0) or 4 (bf16) rows. */
    if ((f == DSC_WEIGHT_Q8_0 && dsc_cpu_q8_gemm_available()) ||
        (f == DSC_WEIGHT_BF16 && dsc_cpu_bf16_gemm_available()))
        return DSC_CPU_Q8_MAX_ROWS;
    return DSC_CPU_STREAM_MAX_ROWS;
}

dsc_status dsc_cpu_linear_packed(const dsc_backend *backend, float *y, const float *x, const void *w, int format,
                                 const float *bias, int64_t n, int64_t oc, int64_t c, float *workspace,
                                 int64_t workspace_floats) {
    dsc_weight_format f = (dsc_weight_format)format;
    DSC_CHECK(n <= INT_MAX && oc <= INT_MAX && c <= INT_MAX, DSC_ERR_UNSUPPORTED,
              "linear: extents (%lld, %lld, %lld) exceed the 32-bit BLAS interface", (long long)n, (long long)oc,
              (long long)c);
    if (n <= dsc_cpu_stream_max_rows(f) || c == 0) {
        dsc_cpu_stream_rows(y, x, w, f, bias, n, oc, c);
        return NULL;
    }
    if (f == DSC_WEIGHT_F32) return dsc_cpu_gemm(backend, y, x, w, bias, 1, n, oc, c, false, true, 1.0f, 0.0f);
    const int64_t panel = DSC_LINEAR_PACKED_PANEL, panels = (oc + panel - 1) / panel;
    int64_t fit = workspace ? workspace_floats / (panel * c) : 0;
    DSC_CHECK(fit >= 1, DSC_ERR_INVALID,
              "linear over a narrow (format %d) weight (%lld x %lld) for %lld rows needs a workspace of at least "
              "%lld floats, got %lld",
              format, (long long)oc, (long long)c, (long long)n, (long long)(panel * c),
              (long long)workspace_floats);
    int nt = dsc_kernels_get_num_threads();
    if (nt > fit) nt = (int)fit;
    panel_job P = {.y = y, .x = x, .w = w, .f = f, .bias = bias, .workspace = workspace, .n = n, .oc = oc, .c = c};
    /* Q8_0 weights on AVX-512 VNNI, bf16 on AVX-512 BF16: x quantised or rounded once for every
     * panel, each panel packed into its thread's slot (without memory for x, or were a packed
     * panel larger than a slot, the widening panels). */
    void *xlow = NULL;
#if defined(__x86_64__)
    const size_t slot_bytes = (size_t)panel * (size_t)c * sizeof(float);
    if (f == DSC_WEIGHT_Q8_0 && dsc_cpu_q8_gemm_available() &&
        dsc_cpu_q8_gemm_pack_bytes(panel, c) <= slot_bytes && (xlow = malloc(dsc_cpu_q8_gemm_x_bytes(n, c))))
        dsc_cpu_q8_gemm_prepare_x(xlow, x, n, c);
    else if (f == DSC_WEIGHT_BF16 && dsc_cpu_bf16_gemm_available() &&
             dsc_cpu_bf16_pack_bytes(panel, c) <= slot_bytes && (xlow = malloc(dsc_cpu_bf16_x_bytes(n, c))))
        dsc_cpu_bf16_round_x(xlow, x, n, c);
#endif
    P.xlow = xlow;
    if (dsc_cpu_pool_scope() && !dsc_cpu_pool_inside()) {
        /* Each panel widens into the workspace slot of the thread that runs it (slot 0..nt-1). */
        dsc_cpu_pool_run_upto(widen_panel, &P, panels, nt);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int tid = omp_get_thread_num(), team = omp_get_num_threads();
            for (int64_t p = tid; p < panels; p += team)
                panel_gemm(&P, p, tid);
        }
    }
    free(xlow);
    return NULL;
}
