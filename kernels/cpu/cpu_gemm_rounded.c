/* Products in bf16 or fp16 for a thread that asked for them (dsc_kernels_set_matmul_dtype: mixed
 * precision training): both operands rounded to the type, the products (exact in f32) summed in
 * f32, as torch.autocast's bf16 matmuls and a GPU's fp16 GEMM with f32 accumulation. On AVX-512
 * BF16 a prompt-sized bf16 product runs the vdpbf16ps tiles of cpu_bf16_gemm.c over op(a) rounded
 * once and op(b) rounded into packed blocks; elsewhere, for fp16, and for small products, sgemm
 * multiplies rounded copies. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_bf16_gemm.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_round.h"
#include "kernels/cpu/cpu_simd.h"

static _Thread_local dsc_dtype matmul_dtype = DSC_DTYPE_F32;

dsc_dtype dsc_kernels_set_matmul_dtype(dsc_dtype dtype) {
    dsc_dtype was = matmul_dtype;
    matmul_dtype = dtype == DSC_DTYPE_BF16 || dtype == DSC_DTYPE_F16 ? dtype : DSC_DTYPE_F32;
    return was;
}

dsc_dtype dsc_kernels_get_matmul_dtype(void) {
    return matmul_dtype;
}

/* The two operands' buffers, kept by each calling thread between products (the rounded x and the
 * packs of the dot, or the rounded copies sgemm multiplies: a product takes one way), grown to the
 * largest product asked for (GPT-2's head input gradient, 512 rows of 50257: 51 MB for the dot's
 * x). */
static _Thread_local dsc_cpu_kept first_scratch, second_scratch;
/* The f32 panels of a product stored in 2 bytes (into_narrow). */
static _Thread_local dsc_cpu_kept narrow_scratch;
/* The threads' tiles of a product whose sum is rounded before it is added (dsc_cpu_gemm_add_rounded). */
static _Thread_local dsc_cpu_kept tile_scratch;

void *dsc_cpu_kept_at_least(dsc_cpu_kept *s, size_t bytes) {
    if (s->bytes >= bytes) return s->p;
    free(s->p);
    dsc_mem_account(DSC_MEM_OTHER, -(int64_t)s->bytes); /* counted as the other workspaces */
    size_t whole = (bytes + 63) / 64 * 64;
    s->p = aligned_alloc(64, whole);
    s->bytes = s->p ? whole : 0;
    dsc_mem_account(DSC_MEM_OTHER, (int64_t)s->bytes);
    return s->p;
}

#if defined(__x86_64__)
/* out's columns one packed block of op(b) serves (cpu_bf16_gemm.c), and the rows of op(a) one
 * chunk rounds when op(a) is the larger operand (16 of the kernel's 6-row tiles) */
enum { BF16_BLOCK = 64, BF16_ROWS = 96 };

/* One operand prepared whole, the other in pieces per thread. With at least as many columns as
 * rows, op(a) is rounded once into xb and each BF16_BLOCK columns of out packs op(b)'s rows for
 * them into its thread's pack and multiplies every row of xb; with more rows (the weight gradients
 * of wide layers, the head's: 50257 rows), op(b) is packed whole once and each BF16_ROWS rows of
 * op(a) are rounded into their thread's xb and multiply every packed block, so the larger operand
 * is read once. Element (i, kk) of op(a) is at a[i * a_rs + kk * a_cs], element (j, kk) of
 * op(b)^T at b[j * b_rs + kk * b_ks]. */
typedef struct bf16_job {
    const gemm_args *g;
    uint16_t *xb;
    uint32_t *packs;
    size_t pack_words, xb_halves; /* one block's words; one thread's chunk of x (by rows) */
    int64_t a_rs, a_cs, b_rs, b_ks;
    bool pool;
} bf16_job;

static int thread_slot(const bf16_job *J) {
    return J->pool ? dsc_cpu_pool_thread() : omp_get_thread_num();
}

static int64_t block_cols(const gemm_args *g, int64_t j0) {
    return g->n - j0 < BF16_BLOCK ? g->n - j0 : BF16_BLOCK;
}

