/* bench_inference — the inference engine on a ~100M-parameter Llama-shaped
 * model (hidden 768, 12 layers, 12 heads, 4 KV heads, MLP 2048, vocab
 * 16384), CPU, float32:
 *   1. prefill tokens/s at batch 1 (512 tokens) and 32 (32 x 128), and decode
 *      tokens/s at batch 1 and 32 (32 steps after a 128-token prompt), beside
 *      transformers on the same model and threads when its log is given
 *      (bench/hf_generate_ref.py writes the model and the log);
 *   2. continuous batching (Dynamic SplitFuse, decode-first and
 *      prefill-first) against static batching on a synthetic workload of
 *      mixed prompt and output lengths: throughput, time to first token, KV
 *      utilisation.
 *
 * Run: build/bench/bench_inference [--model DIR] [--hf-log FILE] [--threads N] [--requests N]
 *                                   [--batching-only 1]
 * Without --model the weights are random (same shapes). Best of 2 for the
 * throughput figures (the machine is shared). Prints, never asserts. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_clock.h"
#include "dsc/inference.h"
#include "dsc/kernels.h"
#include "dsc/rng.h"

static const char *const config_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 16384, \"hidden_size\": 768,"
    " \"intermediate_size\": 2048, \"num_hidden_layers\": 12, \"num_attention_heads\": 12,"
    " \"num_key_value_heads\": 4, \"max_position_embeddings\": 2048, \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": false}";

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_inference: %s\n", dsc_status_message(s));
    exit(1);
}

/* ---- random weights under Hugging Face names --------------------------------------------- */
enum { MAX_TENSORS = 256 };
typedef struct random_source {
    char names[MAX_TENSORS][96];
    int ndim[MAX_TENSORS];
    int64_t shape[MAX_TENSORS][2];
    int64_t count;
} random_source;

static void add(random_source *r, const char *name, int64_t rows, int64_t cols) {
    snprintf(r->names[r->count], sizeof r->names[0], "%s", name);
    r->ndim[r->count] = cols ? 2 : 1;
    r->shape[r->count][0] = rows;
    r->shape[r->count][1] = cols;
    r->count++;
}

static void rs_describe(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape) {
    random_source *r = impl;
    *name = r->names[i];
    *ndim = r->ndim[i];
    memcpy(shape, r->shape[i], sizeof r->shape[i]);
}

static dsc_status rs_read(void *impl, int64_t i, float *dst, int64_t numel) {
    random_source *r = impl;
    dsc_rng rng;
    dsc_rng_init(&rng, 1000 + (uint64_t)i, 0, DSC_RNG_INIT);
    bool norm = r->ndim[i] == 1;
    for (int64_t k = 0; k < numel; k++)
        dst[k] = norm ? 1.0f : (float)(0.02 * dsc_rng_normal(&rng));
    return NULL;
}

static dsc_infer_model *random_model(void) {
    const dsc_policy *p;
    die(dsc_policy_find("LlamaForCausalLM", &p));
    dsc_infer_model_config mc;
    die(p->configure(&mc, config_json, "bench config"));
    random_source *r = calloc(1, sizeof *r);
    int64_t C = mc.d_model, KV = (int64_t)mc.n_kv_head * mc.head_size, F = mc.d_ff, V = mc.vocab_size;
    add(r, "model.embed_tokens.weight", V, C);
    add(r, "model.norm.weight", C, 0);
    add(r, "lm_head.weight", V, C);
    char n[96];
    const struct {
        const char *name;
        int64_t rows, cols;
    } per_layer[] = {{"input_layernorm.weight", C, 0},   {"post_attention_layernorm.weight", C, 0},
                     {"self_attn.q_proj.weight", C, C},  {"self_attn.k_proj.weight", KV, C},
                     {"self_attn.v_proj.weight", KV, C}, {"self_attn.o_proj.weight", C, C},
                     {"mlp.gate_proj.weight", F, C},     {"mlp.up_proj.weight", F, C},
                     {"mlp.down_proj.weight", C, F}};
    for (int l = 0; l < mc.n_layer; l++)
        for (size_t j = 0; j < sizeof per_layer / sizeof per_layer[0]; j++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", l, per_layer[j].name);
            add(r, n, per_layer[j].rows, per_layer[j].cols);
        }
    dsc_tensor_source src = {r, r->count, rs_describe, rs_read, NULL};
    dsc_infer_model *m;
    die(dsc_infer_model_build(p, &mc, &src, &m));
    free(r);
    return m;
}

/* ---- 1. prefill and decode throughput -------------------------------------------------------- */
static dsc_infer_engine *engine(dsc_infer_model *m, int32_t tokens, int32_t seqs, int64_t kv_bytes) {
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.max_tokens_per_forward = tokens;
    ec.max_batch_sequences = seqs;
    ec.max_sequences = seqs;
    ec.max_context = 1024;
    ec.kv_cache_bytes = kv_bytes;
    dsc_infer_engine *e;
    die(dsc_infer_engine_create(m, &ec, &e));
    return e;
}

