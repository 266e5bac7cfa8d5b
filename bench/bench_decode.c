/* bench_decode — single-sequence inference at the machine's limits, for
 * the comparison with llama.cpp (bench/peers/): decode tokens/s at batch 1
 * beside the memory-bandwidth roofline (weight bytes read per token ÷ the
 * read rate measured here, on the same threads), and prefill tokens/s of
 * one prompt beside the sgemm-rate limit (2 · weights · tokens FLOP at the
 * rate of a 768 x 768 x 512 GEMM, measured right after each prompt; the
 * ratio is the median of the per-prompt ratios), with the shares of its
 * phases: the projections' GEMMs and the paged attention, each timed alone
 * on the model's shapes, and the rest.
 *
 * With --batch B it also runs B sequences through the scheduler at once
 * (continuous batching: each a 16-token prompt, then `steps` greedy
 * tokens, all in the same forwards) and prints the generated tokens/s over
 * the whole run's wall time, the figure bench/peers/compare.py --batched
 * sets beside llama.cpp's server running the same B requests in parallel.
 *
 * Run: build/bench/bench_decode --model DIR [--weight-type f32|bf16|f16|q8_0] [--threads N]
 *                               [--steps 64] [--prefill 512] [--reps 3] [--batch B [--batch-only 1]]
 *                               [--kv-dtype f32|bf16]
 * DIR is a Hugging Face directory; bench/peers/make_llama.py writes the 134M
 * Llama of docs/performance.md. Prints one "key value" line per figure (the
 * peer driver parses them), never asserts. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_clock.h"
#include "dsc/inference.h"
#include "dsc/kernels.h"
#include "dsc/kv_cache.h"
#include "dsc/memory.h"

/* CPU seconds of the whole process (every thread; spinning counts): less
 * sensitive to other processes' load than wall time. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_decode: %s\n", dsc_status_message(s));
    exit(1);
}

/* The sum of n floats (n a multiple of 64) read once, with the widest loads the CPU has and
 * the weight streams' 2 KB prefetch (kernels/cpu): a read test with 8-byte scalar loads measured
 * 15-18 GB/s where the GEMVs streamed 23-25, so the roofline it divided was not the machine's. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static float sum_avx512(const float *p, size_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 64) {
        const char *ahead = (const char *)(p + i) + 2048;
        for (int k = 0; k < 4; k++)
            _mm_prefetch(ahead + 64 * k, _MM_HINT_T0);
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

__attribute__((target("avx2"))) static float sum_avx2(const float *p, size_t n) {
    __m256 a[8];
    for (int k = 0; k < 8; k++)
        a[k] = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 64) {
        const char *ahead = (const char *)(p + i) + 2048;
        for (int k = 0; k < 4; k++)
            _mm_prefetch(ahead + 64 * k, _MM_HINT_T0);
        for (int k = 0; k < 8; k++)
            a[k] = _mm256_add_ps(a[k], _mm256_loadu_ps(p + i + 8 * k));
    }
    float out[8], total = 0.0f;
    for (int k = 1; k < 8; k++)
        a[0] = _mm256_add_ps(a[0], a[k]);
    _mm256_storeu_ps(out, a[0]);
    for (int k = 0; k < 8; k++)
        total += out[k];
    return total;
}
#endif

static float sum_portable(const float *p, size_t n) {
    float acc[32] = {0}, total = 0.0f;
    for (size_t i = 0; i < n; i += 32)
        for (int j = 0; j < 32; j++)
            acc[j] += p[i + j];
    for (int j = 0; j < 32; j++)
        total += acc[j];
    return total;
}

static float sum_stream(const float *p, size_t n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return sum_avx512(p, n);
    if (__builtin_cpu_supports("avx2")) return sum_avx2(p, n);
#endif
    return sum_portable(p, n);
}

/* A buffer far larger than the caches, from dsc's allocator as the weights are, for read_rate. */
typedef struct read_buffer {
    float *data;
    size_t n;
} read_buffer;