/* The bias and the GELU of rows [i0, i1), columns [j0, j0 + cols) of out. */
static void epilogue(const gemm_args *g, int64_t i0, int64_t i1, int64_t j0, int64_t cols) {
    for (int64_t i = i0; (g->bias || g->act) && i < i1; i++)
        dsc_cpu_gemm_epilogue_row(g, g->o + i * g->n + j0, g->act ? g->act + i * g->n + j0 : NULL, j0, cols);
}

static void round_rows(void *arg, int64_t p) {
    const bf16_job *J = arg;
    int64_t i0 = p * BF16_BLOCK, i1 = i0 + BF16_BLOCK < J->g->m ? i0 + BF16_BLOCK : J->g->m;
    dsc_cpu_bf16_round_x_rows(J->xb, J->g->a, J->a_rs, J->a_cs, J->g->k, i0, i1);
}

static void columns_block(void *arg, int64_t p) {
    const bf16_job *J = arg;
    const gemm_args *g = J->g;
    uint32_t *pack = J->packs + (size_t)thread_slot(J) * J->pack_words;
    int64_t j0 = p * BF16_BLOCK, cols = block_cols(g, j0);
    dsc_cpu_bf16_pack_f32(pack, g->b, J->b_rs, J->b_ks, g->k, j0, cols);
    dsc_cpu_bf16_multiply(g->o, g->n, J->xb, g->m, pack, g->k, j0, cols, g->alpha, g->beta == 1.0f);
    epilogue(g, 0, g->m, j0, cols);
}

static void pack_block(void *arg, int64_t p) {
    const bf16_job *J = arg;
    int64_t j0 = p * BF16_BLOCK;
    dsc_cpu_bf16_pack_f32(J->packs + (size_t)p * J->pack_words, J->g->b, J->b_rs, J->b_ks, J->g->k, j0,
                          block_cols(J->g, j0));
}

static void rows_chunk(void *arg, int64_t p) {
    const bf16_job *J = arg;
    const gemm_args *g = J->g;
    uint16_t *xb = J->xb + (size_t)thread_slot(J) * J->xb_halves;
    int64_t i0 = p * BF16_ROWS, len = g->m - i0 < BF16_ROWS ? g->m - i0 : BF16_ROWS;
    dsc_cpu_bf16_pad_x(xb, len, g->k);
    dsc_cpu_bf16_round_x_rows(xb, g->a + i0 * J->a_rs, J->a_rs, J->a_cs, g->k, 0, len);
    for (int64_t j0 = 0, b = 0; j0 < g->n; j0 += BF16_BLOCK, b++)
        dsc_cpu_bf16_multiply(g->o + i0 * g->n, g->n, xb, len, J->packs + (size_t)b * J->pack_words, g->k, j0,
                              block_cols(g, j0), g->alpha, g->beta == 1.0f);
    epilogue(g, i0, i0 + len, 0, g->n);
}

static void bf16_parallel(bf16_job *J, void (*fn)(void *, int64_t), int64_t chunks, int nt) {
    if (J->pool) {
        dsc_cpu_pool_run_upto(fn, J, chunks, nt);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t p = 0; p < chunks; p++)
        fn(J, p);
}

/* The product on AVX-512 BF16 (vdpbf16ps), where it pays: more rows than decode streams and
 * enough work to split; false leaves it to the rounded copies. */
