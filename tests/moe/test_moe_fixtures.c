/* MoE fidelity against PyTorch (tests/ref/make_moe_fixtures.py): the MoE
 * layer (top-2, no drops; GELU experts with the PR-MoE residual, and SwiGLU
 * experts) must reproduce PyTorch's output, gate loss, input gradient and
 * every parameter gradient; a tiny Mixtral-style model (RMSNorm, RoPE, GQA,
 * SwiGLU experts, every block MoE) and a tiny GPT-MoE (every second block
 * MoE, tied embeddings) must reproduce the cross-entropy, the summed gate
 * losses and every parameter gradient. Relative error <= 1e-4 per tensor
 * (max|dsc - torch| / max|torch|); PyTorch computed in float64. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/nn_test_util.h"
#include "moe_test_util.h"
#include "test_mpi.h"

#define TOL 1e-4
#define FLOOR 1e-6

/* The nn fixture loader reads tests/nn/fixtures/; ours live in tests/moe/fixtures/. */
static void load(fixture *f, const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "../../moe/fixtures/%s", name);
    fixture_load(f, rel);
}

static const fixture_array *array_for(const fixture *f, const char *prefix, const dsc_param *p) {
    char name[200];
    snprintf(name, sizeof name, "%s%s", prefix, p->name);
    const fixture_array *a = fixture_get(f, name);
    if (!a) fail_msg("fixture has no %s", name);
    assert_int_equal(a->numel, dsc_param_numel(p));
    return a;
}

static void load_params(dsc_param_store *store, const fixture *f) {
    int in_fixture = 0;
    for (int i = 0; i < f->n_arrays; i++)
        in_fixture += strncmp(f->arrays[i].name, "param/", 6) == 0;
    assert_int_equal(in_fixture, dsc_params_count(store)); /* the same parameter set, both ways */
    for (int i = 0; i < dsc_params_count(store); i++) {
        dsc_param *p = dsc_params_at(store, i);
        dsc_tensor src = dsc_tensor_view(array_for(f, "param/", p)->data, DSC_DTYPE_F32, p->value.ndim,
                                         p->value.shape, DSC_CPU);
        assert_ok(dsc_tensor_copy(&p->value, &src));
    }
}

static double max_abs(const float *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(v[i]));
    return m;
}

/* Worst relative error over every parameter gradient. A gradient that is 0
 * in exact arithmetic (the attention key bias: softmax is shift invariant)
 * is rounding noise in both; it is measured against the largest gradient of
 * the model instead of its own. */
static double compare_grads(dsc_param_store *store, const fixture *f) {
    double worst = 0, scale = 0;
    for (int i = 0; i < dsc_params_count(store); i++) {
        const fixture_array *ref = array_for(f, "grad/", dsc_params_at(store, i));
        scale = fmax(scale, max_abs(ref->data, ref->numel));
    }
    for (int i = 0; i < dsc_params_count(store); i++) {
        dsc_param *p = dsc_params_at(store, i);
        char what[200];
        snprintf(what, sizeof what, "grad/%s", p->name);
        const fixture_array *ref = array_for(f, "grad/", p);
        const double floor = max_abs(ref->data, ref->numel) < 1e-6 * scale ? scale : FLOOR;
        worst = fmax(worst, dsc_test_max_rel_err(p->grad.data, ref->data, ref->numel, floor, what));
    }
    return worst;
}

static double rel1(double a, double b, const char *what) {
    float fa = (float)a, fb = (float)b;
    return dsc_test_max_rel_err(&fa, &fb, 1, FLOOR, what);
}