/* batch sequences of `len` random tokens in one forward; returns seconds. */
static double prefill(dsc_infer_engine *e, int32_t batch, int32_t len, float *logits) {
    int32_t V = dsc_infer_engine_vocab_size(e);
    int32_t *tok = malloc((size_t)batch * (size_t)len * sizeof *tok), counts[64];
    uint64_t uids[64];
    const int32_t *ptrs[64];
    for (int64_t i = 0; i < (int64_t)batch * len; i++)
        tok[i] = (int32_t)((i * 7919) % V);
    for (int32_t b = 0; b < batch; b++) {
        uids[b] = (uint64_t)b;
        ptrs[b] = tok + (int64_t)b * len;
        counts[b] = len;
    }
    double t = now_s();
    die(dsc_infer_engine_put(e, batch, uids, ptrs, counts, logits));
    t = now_s() - t;
    free(tok);
    return t;
}

static void flush_all(dsc_infer_engine *e, int32_t batch) {
    for (int32_t b = 0; b < batch; b++)
        die(dsc_infer_engine_flush(e, (uint64_t)b));
}

/* `steps` greedy decode forwards of `batch` sequences after their prompts; returns seconds. */
static double decode(dsc_infer_engine *e, int32_t batch, int32_t steps, float *logits) {
    int32_t V = dsc_infer_engine_vocab_size(e), next[64], one[64];
    uint64_t uids[64];
    const int32_t *ptrs[64];
    for (int32_t b = 0; b < batch; b++) {
        uids[b] = (uint64_t)b;
        ptrs[b] = &next[b];
        one[b] = 1;
    }
    double t = now_s();
    for (int32_t s = 0; s < steps; s++) {
        for (int32_t b = 0; b < batch; b++) {
            const float *row = logits + (size_t)b * (size_t)V;
            int32_t best = 0;
            for (int32_t v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            next[b] = best;
        }
        die(dsc_infer_engine_put(e, batch, uids, ptrs, one, logits));
    }
    return now_s() - t;
}

/* The figure for `key` in the transformers log, or 0. */
static double hf_figure(const char *log, const char *key) {
    if (!log) return 0;
    FILE *f = fopen(log, "r");
    if (!f) return 0;
    char line[256];
    double v = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, strlen(key)) == 0) sscanf(strchr(line, ':') + 1, "%lf", &v);
    fclose(f);
    return v;
}

static void report(const char *key, double tps, const char *hf_log) {
    double hf = hf_figure(hf_log, key);
    if (hf > 0)
        printf("%s: %9.1f tokens/s   transformers %9.1f   ratio %.2f\n", key, tps, hf, tps / hf);
    else
        printf("%s: %9.1f tokens/s   (transformers: run bench/hf_generate_ref.py, pass --hf-log)\n", key, tps);
}

static void throughput(dsc_infer_model *m, const char *hf_log) {
    int32_t V = dsc_infer_model_get_config(m)->vocab_size;
    float *logits = malloc(32 * (size_t)V * sizeof *logits);
    dsc_infer_engine *e = engine(m, 4096, 32, 512ll << 20);
    double best = 1e30;
    for (int r = 0; r < 2; r++, flush_all(e, 1)) {
        double t = prefill(e, 1, 512, logits);
        best = t < best ? t : best;
    }
    report("prefill batch 1 x 512 ", 512 / best, hf_log);
    best = 1e30;
    for (int r = 0; r < 2; r++, flush_all(e, 32)) {
        double t = prefill(e, 32, 128, logits);
        best = t < best ? t : best;
    }
    report("prefill batch 32 x 128", 32 * 128 / best, hf_log);
    const int32_t batches[2] = {1, 32};
    const char *keys[2] = {"decode  batch 1       ", "decode  batch 32      "};
    for (int k = 0; k < 2; k++) {
        best = 1e30;
        for (int r = 0; r < 2; r++) {
            prefill(e, batches[k], 128, logits);
            double t = decode(e, batches[k], 32, logits);
            best = t < best ? t : best;
            if (r == 1 && k == 1) {
                const dsc_kv_config *kv = dsc_infer_engine_kv_config(e);
                int32_t used = dsc_infer_engine_total_blocks(e) - dsc_infer_engine_free_blocks(e);
                double held = 32.0 * (128 + 32);
                printf("KV cache: %d blocks of %d tokens, %zu bytes per block; after batch-32 decode %d blocks "
                       "hold %.0f tokens (%.1f%% of their slots filled; the rest is each sequence's last block)\n",
                       dsc_infer_engine_total_blocks(e), kv->block_size, dsc_kv_config_block_bytes(kv), used, held,
                       100.0 * held / ((double)used * kv->block_size));
            }
            flush_all(e, batches[k]);
        }
        report(keys[k], batches[k] * 32 / best, hf_log);
    }
    dsc_infer_engine_destroy(e);
    free(logits);
}

/* ---- 2. continuous vs static batching ---------------------------------------------------------- */
typedef struct workload {
    int32_t n;
    int32_t *prompt_len, *out_len;
    int32_t *tokens; /* (n, 128) */
} workload;

static dsc_status ignore_token(void *user, uint64_t uid, int32_t token, bool finished) {
    (void)user;
    (void)uid;
    (void)token;
    (void)finished;
    return NULL;
}