static bool bf16_dot_gemm(const gemm_args *g) {
    if (!dsc_cpu_bf16_gemm_available() || g->a_type != DSC_DTYPE_F32 || g->m <= DSC_CPU_STREAM_MAX_ROWS ||
        g->k < 2 || g->m * g->n * g->k < DSC_CPU_GEMM_SPLIT_MIN_WORK || dsc_cpu_gemm_ldo(g) != g->n)
        return false;
    int nt = dsc_kernels_get_num_threads();
    bf16_job J = {.g = g,
                  .pack_words = dsc_cpu_bf16_pack_bytes(BF16_BLOCK, g->k) / sizeof(uint32_t),
                  .a_rs = g->ta ? 1 : dsc_cpu_gemm_lda(g),
                  .a_cs = g->ta ? dsc_cpu_gemm_lda(g) : 1,
                  .b_rs = g->tb ? dsc_cpu_gemm_ldb(g) : 1,
                  .b_ks = g->tb ? 1 : dsc_cpu_gemm_ldb(g),
                  .pool = dsc_cpu_pool_scope() && !dsc_cpu_pool_inside()};
    const int64_t blocks = (g->n + BF16_BLOCK - 1) / BF16_BLOCK;
    const bool by_rows = g->m > g->n;
    J.xb_halves = dsc_cpu_bf16_x_bytes(BF16_ROWS, g->k) / sizeof(uint16_t);
    J.xb = dsc_cpu_kept_at_least(&first_scratch, by_rows ? (size_t)nt * J.xb_halves * sizeof(uint16_t)
                                                         : dsc_cpu_bf16_x_bytes(g->m, g->k));
    J.packs =
        dsc_cpu_kept_at_least(&second_scratch, (size_t)(by_rows ? blocks : nt) * J.pack_words * sizeof(uint32_t));
    if (!J.xb || !J.packs) return false;
    if (by_rows) {
        bf16_parallel(&J, pack_block, blocks, nt);
        bf16_parallel(&J, rows_chunk, (g->m + BF16_ROWS - 1) / BF16_ROWS, nt);
    } else {
        dsc_cpu_bf16_pad_x(J.xb, g->m, g->k);
        bf16_parallel(&J, round_rows, (g->m + BF16_BLOCK - 1) / BF16_BLOCK, nt);
        bf16_parallel(&J, columns_block, blocks, nt);
    }
    return true;
}
#else
static bool bf16_dot_gemm(const gemm_args *g) {
    (void)g;
    return false;
}
#endif

/* An operand as stored: f32 values, or 2-byte ones (bf16 / f16, gemm_args.a_type) read widened. */
typedef struct operand {
    const void *p;
    dsc_dtype type;
} operand;

/* dst[0, n) = the values of src from element `at` as the products read them: f32 ones rounded to
 * `dtype`, 2-byte ones (of a type no wider than the products') widened. */
static void rounded_span(float *dst, operand src, int64_t at, int64_t n, dsc_dtype dtype) {
    if (src.type == DSC_DTYPE_F32)
        dsc_cpu_round_span(dst, (const float *)src.p + at, n, dtype);
    else
        dsc_cpu_widen_rows(dst, (const uint16_t *)src.p + at,
                           src.type == DSC_DTYPE_BF16 ? DSC_WEIGHT_BF16 : DSC_WEIGHT_F16, n, 0, 1);
}

/* rows x cols values of src (row stride ld) rounded to `dtype` into dst, packed. */
static void round_into(float *dst, operand src, int64_t ld, int64_t rows, int64_t cols, dsc_dtype dtype) {
    for (int64_t r = 0; r < rows; r++)
        rounded_span(dst + r * cols, src, r * ld, cols, dtype);
}

/* The same into s, over the kernels' threads in pieces of CHUNK values; NULL without memory. */
static float *rounded_block(dsc_cpu_kept *s, operand src, int64_t ld, int64_t rows, int64_t cols,
                            dsc_dtype dtype) {
    enum { CHUNK = 1 << 14 };
    if (ld == cols) { /* packed: one long row */
        cols *= rows;
        rows = 1;
    }
    float *r = dsc_cpu_kept_at_least(s, (size_t)(rows * cols > 0 ? rows * cols : 1) * sizeof(float));
    if (!r) return NULL;
    const int64_t pieces = (cols + CHUNK - 1) / CHUNK, chunks = rows * pieces;
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (dsc_cpu_parallel(rows * cols))            \
    schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t row = c / pieces, j = c % pieces * CHUNK;
        rounded_span(r + row * cols + j, src, row * ld + j, cols - j < CHUNK ? cols - j : CHUNK, dtype);
    }
    return r;
}

float *dsc_cpu_rounded_copy(dsc_cpu_kept *s, const float *v, int64_t n, dsc_dtype dtype) {
    return rounded_block(s, (operand){v, DSC_DTYPE_F32}, n, 1, n, dtype);
}

/* Operands of more values than this are rounded a panel at a time (16 MB of f32): rounded whole,
 * GPT-2's head weight (38.6M values) and logits gradient (25.7M) took 266 MB kept by the thread.
 * Each value is still rounded once: an operand that fits is rounded whole, the other in panels. */
static int64_t whole_max = 1 << 22;
/* The fewest depth a block of a product split along its depth is given (sgemm's efficiency). */
enum { DEPTH_MIN = 256 };

void dsc_cpu_gemm_rounded_set_whole_max(int64_t values) {
    whole_max = values > 0 ? values : 1 << 22;
}

