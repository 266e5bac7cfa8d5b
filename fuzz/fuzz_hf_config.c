/* libFuzzer harness: a Hugging Face config.json. The text goes through
 * every HF policy's parser (Llama, Mistral, Qwen2, Mixtral) and then, as a
 * model directory beside the Llama test fixture's weights, through the whole
 * load: the architecture lookup, the config, and the builder that sizes the
 * weight arena from it and maps the checkpoint's tensors into it. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dsc/inference.h"
#include "fuzz_util.h"

static void link_weights(void) {
    static int done;
    if (done++) return;
    char link[160];
    snprintf(link, sizeof link, "%s/model.safetensors", fuzz_dir());
    if (symlink(DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama/model.safetensors", link) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    link_weights();
    char *json = fuzz_text(data, size);
    static const char *const archs[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                        "MixtralForCausalLM"};
    for (int i = 0; i < 4; i++) {
        const dsc_policy *p;
        if (dsc_policy_find(archs[i], &p)) abort(); /* built-in */
        dsc_infer_model_config mc;
        dsc_status_free(p->configure(&mc, json, "config.json"));
    }
    free(json);
    fuzz_write("config.json", data, size);
    dsc_infer_model *m = NULL;
    dsc_status s = dsc_infer_model_load(fuzz_dir(), &m);
    dsc_status_free(s);
    dsc_infer_model_destroy(m);
    return 0;
}