static void serve(dsc_infer_model *m, const workload *w, const char *name, dsc_scheduler_config cfg,
                  int32_t seqs) {
    dsc_infer_engine *e = engine(m, 512, seqs, 256ll << 20);
    dsc_scheduler *s;
    die(dsc_scheduler_create(e, &cfg, ignore_token, NULL, &s));
    double t = now_s();
    for (int32_t i = 0; i < w->n; i++) {
        dsc_gen_request r = {.uid = (uint64_t)i,
                             .prompt = w->tokens + (int64_t)i * 128,
                             .n_prompt = w->prompt_len[i],
                             .max_new_tokens = w->out_len[i],
                             .sampling = dsc_sampling_params_greedy()};
        die(dsc_scheduler_submit(s, &r));
    }
    die(dsc_scheduler_run(s));
    t = now_s() - t;
    const dsc_scheduler_stats *st = dsc_scheduler_get_stats(s);
    double *ttft = malloc((size_t)w->n * sizeof *ttft), mean = 0;
    for (int32_t i = 0; i < w->n; i++)
        mean += (ttft[i] = dsc_scheduler_ttft(s, (uint64_t)i)) / w->n;
    qsort(ttft, (size_t)w->n, sizeof *ttft, cmp_double);
    printf("%-28s %6.1f s  %7.1f gen tok/s  %7.1f tok/s through the model  TTFT mean %6.2f p50 %6.2f p90 %6.2f "
           "max %6.2f s  %4lld forwards  KV mean %4.1f%% peak %4.1f%%  preemptions %lld\n",
           name, t, (double)st->tokens_generated / t, (double)st->tokens_forwarded / t, mean, ttft[w->n / 2],
           ttft[(w->n * 9) / 10], ttft[w->n - 1], (long long)st->forwards,
           100.0 * st->kv_utilisation_sum / (double)st->forwards, 100.0 * st->kv_utilisation_peak,
           (long long)st->preemptions);
    free(ttft);
    dsc_scheduler_destroy(s);
    dsc_infer_engine_destroy(e);
}

static void batching(dsc_infer_model *m, int32_t n) {
    workload w = {.n = n};
    w.prompt_len = malloc((size_t)n * sizeof *w.prompt_len);
    w.out_len = malloc((size_t)n * sizeof *w.out_len);
    w.tokens = malloc((size_t)n * 128 * sizeof *w.tokens);
    dsc_rng rng;
    dsc_rng_init(&rng, 9, 0, DSC_RNG_DATA);
    int64_t total_p = 0, total_o = 0;
    for (int32_t i = 0; i < n; i++) {
        w.prompt_len[i] = 8 + (int32_t)dsc_rng_below(&rng, 121);
        w.out_len[i] = 4 + (int32_t)dsc_rng_below(&rng, 61);
        total_p += w.prompt_len[i];
        total_o += w.out_len[i];
        for (int t = 0; t < 128; t++)
            w.tokens[i * 128 + t] = (int32_t)dsc_rng_below(&rng, 16384);
    }
    printf(
        "\nworkload: %d requests, all queued at t=0, prompts 8..128 (%lld tokens), outputs 4..64 (%lld tokens)\n",
        n, (long long)total_p, (long long)total_o);
    serve(m, &w, "continuous, decode-first", (dsc_scheduler_config){.token_budget = 512, .kv_reserve_tokens = -1},
          16);
    serve(m, &w, "continuous, prefill-first",
          (dsc_scheduler_config){.token_budget = 512,
                                 .prefill_priority = DSC_PREFILL_PRIORITY_PREFILL_FIRST,
                                 .kv_reserve_tokens = -1},
          16);
    serve(m, &w, "static, batches of 16",
          (dsc_scheduler_config){.token_budget = 512, .kv_reserve_tokens = -1, .static_batching = true}, 16);
    free(w.prompt_len);
    free(w.out_len);
    free(w.tokens);
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *hf_log = NULL;
    int32_t requests = 32;
    bool skip_throughput = false;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model_dir = argv[i + 1];
        else if (strcmp(argv[i], "--hf-log") == 0)
            hf_log = argv[i + 1];
        else if (strcmp(argv[i], "--threads") == 0)
            dsc_kernels_set_num_threads(atoi(argv[i + 1]));
        else if (strcmp(argv[i], "--requests") == 0)
            requests = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batching-only") == 0)
            skip_throughput = atoi(argv[i + 1]) != 0;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    dsc_infer_model *m = NULL;
    if (model_dir)
        die(dsc_infer_model_load(model_dir, &m));
    else
        m = random_model();
    printf("bench_inference: %s, %.1fM parameters (%zu MB arena), %d threads, %s weights\n",
           dsc_infer_model_arch(m), (double)dsc_infer_model_arena_bytes(m) / 4e6,
           dsc_infer_model_arena_bytes(m) >> 20, dsc_kernels_get_num_threads(), model_dir ? model_dir : "random");
    if (!skip_throughput) throughput(m, hf_log);
    batching(m, requests);
    dsc_infer_model_destroy(m);
    return 0;
}