/* Element (i, kk) of op(a), as stored, and (kk, j) of op(b). */
static operand a_at(const gemm_args *g, int64_t i, int64_t kk) {
    const int64_t at = g->ta ? kk * dsc_cpu_gemm_lda(g) + i : i * dsc_cpu_gemm_lda(g) + kk;
    return (operand){(const char *)g->a + at * (int64_t)dsc_dtype_size(g->a_type), g->a_type};
}
static const float *b_at(const gemm_args *g, int64_t kk, int64_t j) {
    return g->tb ? g->b + j * dsc_cpu_gemm_ldb(g) + kk : g->b + kk * dsc_cpu_gemm_ldb(g) + j;
}

/* op(a)'s rows [i0, i1) over its whole depth, rounded into s and stored as a is (transposed when
 * ta), packed; likewise op(b)'s columns [j0, j1). */
static float *rounded_a(dsc_cpu_kept *s, const gemm_args *g, int64_t i0, int64_t i1, dsc_dtype dtype) {
    return g->ta ? rounded_block(s, a_at(g, i0, 0), dsc_cpu_gemm_lda(g), g->k, i1 - i0, dtype)
                 : rounded_block(s, a_at(g, i0, 0), dsc_cpu_gemm_lda(g), i1 - i0, g->k, dtype);
}
static float *rounded_b(dsc_cpu_kept *s, const gemm_args *g, int64_t j0, int64_t j1, dsc_dtype dtype) {
    const operand b = {b_at(g, 0, j0), DSC_DTYPE_F32};
    return g->tb ? rounded_block(s, b, dsc_cpu_gemm_ldb(g), j1 - j0, g->k, dtype)
                 : rounded_block(s, b, dsc_cpu_gemm_ldb(g), g->k, j1 - j0, dtype);
}

/* Rows [i0, i1) and columns [j0, j1) of out from ra and rb (rounded_a, rounded_b), by sgemm. */
static void panel_product(const gemm_args *g, const float *ra, const float *rb, int64_t i0, int64_t i1, int64_t j0,
                          int64_t j1) {
    const int64_t ldo = dsc_cpu_gemm_ldo(g);
    gemm_args r = *g;
    r.a = ra;
    r.a_type = DSC_DTYPE_F32;
    r.b = rb;
    r.lda = r.ldb = 0;
    r.ldo = ldo;
    r.m = i1 - i0;
    r.n = j1 - j0;
    r.o = g->o + i0 * ldo + j0;
    r.act = g->act ? g->act + i0 * ldo + j0 : NULL;
    r.bias = g->bias ? g->bias + j0 : NULL;
    dsc_cpu_gemm_f32(&r);
}

static dsc_status no_memory(const gemm_args *g, dsc_dtype dtype) {
    return dsc_error(DSC_ERR_NOMEM, "dsc_kernel_gemm: %s copies of a (%lld x %lld) and b (%lld x %lld)",
                     dsc_dtype_name(dtype), (long long)g->m, (long long)g->k, (long long)g->k, (long long)g->n);
}

/* The length of each of the fewest even pieces of [0, len) no longer than `most` (a multiple of 16
 * where that fits: the kernels' register blocks). */
static int64_t even_part(int64_t len, int64_t most) {
    const int64_t parts = (len + most - 1) / most, per = (len + parts - 1) / parts, up = (per + 15) / 16 * 16;
    return up <= most ? up : per;
}

/* Whether an operand has more values than are rounded whole. */
static bool too_large_to_round_whole(const gemm_args *g) {
    return g->m * g->k > whole_max || g->k * g->n > whole_max;
}

static dsc_status product(const gemm_args *g, dsc_dtype dtype);

/* The product as blocks of its depth in turn, each block's operands small enough to round whole
 * (product() decides that they are): out scaled by beta in the first, the bias and GELU added in
 * the last. */
