/* dsc_infer_model_load (whole, sharded, or only the plan): tells a Hugging
 * Face directory (config.json) from a dsc checkpoint (a state.h5, a
 * checkpoint tag directory, or a save_dir with a `latest` file) and hands
 * it to the matching loader; and the tokenizer that goes with a model. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "dsc/checkpoint.h"
#include "dsc/tokenizer.h"
#include "inference/load.h"

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static dsc_status load(const char *path, const dsc_load_request *req) {
    struct stat st;
    DSC_CHECK(stat(path, &st) == 0, DSC_ERR_IO, "model path %s does not exist", path);
    if (!S_ISDIR(st.st_mode)) return dsc_load_dsc(path, req);
    char file[2048];
    snprintf(file, sizeof file, "%s/config.json", path);
    if (exists(file)) return dsc_load_hf(path, req);
    snprintf(file, sizeof file, "%s/state.h5", path);
    if (exists(file)) return dsc_load_dsc(file, req);
    snprintf(file, sizeof file, "%s/latest", path);
    DSC_CHECK(exists(file), DSC_ERR_IO,
              "%s holds neither config.json (Hugging Face), state.h5 nor latest (dsc checkpoint)", path);
    DSC_TRY(dsc_checkpoint_path(path, "latest", file, sizeof file));
    return dsc_load_dsc(file, req);
}

dsc_status dsc_infer_model_load_parallel(const char *path, const dsc_infer_tp *tp, const dsc_infer_pp *pp,
                                         dsc_infer_model **out) {
    *out = NULL;
    dsc_load_request req = {.tp = tp, .pp = pp, .model = out};
    return load(path, &req);
}

dsc_status dsc_infer_model_load_tp(const char *path, const dsc_infer_tp *tp, dsc_infer_model **out) {
    return dsc_infer_model_load_parallel(path, tp, NULL, out);
}

dsc_status dsc_infer_model_load(const char *path, dsc_infer_model **out) {
    return dsc_infer_model_load_tp(path, NULL, out);
}

dsc_status dsc_infer_model_plan(const char *path, const dsc_infer_tp *tp, dsc_tp_plan **out) {
    *out = NULL;
    dsc_load_request req = {.tp = tp, .plan = out};
    return load(path, &req);
}

/* A tokenizer with ids the model has no rows for is refused when opened,
 * naming both sizes, rather than when one of those ids is first fed. */
static dsc_status check_vocab(const char *file, const dsc_infer_model *m, dsc_tokenizer **tok) {
    int32_t V = dsc_infer_model_get_config(m)->vocab_size;
    if (!*tok || dsc_tokenizer_vocab_size(*tok) <= V) return NULL;
    dsc_status s = dsc_error(DSC_ERR_CORRUPT, "tokenizer %s: ids reach %d, outside the model's vocabulary of %d",
                             file, dsc_tokenizer_vocab_size(*tok) - 1, V);
    dsc_tokenizer_destroy(*tok);
    *tok = NULL;
    return s;
}

dsc_status dsc_infer_model_open_tokenizer(const char *path, const dsc_infer_model *m, const char *tokenizer,
                                          dsc_tokenizer **out) {
    *out = NULL;
    if (tokenizer) {
        DSC_TRY(dsc_tokenizer_load(out, tokenizer));
        return check_vocab(tokenizer, m, out);
    }
    const char *arch = dsc_infer_model_arch(m);
    if (strcmp(arch, "gpt") == 0 || strcmp(arch, "llama") == 0 || strcmp(arch, "gpt-moe") == 0 ||
        strcmp(arch, "mixtral") == 0)
        return dsc_tokenizer_create_bytes(out);
    char file[2048];
    snprintf(file, sizeof file, "%s/tokenizer.json", path);
    struct stat st;
    if (stat(file, &st) != 0 || !S_ISREG(st.st_mode)) return NULL;
    DSC_TRY(dsc_tokenizer_load(out, file));
    return check_vocab(file, m, out);
}