static read_buffer read_buffer_make(void) {
    read_buffer b = {.n = (size_t)128 << 20}; /* 512 MiB of f32 */
    if (dsc_mem_alloc((void **)&b.data, b.n * sizeof *b.data, DSC_MEM_OTHER, DSC_CPU)) {
        fprintf(stderr, "bench_decode: no memory for the 512 MiB read-rate buffer\n");
        exit(1);
    }
    for (size_t i = 0; i < b.n; i++)
        b.data[i] = (float)(i & 7);
    return b;
}

static void read_buffer_free(read_buffer *b) {
    dsc_mem_free(b->data, b->n * sizeof *b->data, DSC_MEM_OTHER, DSC_CPU);
}

/* Read-only rate of `threads` threads streaming the buffer, each its contiguous share (as the
 * GEMVs' row chunks), best of `passes` passes (20 ms each at 25 GB/s), in bytes/s: the decode
 * roofline's divisor. */
static double read_rate(const read_buffer *b, int threads, int passes) {
    double best = 1e30;
    float sink = 0;
    const size_t share = b->n / (size_t)threads / 64 * 64;
    for (int r = 0; r < passes; r++) {
        double t = now_s();
        float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        total += sum_stream(b->data + (size_t)omp_get_thread_num() * share, share);
        t = now_s() - t;
        sink += total;
        best = t < best ? t : best;
    }
    if (sink == 42) printf("\n"); /* keeps the sums alive */
    return (double)(share * (size_t)threads * sizeof(float)) / best;
}

/* FLOP/s of dsc_kernel_linear_forward on prefill's typical shape (512 tokens, 768 -> 768). */
static double gemm_rate(void) {
    const int64_t n = 512, c = 768;
    float *x = calloc((size_t)(n * c), sizeof *x), *w = calloc((size_t)(c * c), sizeof *w),
          *y = calloc((size_t)(n * c), sizeof *y);
    dsc_tensor xv = dsc_tensor_view(x, DSC_DTYPE_F32, 2, (int64_t[]){n, c}, DSC_CPU);
    dsc_tensor wv = dsc_tensor_view(w, DSC_DTYPE_F32, 2, (int64_t[]){c, c}, DSC_CPU);
    dsc_tensor yv = dsc_tensor_view(y, DSC_DTYPE_F32, 2, (int64_t[]){n, c}, DSC_CPU);
    double best = 1e30;
    for (int r = 0; r < 8; r++) {
        double t = now_s();
        die(dsc_kernel_linear_forward(&yv, &xv, &wv, NULL));
        t = now_s() - t;
        best = t < best ? t : best;
    }
    free(x);
    free(w);
    free(y);
    return 2.0 * (double)(n * c * c) / best;
}

/* Tokens/s of the weight streaming alone: every projection one decode
 * token runs (fused q|k|v, attention output, gate|up, down, the LM head),
 * back to back over one input row, nothing else (best of 5 passes). Beside
 * decode_tok_s it says how much of a token is the GEMVs and how much the rest. */
