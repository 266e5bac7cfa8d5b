/* bench_tp_inference — tensor-parallel inference on the CPU: prefill and
 * decode tokens/s of a Llama-shaped model (hidden 768, 2 layers, 12 heads,
 * 4 KV heads, MLP 2048, vocab 8192, random f32 weights) with the world as
 * one tensor-parallel group, and the share of the step time spent in the
 * all-reduces. Run it once per layout and compare (bench/bench_tp_inference.sh
 * does TP 1 with 2 threads against TP 2 with 1 thread per rank and prints
 * the ratio):
 *   DSC_NUM_THREADS=2 build/bench/bench_tp_inference
 *   DSC_NUM_THREADS=1 mpirun -np 2 build/bench/bench_tp_inference
 * Prefill: 4 sequences x 128 tokens in one forward; decode: 4 sequences, 32
 * steps after that prefill; best of 3. Rank 0 writes the model into DIR
 * (default /tmp/dsc_bench_tp_model) when it is not there. Prints, never asserts. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "dsc/comm.h"
#include "dsc/inference.h"
#include "dsc/kernels.h"
#include "dsc/safetensors.h"

enum { C = 768, L = 2, NH = 12, NKV = 4, HS = 64, F = 2048, V = 8192, SEQS = 4, PROMPT = 128, STEPS = 32 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_tp_inference: %s\n", dsc_status_message(s));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void write_model(const char *dir) {
    char path[600];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) die(dsc_error(DSC_ERR_IO, "cannot write %s", path));
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": %d, \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
            "\"num_key_value_heads\": %d, \"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-6}\n",
            V, C, F, L, NH, NKV);
    fclose(f);
    enum { MAX = 3 + 9 * L };
    char names[MAX][96];
    const char *ptrs[MAX];
    dsc_tensor t[MAX];
    float *data[MAX];
    int n = 0;
    uint64_t x = 88172645463325252ull;
    const char *per_layer[] = {"input_layernorm.weight",  "post_attention_layernorm.weight",
                               "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                               "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                               "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                               "mlp.down_proj.weight"};
    const int64_t rows[] = {C, C, NH * HS, NKV * HS, NKV * HS, C, F, F, C};
    const int64_t cols[] = {0, 0, C, C, C, NH * HS, C, C, F};
    for (int i = 0; i < 3 + 9 * L; i++) {
        int64_t r, c;
        if (i < 3) { /* embedding, LM head, final norm */
            const char *outer[] = {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"};
            snprintf(names[n], sizeof names[n], "%s", outer[i]);
            r = i < 2 ? V : C;
            c = i < 2 ? C : 0;
        } else {
            int l = (i - 3) / 9, k = (i - 3) % 9;
            snprintf(names[n], sizeof names[n], "model.layers.%d.%s", l, per_layer[k]);
            r = rows[k];
            c = cols[k];
        }
        int64_t numel = c ? r * c : r, shape[2] = {r, c};
        data[n] = malloc((size_t)numel * sizeof(float));
        for (int64_t j = 0; j < numel; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            data[n][j] = c ? ((float)(x >> 40) / (float)(1u << 24) - 0.5f) * 0.05f : 1.0f;
        }
        ptrs[n] = names[n];
        t[n] = dsc_tensor_view(data[n], DSC_DTYPE_F32, c ? 2 : 1, shape, DSC_CPU);
        n++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    die(dsc_safetensors_write(path, n, ptrs, t, 0, NULL));
    for (int i = 0; i < n; i++)
        free(data[i]);
}

typedef struct phase {
    double seconds, comm;
} phase;

/* One prefill of SEQS x PROMPT tokens and STEPS decode steps on fresh sequences. */
static void run_once(dsc_infer_engine *e, dsc_infer_model *m, float *logits, uint64_t base, phase *prefill,
                     phase *decode) {
    static int32_t prompt[SEQS][PROMPT];
    const int32_t *toks[SEQS];
    int32_t counts[SEQS], next[SEQS];
    uint64_t uids[SEQS];
    for (int i = 0; i < SEQS; i++) {
        for (int j = 0; j < PROMPT; j++)
            prompt[i][j] = (i * 131 + j * 17) % V;
        toks[i] = prompt[i];
        counts[i] = PROMPT;
        uids[i] = base + (uint64_t)i;
    }
    double c0 = dsc_infer_model_comm_seconds(m), t0 = now_s();
    die(dsc_infer_engine_put(e, SEQS, uids, toks, counts, logits));
    double t1 = now_s(), c1 = dsc_infer_model_comm_seconds(m);
    int32_t W = dsc_infer_engine_logits_width(e);
    dsc_sampling_params g = dsc_sampling_params_greedy();
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < SEQS; i++) {
            die(dsc_infer_engine_sample(e, logits + (size_t)i * (size_t)W, &g, NULL, 0, NULL, &next[i]));
            toks[i] = &next[i];
            counts[i] = 1;
        }
        die(dsc_infer_engine_put(e, SEQS, uids, toks, counts, logits));
    }
    double t2 = now_s(), c2 = dsc_infer_model_comm_seconds(m);
    for (int i = 0; i < SEQS; i++)
        die(dsc_infer_engine_flush(e, uids[i]));
    *prefill = (phase){t1 - t0, c1 - c0};
    *decode = (phase){t2 - t1, c2 - c1};
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *dir = argc > 1 ? argv[1] : "/tmp/dsc_bench_tp_model";
    dsc_comm *world;
    die(dsc_comm_world(NULL, &world));
    int rank = dsc_comm_rank(world), tp = dsc_comm_size(world);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat st;
    if (rank == 0 && stat(path, &st) != 0) write_model(dir);
    die(dsc_comm_barrier(world));
    dsc_infer_model *m;
    dsc_infer_tp opts = {.comm = world};
    die(dsc_infer_model_load_tp(dir, tp > 1 ? &opts : NULL, &m));
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.max_sequences = ec.max_batch_sequences = SEQS;
    ec.max_tokens_per_forward = SEQS * PROMPT;
    ec.kv_cache_bytes = 64ll << 20;
    dsc_infer_engine *e;
    die(dsc_infer_engine_create(m, &ec, &e));
    float *logits = malloc((size_t)SEQS * (size_t)dsc_infer_engine_logits_width(e) * sizeof *logits);
    phase best_p = {1e30, 0}, best_d = {1e30, 0};
    for (int rep = 0; rep < 3; rep++) {
        phase p, d;
        run_once(e, m, logits, 100 * (uint64_t)(rep + 1), &p, &d);
        if (p.seconds < best_p.seconds) best_p = p;
        if (d.seconds < best_d.seconds) best_d = d;
    }
    if (rank == 0)
        printf("tp %d x %d threads: prefill %.1f tokens/s (all-reduce %.1f%% of the step), decode %.1f tokens/s "
               "(all-reduce %.1f%%)\n",
               tp, dsc_kernels_get_num_threads(), SEQS * PROMPT / best_p.seconds,
               100.0 * best_p.comm / best_p.seconds, SEQS * STEPS / best_d.seconds,
               100.0 * best_d.comm / best_d.seconds);
    free(logits);
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    dsc_comm_free(world);
    MPI_Finalize();
    return 0;
}
