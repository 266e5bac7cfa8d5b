/* Random-weight Hugging Face checkpoints for the parallel inference tests
 * (see synth_model.h). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "dsc/safetensors.h"
#include "synth_model.h"
#include "test_mpi.h"

static uint64_t lcg = 12345;
static float urand(float scale) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return scale * ((float)(lcg >> 40) / (float)(1ull << 24) * 2.0f - 1.0f);
}

typedef struct tensors {
    char names[128][96];
    const char *ptrs[128];
    dsc_tensor t[128];
    float *data[128];
    int n;
} tensors;

static void add(tensors *w, const char *name, int64_t a, int64_t b, float center, float scale) {
    int i = w->n++;
    snprintf(w->names[i], sizeof w->names[i], "%s", name);
    w->ptrs[i] = w->names[i];
    int64_t shape[2] = {a, b}, n = b ? a * b : a;
    w->data[i] = malloc((size_t)n * sizeof(float));
    for (int64_t k = 0; k < n; k++)
        w->data[i][k] = center + urand(scale);
    w->t[i] = dsc_tensor_view(w->data[i], DSC_DTYPE_F32, b ? 2 : 1, shape, DSC_CPU);
}

/* A Hugging Face directory with config.json and random weights. */
void write_synth(const char *dir, const synth *s) {
    mkdir(dir, 0755);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(
        f,
        "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"intermediate_size\": %d, "
        "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
        "\"vocab_size\": %d, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
        "\"tie_word_embeddings\": %s, \"hidden_act\": \"silu\"}\n",
        s->arch, s->C, s->F, s->L, s->NH, s->NKV, s->HS, s->V, s->tied ? "true" : "false");
    fclose(f);
    tensors w = {.n = 0};
    int64_t Q = (int64_t)s->NH * s->HS, KV = (int64_t)s->NKV * s->HS;
    float a = 0.25f;
    add(&w, "model.embed_tokens.weight", s->V, s->C, 0, 1.0f);
    add(&w, "model.norm.weight", s->C, 0, 1.0f, 0.1f);
    if (!s->tied) add(&w, "lm_head.weight", s->V, s->C, 0, a);
    for (int l = 0; l < s->L; l++) {
        char n[96];
#define ADD(suffix, r, c, center, scale)                                                                          \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                                                       \
    add(&w, n, r, c, center, scale)
        ADD("input_layernorm.weight", s->C, 0, 1.0f, 0.1f);
        ADD("post_attention_layernorm.weight", s->C, 0, 1.0f, 0.1f);
        ADD("self_attn.q_proj.weight", Q, s->C, 0, a);
        ADD("self_attn.k_proj.weight", KV, s->C, 0, a);
        ADD("self_attn.v_proj.weight", KV, s->C, 0, a);
        ADD("self_attn.o_proj.weight", s->C, Q, 0, a);
        if (s->qkv_bias) {
            ADD("self_attn.q_proj.bias", Q, 0, 0, a);
            ADD("self_attn.k_proj.bias", KV, 0, 0, a);
            ADD("self_attn.v_proj.bias", KV, 0, 0, a);
        }
        ADD("mlp.gate_proj.weight", s->F, s->C, 0, a);
        ADD("mlp.up_proj.weight", s->F, s->C, 0, a);
        ADD("mlp.down_proj.weight", s->C, s->F, 0, a);
#undef ADD
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_ok(dsc_safetensors_write(path, w.n, w.ptrs, w.t, 0, NULL));
    for (int i = 0; i < w.n; i++)
        free(w.data[i]);
}

/* Rank 0 writes, the others wait: one directory per world size (ctest runs them side by side). */
void synth_dir(char *dir, size_t len, const char *name, const synth *s) {
    int size, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(dir, len, DSC_BINARY_DIR "/tests/inference/synth_%s_np%d", name, size);
    if (rank == 0) write_synth(dir, s);
    MPI_Barrier(MPI_COMM_WORLD);
}