static double gemv_rate(const dsc_infer_model *m) {
    const dsc_infer_model_config *mc = dsc_infer_model_get_config(m);
    const dsc_param_role roles[] = {DSC_PARAM_ROLE_QKV_W, DSC_PARAM_ROLE_ATTN_OUT_W, DSC_PARAM_ROLE_MLP1_W,
                                    DSC_PARAM_ROLE_MLP2_W};
    int64_t widest = mc->vocab_size > 4 * mc->d_ff ? mc->vocab_size : 4 * mc->d_ff;
    float *x = calloc((size_t)widest, sizeof *x), *y = calloc((size_t)widest, sizeof *y);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t = now_s();
        for (int32_t l = 0; l <= mc->n_layer; l++)
            for (int k = 0; k < (l < mc->n_layer ? 4 : 1); k++) {
                dsc_tensor w;
                if (dsc_infer_model_param(m, l < mc->n_layer ? l : -1,
                                          l < mc->n_layer ? roles[k] : DSC_PARAM_ROLE_UNEMBED, &w))
                    continue;
                int64_t oc = w.shape[0], c = k == 1   ? (int64_t)mc->n_head * mc->head_size
                                             : k == 3 ? mc->d_ff
                                                      : mc->d_model;
                dsc_tensor xv = dsc_tensor_view(x, DSC_DTYPE_F32, 2, (int64_t[]){1, c}, DSC_CPU);
                dsc_tensor yv = dsc_tensor_view(y, DSC_DTYPE_F32, 2, (int64_t[]){1, oc}, DSC_CPU);
                die(dsc_kernel_linear_forward_packed(&yv, &xv, &w, NULL, NULL));
            }
        t = now_s() - t;
        best = t < best ? t : best;
    }
    free(x);
    free(y);
    return 1.0 / best;
}

/* Seconds of rows [r0, r0 + rows) of weight w (format f) over x (n, c) into y, as the prefill runs
 * each projection: one GEMM per block of the fused parameters. */
static double time_rows(const dsc_tensor *w, dsc_weight_format f, int64_t r0, int64_t rows, float *x, float *y,
                        int64_t n, int64_t c, dsc_tensor *ws) {
    size_t rb = dsc_weight_row_bytes(f, c);
    dsc_tensor wv =
        dsc_tensor_view((char *)w->data + (size_t)r0 * rb, w->dtype, 2, (int64_t[]){rows, w->shape[1]}, DSC_CPU);
    dsc_tensor xv = dsc_tensor_view(x, DSC_DTYPE_F32, 2, (int64_t[]){n, c}, DSC_CPU);
    dsc_tensor yv = dsc_tensor_view(y, DSC_DTYPE_F32, 2, (int64_t[]){n, rows}, DSC_CPU);
    double t = now_s();
    die(dsc_kernel_linear_forward_packed(&yv, &xv, &wv, NULL, ws->data ? ws : NULL));
    return now_s() - t;
}

/* The prefill's two GEMM phases on their own, best of 3 passes over every layer at T tokens:
 * *linear the projections as the forward splits them (q, k, v, attention output, gate, up,
 * down), *attention the paged attention of one T-token prompt (12 heads of the model's
 * shape over a fresh cache). What prefill took beyond the two is the rest: norms, RoPE,
 * SwiGLU, residual adds, the KV writes' share outside attention, the last token's logits. */