static dsc_status by_depth(const gemm_args *g, dsc_dtype dtype) {
    const int64_t longer = g->m > g->n ? g->m : g->n, depth = even_part(g->k, whole_max / longer);
    for (int64_t k0 = 0; k0 < g->k; k0 += depth) {
        gemm_args d = *g;
        d.a = a_at(g, 0, k0).p;
        d.b = b_at(g, k0, 0);
        d.lda = dsc_cpu_gemm_lda(g);
        d.ldb = dsc_cpu_gemm_ldb(g);
        d.k = g->k - k0 < depth ? g->k - k0 : depth;
        if (k0 > 0) d.beta = 1.0f;
        if (k0 + depth < g->k) d.bias = d.act = NULL;
        DSC_TRY(product(&d, dtype));
    }
    return NULL;
}

/* Panels of op(a)'s rows and of op(b)'s columns, whichever is too large; an operand that fits is
 * rounded once, whole. Only where both are too large is each panel of op(b) rounded again for
 * every panel of op(a). */
static dsc_status by_panels(const gemm_args *g, dsc_dtype dtype) {
    const int64_t most = whole_max / g->k > 16 ? whole_max / g->k : 16;
    const int64_t rows = g->m * g->k > whole_max ? even_part(g->m, most) : g->m;
    const int64_t cols = g->k * g->n > whole_max ? even_part(g->n, most) : g->n;
    const float *whole_b = cols == g->n ? rounded_b(&second_scratch, g, 0, g->n, dtype) : NULL;
    if (cols == g->n && !whole_b) return no_memory(g, dtype);
    for (int64_t i0 = 0; i0 < g->m; i0 += rows) {
        const int64_t i1 = g->m - i0 < rows ? g->m : i0 + rows;
        const float *ra = rounded_a(&first_scratch, g, i0, i1, dtype);
        if (!ra) return no_memory(g, dtype);
        for (int64_t j0 = 0; j0 < g->n; j0 += cols) {
            const int64_t j1 = g->n - j0 < cols ? g->n : j0 + cols;
            const float *rb = whole_b ? whole_b : rounded_b(&second_scratch, g, j0, j1, dtype);
            if (!rb) return no_memory(g, dtype);
            panel_product(g, ra, rb, i0, i1, j0, j1);
        }
    }
    return NULL;
}

/* sgemm over operands rounded to `dtype`: whole where both fit in whole_max values, else in panels
 * (the head's forward: 50257 columns over 768). */
static dsc_status rounded_copies(const gemm_args *g, dsc_dtype dtype) {
    if (too_large_to_round_whole(g)) return by_panels(g, dtype);
    const float *ra = rounded_a(&first_scratch, g, 0, g->m, dtype),
                *rb = rounded_b(&second_scratch, g, 0, g->n, dtype);
    if (!ra || !rb) return no_memory(g, dtype);
    panel_product(g, ra, rb, 0, g->m, 0, g->n);
    return NULL;
}

/* A product in bf16 / fp16: both operands rounded to the type, the products (exact in f32) summed
 * in f32. On AVX-512 BF16 vdpbf16ps does both at once for bf16; elsewhere, and for small products,
 * sgemm multiplies rounded copies. The same values either way but for the order of the sums. */
/* The f32 values of one column panel of a product stored in 2 bytes (1M: 4 MB, 2048 of the head's
 * 50257 columns of 512 rows at a time). */
enum { NARROW_PANEL_FLOATS = 1 << 20 };

/* o stored in 2 bytes (beta 0, no GELU): column panels computed in f32 into the thread's
 * narrow_scratch, each sum rounded once into o. */
static dsc_status into_narrow(const gemm_args *g, dsc_dtype dtype) {
    const int64_t ldo = dsc_cpu_gemm_ldo(g),
                  most = NARROW_PANEL_FLOATS / g->m > 16 ? NARROW_PANEL_FLOATS / g->m : 16;
    const int64_t cols = even_part(g->n, most);
    float *panel = dsc_cpu_kept_at_least(&narrow_scratch, (size_t)(g->m * cols) * sizeof(float));
    if (!panel) return no_memory(g, dtype);
    uint16_t *o = (uint16_t *)g->o;
    for (int64_t j0 = 0; j0 < g->n; j0 += cols) {
        gemm_args p = *g;
        p.n = g->n - j0 < cols ? g->n - j0 : cols;
        p.b = b_at(g, 0, j0);
        p.ldb = dsc_cpu_gemm_ldb(g);
        p.bias = g->bias ? g->bias + j0 : NULL;
        p.o = panel;
        p.ldo = p.n;
        p.o_type = DSC_DTYPE_F32;
        DSC_TRY(product(&p, dtype));
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (dsc_cpu_parallel(g->m * p.n))             \
    schedule(static)
        for (int64_t i = 0; i < g->m; i++)
            dsc_cpu_pack_span(o + i * ldo + j0, panel + i * p.n, p.n, g->o_type);
    }
    return NULL;
}

