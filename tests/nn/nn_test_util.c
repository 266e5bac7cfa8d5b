/* Whole-model runner and fixture loader for the nn tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_test_util.h"
#include "test_layers.h"
#include "test_mpi.h"

void test_tiny_config(dsc_model_config *mc, dsc_model_arch arch) {
    dsc_model_config_defaults(mc, arch);
    mc->n_layer = 2;
    mc->d_model = 16;
    mc->n_head = 4;
    mc->n_kv_head = arch == DSC_ARCH_LLAMA ? 2 : 4;
    mc->d_ff = arch == DSC_ARCH_LLAMA ? 24 : 64;
    mc->vocab_size = 29;
    mc->seq_len = 8;
    mc->init_std = 0.2f;
}

dsc_status test_model_build(test_model *m, const dsc_model_config *mc, dsc_device device, uint64_t seed, int slots,
                            int64_t B, int64_t T) {
    memset(m, 0, sizeof *m);
    m->mc = *mc;
    DSC_TRY(dsc_nn_register_dense_layers());
    dsc_status s = dsc_test_layers_build(&m->mc, device, NULL, seed, slots, B, T, &m->store, &m->layers, &m->n);
    if (s) memset(m, 0, sizeof *m);
    return s;
}

void test_model_free(test_model *m) {
    dsc_test_layers_free(m->store, m->layers, m->n);
    memset(m, 0, sizeof *m);
}

dsc_status test_model_forward(test_model *m, int slot, const dsc_tensor *tokens, const dsc_tensor *targets,
                              double *loss) {
    dsc_micro_ctx ctx = {.tokens = tokens, .targets = targets, .loss_scale = 1.0f, .training = true};
    DSC_TRY(dsc_test_layers_forward(m->layers, m->n, slot, &ctx));
    *loss = ctx.loss;
    return NULL;
}

dsc_status test_model_backward(test_model *m, int slot, float loss_scale) {
    dsc_micro_ctx ctx = {.loss_scale = loss_scale, .training = true};
    return dsc_test_layers_backward(m->layers, m->n, slot, &ctx);
}

/* ---- fixtures ------------------------------------------------------------------------ */

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open fixture %s (run /usr/bin/python3 tests/ref/make_model_fixtures.py)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) fail_msg("cannot read fixture %s", path);
    ((char *)buf)[n] = 0;
    fclose(f);
    *size = (size_t)n;
    return buf;
}

void fixture_load(fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    char path[512];
    size_t blob_size, idx_size;
    snprintf(path, sizeof path, "%s/tests/nn/fixtures/%s.bin", DSC_SOURCE_DIR, name);
    f->blob = read_file(path, &blob_size);
    snprintf(path, sizeof path, "%s/tests/nn/fixtures/%s.idx", DSC_SOURCE_DIR, name);
    char *idx = read_file(path, &idx_size);
    int lines = 0;
    for (char *c = idx; *c; c++)
        lines += *c == '\n';
    f->arrays = calloc((size_t)lines, sizeof *f->arrays);
    for (char *line = strtok(idx, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "meta ", 5) == 0) {
            if (f->n_meta == 64 || sscanf(line + 5, "%31s %31s", f->keys[f->n_meta], f->values[f->n_meta]) != 2)
                fail_msg("bad meta line in %s: %s", path, line);
            f->n_meta++;
            continue;
        }
        fixture_array *a = &f->arrays[f->n_arrays];
        char dtype[8];
        long long offset, d[4] = {0};
        int got = sscanf(line, "%159s %7s %lld %d %lld %lld %lld %lld", a->name, dtype, &offset, &a->ndim, &d[0],
                         &d[1], &d[2], &d[3]);
        if (got < 4 || a->ndim > 4 || got != 4 + a->ndim) fail_msg("bad array line in %s: %s", path, line);
        a->is_int = strcmp(dtype, "i32") == 0;
        a->numel = 1;
        for (int i = 0; i < a->ndim; i++) {
            a->shape[i] = d[i];
            a->numel *= d[i];
        }
        if ((size_t)offset + (size_t)a->numel * 4 > blob_size)
            fail_msg("array %s runs past %s.bin", a->name, name);
        a->data = (char *)f->blob + offset;
        f->n_arrays++;
    }
    free(idx);
}

void fixture_free(fixture *f) {
    free(f->arrays);
    free(f->blob);
    memset(f, 0, sizeof *f);
}

const fixture_array *fixture_get(const fixture *f, const char *name) {
    for (int i = 0; i < f->n_arrays; i++)
        if (strcmp(f->arrays[i].name, name) == 0) return &f->arrays[i];
    return NULL;
}

const char *fixture_meta_str(const fixture *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->keys[i], key) == 0) return f->values[i];
    fail_msg("fixture has no meta key %s", key);
    return NULL;
}

double fixture_meta(const fixture *f, const char *key) {
    return atof(fixture_meta_str(f, key));
}

void fixture_model_config(const fixture *f, dsc_model_config *mc) {
    dsc_model_arch arch;
    assert_ok(dsc_model_arch_from_name(fixture_meta_str(f, "arch"), &arch));
    dsc_model_config_defaults(mc, arch);
    mc->n_layer = (int)fixture_meta(f, "n_layer");
    mc->d_model = (int)fixture_meta(f, "d_model");
    mc->n_head = (int)fixture_meta(f, "n_head");
    mc->n_kv_head = (int)fixture_meta(f, "n_kv_head");
    mc->d_ff = (int)fixture_meta(f, "d_ff");
    mc->vocab_size = (int)fixture_meta(f, "vocab_size");
    mc->seq_len = (int)fixture_meta(f, "seq_len");
    mc->tie_embeddings = fixture_meta(f, "tie_embeddings") != 0;
    mc->qkv_bias = fixture_meta(f, "qkv_bias") != 0;
    mc->rope_theta = (float)fixture_meta(f, "rope_theta");
    mc->norm_eps = (float)fixture_meta(f, "norm_eps");
}
