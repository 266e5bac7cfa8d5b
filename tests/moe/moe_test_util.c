/* Test-only helpers of tests/moe (see moe_test_util.h). */
#include <string.h>

#include "dsc/rng.h"
#include "moe_test_util.h"
#include "test_layers.h"

void moe_test_options(dsc_moe_options *o, int num_experts, int k, bool drop_tokens, bool residual,
                      dsc_moe_expert_kind kind) {
    memset(o, 0, sizeof *o);
    o->num_experts = num_experts;
    o->use_residual = residual;
    o->expert_kind = kind;
    o->gate = dsc_moe_gate_config_default();
    o->gate.k = k;
    o->gate.drop_tokens = drop_tokens;
    o->gate.min_capacity = 1;
    o->gate.use_rts = false;
    o->gate.top2_2nd_expert_sampling = false;
    o->gate.aux_loss_coef = 0.1;
    o->gate.z_loss_coef = 0.01;
}

void moe_test_model_config(dsc_model_config *mc, dsc_model_arch arch, int n_layer, int num_experts,
                           int layer_freq) {
    dsc_model_config_defaults(mc, arch);
    mc->n_layer = n_layer;
    mc->d_model = 16;
    mc->n_head = 4;
    mc->n_kv_head = arch == DSC_ARCH_MIXTRAL ? 2 : 4;
    mc->d_ff = 24;
    mc->vocab_size = 32;
    mc->seq_len = 8;
    mc->init_std = 0.2f;
    mc->moe_num_experts = num_experts;
    mc->moe_layer_freq = layer_freq;
}

dsc_status moe_test_model_build(moe_test_model *m, const dsc_model_config *mc, const dsc_moe_build_extra *extra,
                                uint64_t seed, int64_t B, int64_t T) {
    memset(m, 0, sizeof *m);
    m->mc = *mc;
    DSC_TRY(dsc_nn_register_dense_layers());
    DSC_TRY(dsc_moe_register_layers());
    dsc_status s = dsc_test_layers_build(&m->mc, DSC_CPU, extra, seed, 1, B, T, &m->store, &m->layers, &m->n);
    if (s) memset(m, 0, sizeof *m);
    return s;
}

void moe_test_model_free(moe_test_model *m) {
    dsc_test_layers_free(m->store, m->layers, m->n);
    memset(m, 0, sizeof *m);
}

dsc_status moe_test_model_step(moe_test_model *m, const dsc_tensor *tokens, const dsc_tensor *targets,
                               dsc_rng *rng, double *loss, double *aux) {
    dsc_micro_ctx ctx = {.tokens = tokens, .targets = targets, .loss_scale = 1.0f, .training = true, .rng = rng};
    DSC_TRY(dsc_test_layers_forward(m->layers, m->n, 0, &ctx));
    DSC_TRY(dsc_test_layers_backward(m->layers, m->n, 0, &ctx));
    *loss = ctx.loss;
    *aux = ctx.aux_loss;
    return NULL;
}

void moe_test_fill(float *p, int64_t n, uint64_t seed, float scale) {
    dsc_rng rng;
    dsc_rng_init(&rng, seed, 0, DSC_RNG_DATA);
    for (int64_t i = 0; i < n; i++)
        p[i] = scale * (2.0f * (float)dsc_rng_uniform(&rng) - 1.0f);
}
