/* Hugging Face checkpoint layouts: the tiny Llama fixture rewritten as a
 * sharded checkpoint (model.safetensors.index.json + two shards, the second
 * in bf16 with one tensor in f16) loads into the same finalized weights:
 * every element is the original f32 value or its bf16/f16 rounding, and
 * both kinds occur; the logits stay within half-precision error of the f32
 * model's. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/inference.h"
#include "dsc/safetensors.h"
#include "test_mpi.h"

#define LLAMA DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama"

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    fclose(b);
}

/* Writes dir/model-0000{1,2}-of-00002.safetensors and the index; returns the tensor count. */
static int64_t write_sharded(const char *dir) {
    dsc_safetensors *st;
    assert_ok(dsc_safetensors_open(&st, LLAMA));
    int64_t n = dsc_safetensors_count(st), half = n / 2;
    const char **names = calloc((size_t)n, sizeof *names);
    dsc_tensor *tensors = calloc((size_t)n, sizeof *tensors);
    char index[16384];
    size_t used = (size_t)snprintf(index, sizeof index, "{\"metadata\": {}, \"weight_map\": {");
    for (int64_t i = 0; i < n; i++) {
        dsc_safetensors_tensor t;
        dsc_safetensors_at(st, i, &t);
        names[i] = t.name;
        /* The second shard is bf16, except one f16 tensor. */
        dsc_dtype dt = i < half ? DSC_DTYPE_F32 : (i == n - 1 ? DSC_DTYPE_F16 : DSC_DTYPE_BF16);
        assert_ok(dsc_tensor_alloc(&tensors[i], dt, t.ndim, t.shape, DSC_CPU, DSC_MEM_OTHER));
        dsc_tensor src;
        assert_ok(dsc_safetensors_view(st, t.name, &src));
        assert_ok(dsc_tensor_copy(&tensors[i], &src));
        used +=
            (size_t)snprintf(index + used, sizeof index - used, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                             i ? ", " : "", t.name, i < half ? 1 : 2);
    }
    snprintf(index + used, sizeof index - used, "}}");
    char path[512];
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    assert_ok(dsc_safetensors_write(path, half, names, tensors, 0, NULL));
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    assert_ok(dsc_safetensors_write(path, n - half, names + half, tensors + half, 0, NULL));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(index, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(LLAMA "/config.json", path);
    for (int64_t i = 0; i < n; i++)
        dsc_tensor_free(&tensors[i]);
    free(tensors);
    free(names);
    dsc_safetensors_close(st);
    return n;
}

static float round_to(dsc_dtype dt, float x) {
    if (dt == DSC_DTYPE_BF16) return dsc_bf16_to_f32(dsc_f32_to_bf16(x));
    if (dt == DSC_DTYPE_F16) return dsc_f16_to_f32(dsc_f32_to_f16(x));
    return x;
}

static void test_sharded_half_precision(void **state) {
    (void)state;
    char dir[] = "/tmp/dsc_hf_shards_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_sharded(dir);
    dsc_infer_model *a, *b;
    assert_ok(dsc_infer_model_load(LLAMA, &a));
    assert_ok(dsc_infer_model_load(dir, &b));
    /* Compare every finalized parameter against the original rounded as its shard stored it. */
    int checked = 0;
    int64_t exact = 0, rounded = 0;
    for (int32_t layer = -1; layer < 2; layer++)
        for (int role = 0; role < DSC_PARAM_ROLE_COUNT; role++) {
            dsc_tensor ta, tb;
            dsc_status s = dsc_infer_model_param(a, layer, (dsc_param_role)role, &ta);
            if (s) {
                dsc_status_free(s);
                continue;
            }
            assert_ok(dsc_infer_model_param(b, layer, (dsc_param_role)role, &tb));
            assert_true(dsc_tensor_same_shape(&ta, &tb));
            checked++;
            const float *x = ta.data, *y = tb.data;
            int64_t n = dsc_tensor_numel(&ta);
            for (int64_t i = 0; i < n; i++) {
                bool same = x[i] == y[i];
                assert_true(same || round_to(DSC_DTYPE_BF16, x[i]) == y[i] ||
                            round_to(DSC_DTYPE_F16, x[i]) == y[i]);
                exact += same;
                rounded += !same;
            }
        }
    assert_int_equal(checked, 3 + 2 * 6);
    assert_true(exact > 0 && rounded > 0);
    printf("sharded: %d finalized parameters match: %lld values exact (f32 shard), %lld as rounded (bf16/f16)\n",
           checked, (long long)exact, (long long)rounded);

    /* Logits stay within half-precision error of the f32 model's. */
    dsc_infer_engine *ea, *eb;
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(a);
    ec.kv_cache_bytes = 1 << 20;
    assert_ok(dsc_infer_engine_create(a, &ec, &ea));
    assert_ok(dsc_infer_engine_create(b, &ec, &eb));
    int32_t tokens[12] = {5, 9, 100, 3, 77, 12, 64, 1, 2, 90, 45, 6}, count = 12;
    const int32_t *p = tokens;
    uint64_t uid = 1;
    float la[128], lb[128];
    assert_ok(dsc_infer_engine_put(ea, 1, &uid, &p, &count, la));
    assert_ok(dsc_infer_engine_put(eb, 1, &uid, &p, &count, lb));
    double rel = dsc_test_max_rel_err(lb, la, 128, 1e-6, "bf16/f16 shards vs f32 logits");
    assert_true(rel < 3e-2);
    dsc_infer_engine_destroy(ea);
    dsc_infer_engine_destroy(eb);
    dsc_infer_model_destroy(a);
    dsc_infer_model_destroy(b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sharded_half_precision)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