static void prefill_phases(const dsc_infer_model *m, dsc_weight_format f, int32_t T, double *linear,
                           double *attention) {
    const dsc_infer_model_config *mc = dsc_infer_model_get_config(m);
    const int64_t C = mc->d_model, Q = (int64_t)mc->n_head * mc->head_size,
                  KV = (int64_t)mc->n_kv_head * mc->head_size, F = mc->d_ff, wide = Q > F ? Q : F;
    int threads = dsc_kernels_get_num_threads();
    int64_t wsf = dsc_kernel_linear_packed_workspace(f, wide, threads);
    float *x = calloc((size_t)(T * wide), sizeof *x), *y = calloc((size_t)(T * 2 * F + T * Q), sizeof *y);
    float *wsp = wsf ? calloc((size_t)wsf, sizeof *wsp) : NULL;
    dsc_tensor ws = dsc_tensor_view(wsp, DSC_DTYPE_F32, 1, &wsf, DSC_CPU);
    *linear = *attention = 1e30;
    for (int r = 0; r < 3; r++) {
        double t = 0;
        for (int32_t l = 0; l < mc->n_layer; l++) {
            dsc_tensor qkv, o, up, down;
            die(dsc_infer_model_param(m, l, DSC_PARAM_ROLE_QKV_W, &qkv));
            die(dsc_infer_model_param(m, l, DSC_PARAM_ROLE_ATTN_OUT_W, &o));
            die(dsc_infer_model_param(m, l, DSC_PARAM_ROLE_MLP1_W, &up));
            die(dsc_infer_model_param(m, l, DSC_PARAM_ROLE_MLP2_W, &down));
            t += time_rows(&qkv, f, 0, Q, x, y, T, C, &ws) + time_rows(&qkv, f, Q, KV, x, y, T, C, &ws) +
                 time_rows(&qkv, f, Q + KV, KV, x, y, T, C, &ws) + time_rows(&o, f, 0, C, x, y, T, Q, &ws);
            for (int64_t r0 = 0; r0 < up.shape[0]; r0 += F) /* gate, then up (a GELU MLP has one) */
                t += time_rows(&up, f, r0, F, x, y, T, C, &ws);
            t += time_rows(&down, f, 0, C, x, y, T, F, &ws);
        }
        *linear = t < *linear ? t : *linear;
    }
    dsc_kv_config kc = {.num_layers = 1,
                        .num_kv_heads = mc->n_kv_head,
                        .head_size = mc->head_size,
                        .block_size = 16,
                        .max_sequences = 1,
                        .max_context = T,
                        .max_tokens_per_forward = T,
                        .max_batch_sequences = 1,
                        .dtype = DSC_DTYPE_F32};
    kc.kv_cache_bytes = (int64_t)dsc_kv_config_block_bytes(&kc) * (T / 16 + 2);
    dsc_kv_cache *cache;
    dsc_kv_state *state;
    dsc_ragged_batch batch;
    die(dsc_kv_cache_create(&cache, &kc, DSC_CPU));
    die(dsc_kv_state_create(&state, &kc, dsc_kv_cache_blocks(cache)));
    die(dsc_ragged_batch_init(&batch, &kc));
    dsc_tensor layer;
    die(dsc_kv_cache_layer(cache, 0, &layer));
    int32_t *tokens = calloc((size_t)T, sizeof *tokens);
    const int32_t *tp = tokens;
    uint64_t uid = 1;
    float *q = y, *k = q + T * Q, *v = k + T * KV, *out = x; /* contents do not matter for the time */
    int64_t qs[3] = {T, mc->n_head, mc->head_size}, ks[3] = {T, mc->n_kv_head, mc->head_size};
    dsc_tensor tq = dsc_tensor_view(q, DSC_DTYPE_F32, 3, qs, DSC_CPU),
               tk = dsc_tensor_view(k, DSC_DTYPE_F32, 3, ks, DSC_CPU);
    dsc_tensor tv = dsc_tensor_view(v, DSC_DTYPE_F32, 3, ks, DSC_CPU),
               to = dsc_tensor_view(out, DSC_DTYPE_F32, 3, qs, DSC_CPU);
    for (int r = 0; r < 3; r++) {
        double t = 0;
        for (int32_t l = 0; l < mc->n_layer; l++) {
            die(dsc_ragged_batch_build(&batch, state, 1, &uid, &tp, &T));
            double t0 = now_s();
            die(dsc_paged_attention_forward(&to, &tq, &tk, &tv, &batch, &layer));
            t += now_s() - t0;
            die(dsc_ragged_batch_finish(&batch, state));
            die(dsc_kv_state_flush(state, uid));
        }
        *attention = t < *attention ? t : *attention;
    }
    dsc_ragged_batch_free(&batch);
    dsc_kv_state_destroy(state);
    dsc_kv_cache_destroy(cache);
    free(tokens);
    free(x);
    free(y);
    free(wsp);
}

static dsc_status count_token(void *user, uint64_t uid, int32_t token, bool finished) {
    (void)uid, (void)token, (void)finished;
    ++*(int64_t *)user;
    return NULL;
}

