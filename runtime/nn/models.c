/* Model definitions: the `model` config section (defaults, validation,
 * architecture names), the ordered layer-spec list of a model, and the
 * registration of the dense layer types.
 *
 * Reading JSON is the config module's job; this file sees a filled struct.
 * Errors name the config key ("model.n_head") so users can find the line. */
#include <stdlib.h>
#include <string.h>

#include "dsc/model.h"
#include "runtime/nn/nn_internal.h"

static const char *const arch_names[] = {"gpt", "llama", "gpt_moe", "mixtral"};

const char *dsc_model_arch_name(dsc_model_arch arch) {
    return (unsigned)arch < sizeof arch_names / sizeof arch_names[0] ? arch_names[arch] : "unknown";
}

dsc_status dsc_model_arch_from_name(const char *name, dsc_model_arch *out) {
    for (unsigned i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++)
        if (name && strcmp(name, arch_names[i]) == 0) {
            *out = (dsc_model_arch)i;
            return NULL;
        }
    return dsc_error(DSC_ERR_CONFIG,
                     "model.arch: unknown architecture \"%s\" (expected gpt, llama, gpt_moe or mixtral)",
                     name ? name : "");
}

void dsc_model_config_defaults(dsc_model_config *mc, dsc_model_arch arch) {
    const bool llama = arch == DSC_ARCH_LLAMA || arch == DSC_ARCH_MIXTRAL;
    const bool moe = arch == DSC_ARCH_GPT_MOE || arch == DSC_ARCH_MIXTRAL;
    *mc = (dsc_model_config){
        .arch = arch,
        .n_layer = 6,
        .d_model = 384,
        .n_head = 6,
        .n_kv_head = llama ? 2 : 6,
        .d_ff = llama ? 1024 : 4 * 384, /* SwiGLU's ~8/3 C keeps the parameter count of a 4C GELU MLP */
        .vocab_size = llama ? 32000 : 50257,
        .seq_len = 256,
        .tie_embeddings = !llama,
        .activation_checkpointing = false,
        .qkv_bias = !llama,
        .rope_theta = 10000.0f,
        .norm_eps = 1e-5f,
        .init_std = 0.02f,
        .moe_num_experts = moe ? 8 : 0,
        .moe_layer_freq = moe ? 2 : 0,
    };
}

dsc_status dsc_model_config_validate(const dsc_model_config *mc) {
    DSC_CHECK((unsigned)mc->arch <= DSC_ARCH_MIXTRAL, DSC_ERR_CONFIG, "model.arch: unknown architecture %d",
              (int)mc->arch);
    DSC_CHECK(mc->n_layer >= 1, DSC_ERR_CONFIG, "model.n_layer must be >= 1 (got %d)", mc->n_layer);
    DSC_CHECK(mc->d_model >= 1, DSC_ERR_CONFIG, "model.d_model must be >= 1 (got %d)", mc->d_model);
    DSC_CHECK(mc->n_head >= 1 && mc->d_model % mc->n_head == 0, DSC_ERR_CONFIG,
              "model.n_head (%d) must be >= 1 and divide model.d_model (%d)", mc->n_head, mc->d_model);
    DSC_CHECK(mc->n_kv_head >= 1 && mc->n_head % mc->n_kv_head == 0, DSC_ERR_CONFIG,
              "model.n_kv_head (%d) must be >= 1 and divide model.n_head (%d)", mc->n_kv_head, mc->n_head);
    DSC_CHECK(mc->d_ff >= 1, DSC_ERR_CONFIG, "model.d_ff must be >= 1 (got %d)", mc->d_ff);
    DSC_CHECK(mc->vocab_size >= 1, DSC_ERR_CONFIG, "model.vocab_size must be >= 1 (got %d)", mc->vocab_size);
    DSC_CHECK(mc->seq_len >= 1, DSC_ERR_CONFIG, "model.seq_len must be >= 1 (got %d)", mc->seq_len);
    DSC_CHECK(mc->norm_eps > 0.0f, DSC_ERR_CONFIG, "model.norm_eps must be > 0 (got %g)", (double)mc->norm_eps);
    DSC_CHECK(mc->init_std >= 0.0f, DSC_ERR_CONFIG, "model.init_std must be >= 0 (got %g)", (double)mc->init_std);
    if (nn_arch_is_llama(mc)) {
        const int hs = mc->d_model / mc->n_head;
        DSC_CHECK(hs % 2 == 0, DSC_ERR_CONFIG, "model.d_model / model.n_head = %d: RoPE needs an even head size",
                  hs);
        DSC_CHECK(mc->rope_theta > 0.0f, DSC_ERR_CONFIG, "model.rope_theta must be > 0 (got %g)",
                  (double)mc->rope_theta);
    }
    if (mc->arch == DSC_ARCH_GPT_MOE || mc->arch == DSC_ARCH_MIXTRAL) {
        DSC_CHECK(mc->moe_num_experts >= 1, DSC_ERR_CONFIG, "model.moe.num_experts must be >= 1 for arch %s",
                  dsc_model_arch_name(mc->arch));
        DSC_CHECK(mc->moe_layer_freq >= 1, DSC_ERR_CONFIG, "model.moe.layer_freq must be >= 1 for arch %s",
                  dsc_model_arch_name(mc->arch));
    }
    return NULL;
}

static void set_spec(dsc_layer_spec *s, const char *type, int block) {
    memset(s, 0, sizeof *s);
    strcpy(s->type, type);
    s->block = block;
}

dsc_status dsc_model_specs(const dsc_model_config *mc, dsc_layer_spec **specs, int *count) {
    *specs = NULL;
    *count = 0;
    DSC_TRY(dsc_model_config_validate(mc));
    const int n = mc->n_layer + 2;
    dsc_layer_spec *list = calloc((size_t)n, sizeof *list);
    DSC_CHECK(list, DSC_ERR_NOMEM, "layer spec list of %d entries", n);
    const bool moe = mc->arch == DSC_ARCH_GPT_MOE || mc->arch == DSC_ARCH_MIXTRAL;
    set_spec(&list[0], "embedding", -1);
    for (int i = 0; i < mc->n_layer; i++)
        set_spec(&list[i + 1], moe && (i + 1) % mc->moe_layer_freq == 0 ? "moe_block" : "block", i);
    set_spec(&list[n - 1], "lm_head", -1);
    *specs = list;
    *count = n;
    return NULL;
}

static dsc_status dense_block_factory(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    return dsc_block_create(spec, ctx, NULL, out);
}

dsc_status dsc_nn_register_dense_layers(void) {
    DSC_TRY(dsc_layer_register("embedding", nn_embedding_create));
    DSC_TRY(dsc_layer_register("block", dense_block_factory));
    return dsc_layer_register("lm_head", nn_head_create);
}