dsc_status dsc_cpu_gemm_rounded(const gemm_args *g, dsc_dtype dtype) {
    if (g->o_type != DSC_DTYPE_F32) return into_narrow(g, dtype);
    if (g->beta != 0.0f && g->beta != 1.0f) { /* the bf16 tiles add or overwrite */
        for (int64_t i = 0; i < g->m * g->n; i++)
            g->o[i] *= g->beta;
        gemm_args one = *g;
        one.beta = 1.0f;
        return dsc_cpu_gemm_rounded(&one, dtype);
    }
    return product(g, dtype);
}

/* Along the depth where an operand is too large to round whole and the longer output side leaves
 * blocks of DEPTH_MIN or more (the head's input gradient: 512 x 768 outputs over 50257: the bf16
 * dot rounds its x, a depth block of it here, whole); else the bf16 dot where it runs (which keeps
 * x rounded whole and, for more rows than columns, op(b) packed whole) or sgemm over rounded
 * copies. */
static dsc_status product(const gemm_args *g, dsc_dtype dtype) {
    const int64_t longer = g->m > g->n ? g->m : g->n;
    if (too_large_to_round_whole(g) && g->k > DEPTH_MIN && longer * DEPTH_MIN <= whole_max)
        return by_depth(g, dtype);
    if (dtype == DSC_DTYPE_BF16 && bf16_dot_gemm(g)) return NULL;
    return rounded_copies(g, dtype);
}

/* out tiles of dsc_cpu_gemm_add_rounded: TILE_COLS columns (or fewer) by as many rows as make
 * TILE_FLOATS (a megabyte, in L2 while it is rounded and added), a multiple of 16 */
enum { TILE_COLS = 2048, TILE_FLOATS = 1 << 18 };

typedef struct add_rounded_job {
    const gemm_args *g;
    dsc_dtype products, sum;
    float *tiles; /* one tile per thread */
    /* Where op(a) (op(b)) is too large to round whole and each tile reads its own rows (columns) of
     * it: one block per thread for the tile's rows (columns) rounded, else NULL (rounded whole). */
    float *a_blocks, *b_blocks;
    int64_t rows, cols, col_tiles;
    bool pool;
} add_rounded_job;

static void add_rounded_tile(void *arg, int64_t p) {
    const add_rounded_job *J = arg;
    const gemm_args *g = J->g;
    const int64_t r0 = p / J->col_tiles * J->rows, c0 = p % J->col_tiles * J->cols;
    const int64_t m = g->m - r0 < J->rows ? g->m - r0 : J->rows, n = g->n - c0 < J->cols ? g->n - c0 : J->cols;
    const size_t slot = (size_t)(J->pool ? dsc_cpu_pool_thread() : omp_get_thread_num());
    float *tile = J->tiles + slot * TILE_FLOATS;
    int64_t lda = dsc_cpu_gemm_lda(g), ldb = dsc_cpu_gemm_ldb(g);
    const operand stored = a_at(g, r0, 0);
    const float *a = stored.p, *b = b_at(g, 0, c0); /* a: f32 unless a_blocks round (widen) it */
    if (J->a_blocks) {
        float *blk = J->a_blocks + slot * (size_t)(J->rows * g->k);
        if (g->ta)
            round_into(blk, stored, lda, g->k, m, J->products);
        else
            round_into(blk, stored, lda, m, g->k, J->products);
        a = blk;
        lda = g->ta ? m : g->k;
    }
    if (J->b_blocks) {
        float *blk = J->b_blocks + slot * (size_t)(J->cols * g->k);
        const operand stored_b = {b, DSC_DTYPE_F32};
        if (g->tb)
            round_into(blk, stored_b, ldb, n, g->k, J->products);
        else
            round_into(blk, stored_b, ldb, g->k, n, J->products);
        b = blk;
        ldb = g->tb ? g->k : n;
    }
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)m,
                (int)n, (int)g->k, g->alpha, a, lda > 1 ? (int)lda : 1, b, ldb > 1 ? (int)ldb : 1, 0.0f, tile,
                (int)n);
    const int64_t ldo = dsc_cpu_gemm_ldo(g);
    for (int64_t i = 0; i < m; i++) {
        float *row = tile + i * n, *o = g->o + (r0 + i) * ldo + c0;
        dsc_cpu_round_span(row, row, n, J->sum);
        for (int64_t j = 0; j < n; j++)
            o[j] += row[j];
    }
}