/* Generated tokens/s of `batch` requests (a 16-token prompt each, then
 * `steps` greedy tokens, stop tokens off) through one scheduler: wall time
 * from the first submit to the last token, prompts included. */
/* The KV cache's type (--kv-dtype f32|bf16): llama.cpp's default cache is f16, half of f32's bytes. */
static dsc_dtype kv_dtype = DSC_DTYPE_F32;

static double batched_rate(dsc_infer_model *m, int32_t batch, int32_t steps) {
    const int32_t prompt_len = 16;
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.max_sequences = batch;
    ec.max_batch_sequences = batch;
    ec.max_tokens_per_forward = batch * prompt_len > 512 ? batch * prompt_len : 512;
    ec.max_context = prompt_len + steps + 16;
    ec.kv_cache_bytes = 512ll << 20;
    ec.kv_dtype = kv_dtype;
    dsc_infer_engine *e;
    die(dsc_infer_engine_create(m, &ec, &e));
    int64_t generated = 0;
    dsc_scheduler_config sc = dsc_scheduler_config_default(e);
    dsc_scheduler *s;
    die(dsc_scheduler_create(e, &sc, count_token, &generated, &s));
    int32_t vocab = dsc_infer_model_get_config(m)->vocab_size, prompt[16];
    double t = now_s();
    for (int32_t i = 0; i < batch; i++) {
        for (int32_t j = 0; j < prompt_len; j++)
            prompt[j] = (int32_t)(((i * prompt_len + j) * 7919 + 11) % vocab);
        dsc_gen_request req = {.uid = (uint64_t)i + 1,
                               .prompt = prompt,
                               .n_prompt = prompt_len,
                               .max_new_tokens = steps,
                               .sampling = dsc_sampling_params_greedy(),
                               .seed = (uint64_t)i};
        die(dsc_scheduler_submit(s, &req));
    }
    die(dsc_scheduler_run(s));
    t = now_s() - t;
    dsc_scheduler_destroy(s);
    dsc_infer_engine_destroy(e);
    if (generated != (int64_t)batch * steps) {
        fprintf(stderr, "bench_decode: batched run generated %lld of %lld tokens\n", (long long)generated,
                (long long)batch * steps);
        exit(1);
    }
    return (double)generated / t;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *weight_type = "f32";
    int32_t steps = 64, prefill_len = 512, reps = 3, batch = 0, batch_only = 0, gemv_only = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model_dir = argv[i + 1];
        else if (strcmp(argv[i], "--weight-type") == 0)
            weight_type = argv[i + 1];
        else if (strcmp(argv[i], "--kv-dtype") == 0 &&
                 (!strcmp(argv[i + 1], "f32") || !strcmp(argv[i + 1], "bf16")))
            kv_dtype = strcmp(argv[i + 1], "bf16") == 0 ? DSC_DTYPE_BF16 : DSC_DTYPE_F32;
        else if (strcmp(argv[i], "--threads") == 0)
            dsc_kernels_set_num_threads(atoi(argv[i + 1]));
        else if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--prefill") == 0)
            prefill_len = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0)
            batch = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch-only") == 0)
            batch_only = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--gemv-only") == 0)
            gemv_only = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_decode: unknown option or value: %s %s\n", argv[i], argv[i + 1]);
            return 2;
        }
    }
    if (!model_dir || steps < 1 || prefill_len < 1 || reps < 1 || reps > 64 || batch < 0 || batch > 1024) {
        fprintf(stderr,
                "usage: bench_decode --model DIR [--weight-type f32|bf16|f16|q8_0] [--threads N] "
                "[--steps N] [--prefill N] [--reps N] [--batch B [--batch-only 1]] [--kv-dtype f32|bf16]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int threads = dsc_kernels_get_num_threads();
    dsc_infer_model *m;
    die(dsc_infer_model_load(model_dir, &m));
    dsc_weight_format format;
    die(dsc_weight_format_from_name(weight_type, &format));
    die(dsc_infer_model_set_weight_type(m, format));
    const dsc_infer_model_config *mc = dsc_infer_model_get_config(m);
    if (gemv_only > 0) {
        /* The weight streaming against the read rate only, alternating, best of each: on a busy
         * machine the best of many short runs is the nearest to a quiet one. */
        double bw = 0, gemv = 0;
        read_buffer rb = read_buffer_make();
        for (int r = 0; r < gemv_only; r++) {
            double b = read_rate(&rb, threads, 20), g = gemv_rate(m);
            bw = b > bw ? b : bw;
            gemv = g > gemv ? g : gemv;
        }
        double bytes = (double)dsc_infer_model_arena_bytes(m) - 4.0 * mc->vocab_size * mc->d_model;
        printf("weight_type %s threads %d read_GB_s %.2f gemv_GB_s %.2f gemv_of_read %.3f\n", weight_type, threads,
               bw / 1e9, gemv * bytes / 1e9, gemv * bytes / bw);
        read_buffer_free(&rb);
        dsc_infer_model_destroy(m);
        return 0;
    }
    if (batch > 0) {
        double rate[64];
        for (int r = 0; r < reps; r++)
            rate[r] = batched_rate(m, batch, steps);
        qsort(rate, (size_t)reps, sizeof *rate, cmp_double);
        printf("model %s weight_type %s kv_dtype %s threads %d batch %d\n", model_dir, weight_type,
               dsc_dtype_name(kv_dtype), threads, batch);
        printf("batched_tok_s %.2f\nbatched_tok_s_min %.2f\n", rate[reps / 2], rate[0]);
        if (batch_only) {
            dsc_infer_model_destroy(m);
            return 0;
        }
    }
    /* Every weight is read once per token except the embedding table (one row). */
    double embed_bytes = 4.0 * mc->vocab_size * mc->d_model;
    double bytes_per_token = (double)dsc_infer_model_arena_bytes(m) - embed_bytes;
    /* Prefill FLOP: 2 per layer weight per token, plus causal attention
     * (QK^T and PV over half the T x T square), logits of the last token only. */
    const int64_t C = mc->d_model, Q = (int64_t)mc->n_head * mc->head_size,
                  KV = (int64_t)mc->n_kv_head * mc->head_size, F = mc->d_ff, T = prefill_len;
    double prefill_flop = 2.0 * (double)mc->n_layer * (double)(C * (Q + 2 * KV) + Q * C + 3 * C * F) * (double)T +
                          2.0 * (double)mc->n_layer * (double)T * (double)T * (double)Q;

    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.max_tokens_per_forward = prefill_len;
    ec.max_batch_sequences = 1;
    ec.max_sequences = 1;
    ec.max_context = prefill_len + steps + 16;
    ec.kv_cache_bytes = 256ll << 20;
    ec.kv_dtype = kv_dtype;
    dsc_infer_engine *e;
    die(dsc_infer_engine_create(m, &ec, &e));
    float *logits = malloc((size_t)dsc_infer_engine_logits_width(e) * sizeof *logits);
    int32_t *prompt = malloc((size_t)prefill_len * sizeof *prompt);
    for (int32_t i = 0; i < prefill_len; i++)
        prompt[i] = (int32_t)((i * 7919 + 11) % mc->vocab_size);
    uint64_t uid = 0;
    double dec[64], pre[64], cpu[64], gemm[64], of_limit[64], read[64], of_roof[64];
    read_buffer rb = read_buffer_make();
    for (int r = 0; r < reps; r++) {
        /* prefill: the whole prompt in one forward */
        const int32_t *p = prompt;
        double t = now_s();
        die(dsc_infer_engine_put(e, 1, &uid, &p, &prefill_len, logits));
        pre[r] = prefill_len / (now_s() - t);
        /* The limit right after, so each ratio pairs two figures of the same moment of a shared machine. */
        gemm[r] = gemm_rate();
        of_limit[r] = pre[r] / (gemm[r] * T / prefill_flop);
        die(dsc_infer_engine_flush(e, uid));
        /* decode: `steps` greedy tokens after a 16-token prompt */
        int32_t n16 = 16, one = 1, next;
        die(dsc_infer_engine_put(e, 1, &uid, &p, &n16, logits));
        t = now_s();
        double c0 = cpu_s();
        for (int32_t s = 0; s < steps; s++) {
            int32_t V = dsc_infer_engine_logits_width(e), best = 0;
            for (int32_t v = 1; v < V; v++)
                if (logits[v] > logits[best]) best = v;
            next = best;
            const int32_t *np = &next;
            die(dsc_infer_engine_put(e, 1, &uid, &np, &one, logits));
        }
        dec[r] = steps / (now_s() - t);
        cpu[r] = 1e3 * (cpu_s() - c0) / steps;
        /* The read rate right after, for the same reason as the sgemm rate above: the memory
         * bandwidth this VM gets moved between 27 and 62 GB/s from one second to the next. */
        read[r] = read_rate(&rb, threads, 8);
        of_roof[r] = dec[r] / (read[r] / bytes_per_token);
        die(dsc_infer_engine_flush(e, uid));
    }
    read_buffer_free(&rb);
    qsort(dec, (size_t)reps, sizeof *dec, cmp_double);
    qsort(pre, (size_t)reps, sizeof *pre, cmp_double);
    qsort(gemm, (size_t)reps, sizeof *gemm, cmp_double);
    qsort(of_limit, (size_t)reps, sizeof *of_limit, cmp_double);
    qsort(cpu, (size_t)reps, sizeof *cpu, cmp_double);
    qsort(read, (size_t)reps, sizeof *read, cmp_double);
    qsort(of_roof, (size_t)reps, sizeof *of_roof, cmp_double);
    double bw = read[reps / 2], flops = gemm[reps / 2], gemv = gemv_rate(m);
    double roof_dec = bw / bytes_per_token, roof_pre = flops * T / prefill_flop;
    printf("model %s weight_type %s kv_dtype %s threads %d bytes_per_token %.0f\n", model_dir, weight_type,
           dsc_dtype_name(kv_dtype), threads, bytes_per_token);
    printf("decode_tok_s %.2f\ndecode_tok_s_min %.2f\n", dec[reps / 2], dec[0]);
    printf("decode_cpu_ms_per_tok %.2f\n", cpu[reps / 2]);
    printf("prefill_tok_s %.2f\nprefill_tok_s_min %.2f\n", pre[reps / 2], pre[0]);
    printf("read_GB_s %.2f\ndecode_roofline_tok_s %.2f\ndecode_of_roofline %.3f\ndecode_of_roofline_min %.3f\n",
           bw / 1e9, roof_dec, of_roof[reps / 2], of_roof[0]);
    printf("gemv_only_tok_s %.2f\ngemv_only_of_roofline %.3f\n", gemv, gemv / roof_dec);
    printf("gemm_GFLOP_s %.1f\nprefill_limit_tok_s %.1f\nprefill_of_limit %.3f\nprefill_of_limit_min %.3f\n",
           flops / 1e9, roof_pre, of_limit[reps / 2], of_limit[0]);
    double linear, attention, prefill_s = T / pre[reps / 2];
    prefill_phases(m, format, T, &linear, &attention);
    printf("prefill_ms %.1f\nprefill_linear_ms %.1f\nprefill_linear_share %.3f\nprefill_attention_ms %.1f\n"
           "prefill_attention_share %.3f\nprefill_rest_share %.3f\n",
           1e3 * prefill_s, 1e3 * linear, linear / prefill_s, 1e3 * attention, attention / prefill_s,
           1 - (linear + attention) / prefill_s);
    free(prompt);
    free(logits);
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    return 0;
}
