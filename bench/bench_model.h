/* A random-weight Llama checkpoint (config.json + model.safetensors) for
 * the inference benchmarks: bench_tp_inference and bench_pp_inference
 * write their models with it. Header-only (each benchmark is one program). */
#ifndef DSC_BENCH_MODEL_H
#define DSC_BENCH_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "dsc/comm.h"
#include "dsc/safetensors.h"

typedef struct bench_llama {
    int C, L, NH, NKV, HS, F, V;
} bench_llama;

static dsc_status bench_write_llama(const char *dir, const bench_llama *m) {
    const int64_t C = m->C, L = m->L, NH = m->NH, NKV = m->NKV, HS = m->HS, F = m->F, V = m->V;
    char path[600];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    DSC_CHECK(f, DSC_ERR_IO, "cannot write %s", path);
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": %d, \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
            "\"num_key_value_heads\": %d, \"head_dim\": %d, \"max_position_embeddings\": 1024, \"rms_norm_eps\": "
            "1e-6}\n",
            (int)V, (int)C, (int)F, (int)L, (int)NH, (int)NKV, (int)HS);
    fclose(f);
    int total = (int)(3 + 9 * L), n = 0;
    char(*names)[96] = malloc((size_t)total * sizeof *names);
    const char **ptrs = malloc((size_t)total * sizeof *ptrs);
    dsc_tensor *t = malloc((size_t)total * sizeof *t);
    float **data = malloc((size_t)total * sizeof *data);
    DSC_CHECK(names && ptrs && t && data, DSC_ERR_NOMEM, "%d tensors", total);
    uint64_t x = 88172645463325252ull;
    const char *per_layer[] = {"input_layernorm.weight",  "post_attention_layernorm.weight",
                               "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                               "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                               "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                               "mlp.down_proj.weight"};
    const int64_t rows[] = {C, C, NH * HS, NKV * HS, NKV * HS, C, F, F, C};
    const int64_t cols[] = {0, 0, C, C, C, NH * HS, C, C, F};
    for (int i = 0; i < total; i++) {
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
    dsc_status s = dsc_safetensors_write(path, n, ptrs, t, 0, NULL);
    for (int i = 0; i < n; i++)
        free(data[i]);
    free(names), free(ptrs), free(t), free(data);
    return s;
}

/* Rank 0 of `world` writes the model into dir unless it is there; every rank then has it. */
static dsc_status bench_llama_prepare(dsc_comm *world, const char *dir, const bench_llama *m) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat st;
    if (dsc_comm_rank(world) == 0 && stat(path, &st) != 0) DSC_TRY(bench_write_llama(dir, m));
    return dsc_comm_barrier(world);
}

static double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