static void layer_case(const char *name) {
    printf("fixture %s\n", name);
    fixture f;
    load(&f, name);
    const bool swiglu = strcmp(fixture_meta_str(&f, "arch"), "llama") == 0;
    dsc_model_config mc;
    moe_test_model_config(&mc, swiglu ? DSC_ARCH_MIXTRAL : DSC_ARCH_GPT_MOE, 1,
                          (int)fixture_meta(&f, "num_experts"), 1);
    mc.d_model = (int)fixture_meta(&f, "d_model");
    mc.d_ff = (int)fixture_meta(&f, "d_ff");
    dsc_moe_options o;
    moe_test_options(&o, mc.moe_num_experts, 2, false, fixture_meta(&f, "use_residual") != 0,
                     swiglu ? DSC_MOE_EXPERT_KIND_SWIGLU : DSC_MOE_EXPERT_KIND_GELU);
    o.gate.aux_loss_coef = fixture_meta(&f, "aux_coef");
    o.gate.z_loss_coef = fixture_meta(&f, "z_coef");
    dsc_param_store *store;
    dsc_layer *layer;
    assert_ok(dsc_params_create(&store, DSC_CPU, 1));
    assert_ok(dsc_moe_layer_create(&o, &mc, 0, store, DSC_CPU, NULL, &layer));
    assert_ok(dsc_params_finalize(store));
    const fixture_array *x = fixture_get(&f, "x"), *g = fixture_get(&f, "g");
    assert_ok(dsc_layer_reserve(layer, 1, x->shape[0], x->shape[1]));
    load_params(store, &f);

    dsc_tensor xin = dsc_tensor_view(x->data, DSC_DTYPE_F32, 3, x->shape, DSC_CPU);
    dsc_tensor gout = dsc_tensor_view(g->data, DSC_DTYPE_F32, 3, g->shape, DSC_CPU), out, din;
    dsc_micro_ctx ctx = {.loss_scale = 1.0f, .training = true};
    assert_ok(dsc_layer_forward(layer, 0, &xin, &out, &ctx));
    double worst = dsc_test_max_rel_err(out.data, fixture_get(&f, "out")->data, x->numel, FLOOR, "out");
    worst = fmax(worst, rel1(ctx.aux_loss, ((float *)fixture_get(&f, "gate_loss")->data)[0], "gate loss"));
    assert_ok(dsc_layer_backward(layer, 0, &gout, &din, &ctx));
    worst =
        fmax(worst, dsc_test_max_rel_err(din.data, fixture_get(&f, "grad/x")->data, x->numel, FLOOR, "grad/x"));
    worst = fmax(worst, compare_grads(store, &f));
    printf("  worst relative error %.3e (tolerance %.0e)\n", worst, TOL);
    assert_true(worst <= TOL);
    dsc_layer_destroy(layer);
    dsc_params_destroy(store);
    fixture_free(&f);
}

static void model_case(const char *name) {
    printf("fixture %s\n", name);
    fixture f;
    load(&f, name);
    dsc_model_arch arch;
    assert_ok(dsc_model_arch_from_name(fixture_meta_str(&f, "model_arch"), &arch));
    dsc_model_config mc;
    moe_test_model_config(&mc, arch, (int)fixture_meta(&f, "n_layer"), (int)fixture_meta(&f, "num_experts"),
                          (int)fixture_meta(&f, "layer_freq"));
    mc.d_model = (int)fixture_meta(&f, "d_model");
    mc.n_head = (int)fixture_meta(&f, "n_head");
    mc.n_kv_head = (int)fixture_meta(&f, "n_kv_head");
    mc.d_ff = (int)fixture_meta(&f, "d_ff");
    mc.vocab_size = (int)fixture_meta(&f, "vocab_size");
    mc.seq_len = (int)fixture_meta(&f, "seq_len");
    mc.tie_embeddings = fixture_meta(&f, "tie_embeddings") != 0;
    mc.qkv_bias = fixture_meta(&f, "qkv_bias") != 0;
    mc.rope_theta = (float)fixture_meta(&f, "rope_theta");
    mc.norm_eps = (float)fixture_meta(&f, "norm_eps");
    dsc_moe_build_extra extra = {.ep = NULL};
    moe_test_options(&extra.options, mc.moe_num_experts, 2, false, false,
                     arch == DSC_ARCH_MIXTRAL ? DSC_MOE_EXPERT_KIND_SWIGLU : DSC_MOE_EXPERT_KIND_GELU);
    extra.options.gate.aux_loss_coef = fixture_meta(&f, "aux_coef");
    extra.options.gate.z_loss_coef = fixture_meta(&f, "z_coef");
    const fixture_array *tok = fixture_get(&f, "tokens"), *tgt = fixture_get(&f, "targets");
    moe_test_model m;
    assert_ok(moe_test_model_build(&m, &mc, &extra, 1, tok->shape[0], tok->shape[1]));
    load_params(m.store, &f);
    dsc_tensor tokens = dsc_tensor_view(tok->data, DSC_DTYPE_I32, 2, tok->shape, DSC_CPU);
    dsc_tensor targets = dsc_tensor_view(tgt->data, DSC_DTYPE_I32, 2, tgt->shape, DSC_CPU);
    double loss, aux;
    assert_ok(moe_test_model_step(&m, &tokens, &targets, NULL, &loss, &aux));
    double worst = rel1(loss, ((float *)fixture_get(&f, "loss")->data)[0], "loss");
    worst = fmax(worst, rel1(aux, ((float *)fixture_get(&f, "aux_loss")->data)[0], "aux loss"));
    worst = fmax(worst, compare_grads(m.store, &f));
    printf("  worst relative error %.3e (tolerance %.0e)\n", worst, TOL);
    assert_true(worst <= TOL);
    moe_test_model_free(&m);
    fixture_free(&f);
}

static void test_layer_gelu_residual(void **state) {
    (void)state;
    layer_case("moe_layer_gelu_residual");
}

static void test_layer_swiglu(void **state) {
    (void)state;
    layer_case("moe_layer_swiglu");
}

static void test_mixtral(void **state) {
    (void)state;
    model_case("mixtral_tiny");
}

static void test_gpt_moe(void **state) {
    (void)state;
    model_case("gpt_moe_tiny");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_gelu_residual),
        cmocka_unit_test(test_layer_swiglu),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_gpt_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
