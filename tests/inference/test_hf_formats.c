/* Hugging Face checkpoint layouts: the tiny Llama fixture as a sharded
 * checkpoint (model.safetensors.index.json + two shards, the second in bf16
 * with one tensor in f16), written by safetensors/torch
 * (tests/ref/make_sharded_fixture.py, fixtures/hf/llama_sharded), loads into
 * finalized weights equal bitwise to torch's own rounding of each tensor to
 * its stored dtype (fixtures/hf/llama_rounded, the same tensors widened back
 * to f32 by torch); both exact (f32 shard) and rounded (half shard) values
 * occur. The logits of the half-precision model equal those of the rounded
 * f32 one bitwise and stay within LOGITS_TOL of the original f32 model's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/inference.h"
#include "test_mpi.h"

#define HF DSC_SOURCE_DIR "/tests/inference/fixtures/hf"
/* bf16 keeps 8 significant bits (relative rounding up to 2^-9 = 2e-3 per
 * weight); through 2 layers the logits move by 4.1e-3 of their largest value
 * (measured), docs/inference.md states the same bound. */
#define LOGITS_TOL 5e-3

static void logits_of(dsc_infer_model *m, float *out) {
    dsc_infer_engine *e;
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.kv_cache_bytes = 1 << 20;
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    int32_t tokens[12] = {5, 9, 100, 3, 77, 12, 64, 1, 2, 90, 45, 6}, count = 12;
    const int32_t *p = tokens;
    uint64_t uid = 1;
    assert_ok(dsc_infer_engine_put(e, 1, &uid, &p, &count, out));
    dsc_infer_engine_destroy(e);
}

static void test_sharded_half_precision(void **state) {
    (void)state;
    dsc_infer_model *orig, *half, *rounded;
    assert_ok(dsc_infer_model_load(HF "/llama", &orig));
    assert_ok(dsc_infer_model_load(HF "/llama_sharded", &half));
    assert_ok(dsc_infer_model_load(HF "/llama_rounded", &rounded));
    int checked = 0;
    int64_t exact = 0, changed = 0;
    for (int32_t layer = -1; layer < 2; layer++)
        for (int role = 0; role < DSC_PARAM_ROLE_COUNT; role++) {
            dsc_tensor to, th, tr;
            dsc_status s = dsc_infer_model_param(orig, layer, (dsc_param_role)role, &to);
            if (s) {
                dsc_status_free(s);
                continue;
            }
            assert_ok(dsc_infer_model_param(half, layer, (dsc_param_role)role, &th));
            assert_ok(dsc_infer_model_param(rounded, layer, (dsc_param_role)role, &tr));
            assert_true(dsc_tensor_same_shape(&to, &th) && dsc_tensor_same_shape(&th, &tr));
            checked++;
            const float *x = to.data, *y = th.data, *want = tr.data;
            int64_t n = dsc_tensor_numel(&th);
            assert_memory_equal(y, want, (size_t)n * sizeof *y); /* dsc's widening == torch's rounding */
            for (int64_t i = 0; i < n; i++) {
                exact += x[i] == y[i];
                changed += x[i] != y[i];
            }
        }
    assert_int_equal(checked, 3 + 2 * 6);
    assert_true(exact > 0 && changed > 0);
    printf("sharded: %d finalized parameters equal torch's rounding bitwise: %lld values exact (f32 shard), %lld "
           "rounded (bf16/f16 shard)\n",
           checked, (long long)exact, (long long)changed);

    float lo[128], lh[128], lr[128];
    logits_of(orig, lo);
    logits_of(half, lh);
    logits_of(rounded, lr);
    assert_memory_equal(lh, lr, sizeof lh);
    double rel = dsc_test_max_rel_err(lh, lo, 128, 1e-6, "bf16/f16 shards vs f32 logits");
    assert_true(rel < LOGITS_TOL);
    dsc_infer_model_destroy(orig);
    dsc_infer_model_destroy(half);
    dsc_infer_model_destroy(rounded);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sharded_half_precision)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
