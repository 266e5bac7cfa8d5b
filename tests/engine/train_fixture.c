/* The tiny training setup shared by the training tests. */
#include "train_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/data.h"
#include "test_mpi.h"

void train_fixture_tokens(const char *path, int64_t count) {
    FILE *fp = fopen(DSC_SOURCE_DIR "/data/tinyshakespeare.txt", "rb");
    assert_non_null(fp);
    char *text = malloc((size_t)count);
    assert_int_equal(fread(text, 1, (size_t)count, fp), (size_t)count);
    fclose(fp);
    uint32_t *ids = malloc((size_t)count * sizeof *ids);
    dsc_byte_tokenizer_encode(text, (size_t)count, ids);
    assert_ok(dsc_token_file_write(path, ids, count, DSC_TOKEN_DTYPE_U16, DSC_BYTE_VOCAB_SIZE));
    free(ids);
    free(text);
}

static const char *const tiny_json =
    "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2, \"steps_per_print\": 1000,"
    " \"gradient_clipping\": 0.5, \"seed\": 11,"
    " \"model\": {\"arch\": \"gpt\", \"n_layer\": 2, \"d_model\": 32, \"n_head\": 2, \"vocab_size\": 256,"
    "            \"seq_len\": 16},"
    " \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.003, \"weight_decay\": 0.1}},"
    " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 2, \"warmup_type\": "
    "\"linear\"}},"
    " \"data\": {\"val_fraction\": 0.1}, \"train\": {\"steps\": 5, \"eval_iters\": 2}}";

void train_fixture_config(dsc_config *cfg, const char *data, const char *const *overrides, int n, int dp_size) {
    char data_set[512];
    snprintf(data_set, sizeof data_set, "data.path=%s", data);
    const char *all[16];
    all[0] = data_set;
    for (int i = 0; i < n; i++)
        all[i + 1] = overrides[i];
    assert_ok(dsc_config_parse_string(tiny_json, "tiny.json", all, n + 1, cfg));
    assert_ok(dsc_config_resolve_batch(cfg, dp_size));
}

float *train_fixture_params(dsc_trainer *t, int64_t *count) {
    dsc_param_store *store = dsc_trainer_params(t);
    int64_t n = 0;
    for (int i = 0; i < dsc_params_count(store); i++)
        n += dsc_param_numel(dsc_params_at(store, i));
    float *out = malloc((size_t)n * sizeof *out);
    int64_t k = 0;
    for (int i = 0; i < dsc_params_count(store); i++) {
        const dsc_param *p = dsc_params_at(store, i);
        memcpy(out + k, p->value.data, (size_t)dsc_param_numel(p) * sizeof *out);
        k += dsc_param_numel(p);
    }
    *count = n;
    return out;
}