dsc_status dsc_cpu_gemm_add_rounded(const gemm_args *g, dsc_dtype products, dsc_dtype sum) {
    if (g->m <= 0 || g->n <= 0 || g->k <= 0) return NULL; /* a sum of nothing adds 0 */
    const int nt = g->m * g->n * g->k < DSC_CPU_GEMM_SPLIT_MIN_WORK ? 1 : dsc_kernels_get_num_threads();
    add_rounded_job J = {
        .g = g, .products = products, .sum = sum, .pool = dsc_cpu_pool_scope() && !dsc_cpu_pool_inside()};
    J.cols = g->n < TILE_COLS ? g->n : TILE_COLS;
    J.col_tiles = (g->n + J.cols - 1) / J.cols;
    /* Row tiles of at most a tile's floats, as many as give every thread the same number of tiles
     * (or at least 8 each): GPT-2's 768 x 768 weight gradients in 3 tiles left one of 2 threads idle
     * for a third of each, a 5-8 % slower bf16 step. */
    const int64_t most_rows = TILE_FLOATS / J.cols / 16 * 16;
    int64_t row_tiles = (g->m + most_rows - 1) / most_rows;
    while (row_tiles * J.col_tiles % nt != 0 && row_tiles * J.col_tiles < 8 * (int64_t)nt)
        row_tiles++;
    J.rows = ((g->m + row_tiles - 1) / row_tiles + 15) / 16 * 16;
    J.tiles = dsc_cpu_kept_at_least(&tile_scratch, (size_t)nt * TILE_FLOATS * sizeof(float));
    gemm_args r = *g;
    bool ok = J.tiles != NULL;
    if (products != DSC_DTYPE_F32 || g->a_type != DSC_DTYPE_F32) { /* a 2-byte a is widened the same way */
        /* An operand too large to round whole is rounded by the tiles that read it, each value once:
         * op(a) where the tiles span every column (GPT-2's head: its logits gradient, 25.7M values). */
        const bool a_by_tiles = g->m * g->k > whole_max && J.col_tiles == 1,
                   b_by_tiles = g->k * g->n > whole_max && (g->m + J.rows - 1) / J.rows == 1;
        if (a_by_tiles) {
            J.a_blocks = dsc_cpu_kept_at_least(&first_scratch, (size_t)nt * J.rows * g->k * sizeof(float));
        } else {
            r.a = rounded_a(&first_scratch, g, 0, g->m, products);
            r.a_type = DSC_DTYPE_F32;
            r.lda = 0;
        }
        if (b_by_tiles) {
            J.b_blocks = dsc_cpu_kept_at_least(&second_scratch, (size_t)nt * J.cols * g->k * sizeof(float));
        } else {
            r.b = rounded_b(&second_scratch, g, 0, g->n, products);
            r.ldb = 0;
        }
        ok = ok && (a_by_tiles ? J.a_blocks != NULL : r.a != NULL) &&
             (b_by_tiles ? J.b_blocks != NULL : r.b != NULL);
    }
    DSC_CHECK(ok, DSC_ERR_NOMEM,
              "dsc_kernel_linear_backward: %s copies of dy (%lld x %lld) and x (%lld x %lld), and %d tiles",
              dsc_dtype_name(products), (long long)g->k, (long long)g->m, (long long)g->k, (long long)g->n, nt);
    J.g = &r;
    const int64_t tiles = (g->m + J.rows - 1) / J.rows * J.col_tiles;
    if (nt == 1) {
        J.pool = false; /* omp_get_thread_num() is 0 outside a region */
        for (int64_t p = 0; p < tiles; p++)
            add_rounded_tile(&J, p);
    } else if (J.pool) {
        dsc_cpu_pool_run_upto(add_rounded_tile, &J, tiles, nt);
    } else {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t p = 0; p < tiles; p++)
            add_rounded_tile(&J, p);
    }
    return NULL;
}
