/* The MoE layer on one process:
 *   - gradients against central finite differences of
 *     J = sum(out * G) + gate loss, with dropping (top-1, top-2), no-drop
 *     top-3, GELU and SwiGLU experts, the PR-MoE residual, and jitter (its
 *     noise is drawn once, so the objective is re-evaluated with the same
 *     draws by re-seeding the stream);
 *   - expert banks: the output against a naive per-expert loop, the input
 *     gradient against finite differences, the gradient scale, both for
 *     tensors lying back to back in the flat buffer and for packed ones
 *     (their weight gradients are covered by the layer cases);
 *   - the statistics of a "moe_block" inside a model (routed = S*K per
 *     forward, kept + dropped = routed, phase clocks running);
 *   - activation checkpointing with random gate elements (jitter, sampled
 *     second expert) gives bitwise the gradients of the plain path;
 *   - bad input: k > E, capacity factor <= 0, ep_size not dividing the
 *     experts or the ranks, config sections for dense archs, a moe_block
 *     without its build extra, a CUDA device, backward without forward.
 * Finite differences: the layer is f32, so h = 1e-2 and the tolerance is 1e-2
 * of the tensor's largest gradient; each perturbation is checked to keep the
 * routing (else that coordinate is skipped; at most 5% may be). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "moe_test_util.h"
#include "test_mpi.h"

#define NB 2
#define NT 6
#define H 1e-2
#define TOL 1e-2

typedef struct fd_case {
    const char *name;
    int E, k;
    bool drop, residual, jitter;
    dsc_moe_expert_kind kind;
    double capacity_factor;
} fd_case;

typedef struct fd_env {
    dsc_param_store *store;
    dsc_layer *layer;
    dsc_moe_options o;
    float *x, *g; /* (NB, NT, M) */
    int64_t M;
} fd_env;

/* J at the current parameters and input (forward and backward, so the slot
 * is free again); the input gradient goes to din when it is not NULL. The
 * jitter stream restarts from one seed each time, so every evaluation draws
 * the same noise. */
static double objective(fd_env *v, float *din) {
    const int64_t shape[3] = {NB, NT, v->M}, n = NB * NT * v->M;
    dsc_tensor xt = dsc_tensor_view(v->x, DSC_DTYPE_F32, 3, shape, DSC_CPU);
    dsc_tensor gt = dsc_tensor_view(v->g, DSC_DTYPE_F32, 3, shape, DSC_CPU), y, dx;
    dsc_rng rng;
    dsc_rng_init(&rng, 99, 0, DSC_RNG_GATE);
    dsc_micro_ctx ctx = {.loss_scale = 1.0f, .training = true, .rng = &rng};
    assert_ok(dsc_layer_forward(v->layer, 0, &xt, &y, &ctx));
    double j = ctx.aux_loss;
    for (int64_t i = 0; i < n; i++)
        j += (double)((float *)y.data)[i] * v->g[i];
    assert_ok(dsc_layer_backward(v->layer, 0, &gt, &dx, &ctx));
    if (din) memcpy(din, dx.data, (size_t)n * sizeof *din);
    return j;
}

/* Routing fingerprint: per-expert kept counts since the last reset (one forward). */
static void fingerprint(fd_env *v, int64_t *out) {
    dsc_moe_stats st;
    assert_ok(dsc_moe_stats_get(v->layer, &st));
    for (int e = 0; e < st.num_experts; e++)
        out[e] = st.kept[e];
    assert_ok(dsc_moe_stats_reset(v->layer));
}

/* Central difference of J along one float; false when the routing moved. */
static bool central(fd_env *v, float *p, const int64_t *route0, double *d) {
    int64_t r[16];
    const float old = *p;
    *p = old + (float)H;
    const double jp = objective(v, NULL);
    fingerprint(v, r);
    bool same = memcmp(r, route0, (size_t)v->o.num_experts * sizeof *r) == 0;
    *p = old - (float)H;
    const double jm = objective(v, NULL);
    fingerprint(v, r);
    same = same && memcmp(r, route0, (size_t)v->o.num_experts * sizeof *r) == 0;
    *p = old;
    *d = (jp - jm) / (2 * H);
    return same;
}

/* values (n) against their analytic gradient, on a spread of about 24 coordinates. */
static double check_tensor(fd_env *v, const char *what, float *values, const float *grad, int64_t n, int *skipped,
                           int *checked) {
    double gmax = 1e-3;
    for (int64_t i = 0; i < n; i++)
        gmax = fmax(gmax, fabs(grad[i]));
    int64_t route0[16];
    assert_ok(dsc_moe_stats_reset(v->layer));
    (void)objective(v, NULL);
    fingerprint(v, route0);
    double worst = 0;
    const int64_t stride = n > 24 ? n / 24 : 1;
    int skips = 0;
    for (int64_t i = 0; i < n; i += stride) {
        double d;
        (*checked)++;
        if (!central(v, &values[i], route0, &d)) {
            skips++;
            continue;
        }
        worst = fmax(worst, fabs(d - grad[i]) / gmax);
    }
    *skipped += skips;
    printf("  %-40s max |fd - analytic| / max|grad| = %.2e (%d skipped)\n", what, worst, skips);
    return worst;
}

static void run_fd(const fd_case *c) {
    printf("case %s\n", c->name);
    fd_env v = {0};
    dsc_model_config mc;
    moe_test_model_config(&mc, c->kind == DSC_MOE_EXPERT_KIND_SWIGLU ? DSC_ARCH_MIXTRAL : DSC_ARCH_GPT_MOE, 1,
                          c->E, 1);
    moe_test_options(&v.o, c->E, c->k, c->drop, c->residual, c->kind);
    v.o.gate.capacity_factor = c->capacity_factor;
    if (c->jitter) v.o.gate.noisy_gate_policy = DSC_MOE_NOISY_GATE_JITTER;
    v.M = mc.d_model;
    assert_ok(dsc_params_create(&v.store, DSC_CPU, 3));
    assert_ok(dsc_moe_layer_create(&v.o, &mc, 0, v.store, DSC_CPU, NULL, &v.layer));
    assert_ok(dsc_params_finalize(v.store));
    assert_ok(dsc_layer_reserve(v.layer, 1, NB + 1, NT + 1)); /* a smaller micro-batch than reserved */
    for (int i = 0; i < dsc_params_count(v.store);
         i++) { /* biases nonzero, router strong enough to route clearly */
        dsc_param *p = dsc_params_at(v.store, i);
        moe_test_fill(p->value.data, dsc_param_numel(p), 40 + (uint64_t)i,
                      strstr(p->name, "moe.gate.weight") ? 3.0f : 0.4f);
    }
    const int64_t n = NB * NT * v.M;
    v.x = malloc((size_t)n * sizeof *v.x);
    v.g = malloc((size_t)n * sizeof *v.g);
    float *din = malloc((size_t)n * sizeof *din);
    moe_test_fill(v.x, n, 5, 1.0f);
    moe_test_fill(v.g, n, 6, 1.0f);
    assert_ok(dsc_params_zero_grads(v.store));
    (void)objective(&v, din);
    dsc_moe_stats st;
    assert_ok(dsc_moe_stats_get(v.layer, &st));
    int64_t dropped = 0;
    for (int e = 0; e < c->E; e++)
        dropped += st.dropped[e];
    if (c->drop) assert_true(dropped > 0); /* the case really drops routes */
    /* Every analytic gradient is copied out before the finite differences run more backwards. */
    float *grads[2];
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        dsc_tensor values, flat;
        dsc_params_flat(v.store, (dsc_param_group)g, &values, &flat);
        grads[g] = malloc((size_t)(dsc_tensor_numel(&flat) + 1) * sizeof(float));
        memcpy(grads[g], flat.data, (size_t)dsc_tensor_numel(&flat) * sizeof(float));
    }
    int skipped = 0, checked = 0;
    double worst = 0;
    for (int i = 0; i < dsc_params_count(v.store); i++) {
        dsc_param *p = dsc_params_at(v.store, i);
        worst = fmax(worst, check_tensor(&v, p->name, p->value.data, grads[p->group] + p->offset,
                                         dsc_param_numel(p), &skipped, &checked));
    }
    worst = fmax(worst, check_tensor(&v, "input", v.x, din, n, &skipped, &checked));
    printf("  worst %.2e (tolerance %.0e), %d of %d coordinates skipped (routing changed)\n", worst, TOL, skipped,
           checked);
    assert_true(worst <= TOL);
    assert_true(skipped * 20 <= checked); /* near-ties of the 3rd and 4th choice move a few router coordinates */
    free(grads[0]);
    free(grads[1]);
    free(din);
    free(v.x);
    free(v.g);
    dsc_layer_destroy(v.layer);
    dsc_params_destroy(v.store);
}

static void test_fd_top1_drop_gelu(void **state) {
    (void)state;
    run_fd(&(fd_case){"top-1, dropping, GELU", 4, 1, true, false, false, DSC_MOE_EXPERT_KIND_GELU, 0.75});
}

static void test_fd_top2_drop_swiglu_residual(void **state) {
    (void)state;
    run_fd(
        &(fd_case){"top-2, dropping, SwiGLU, residual", 4, 2, true, true, false, DSC_MOE_EXPERT_KIND_SWIGLU, 0.5});
}

static void test_fd_top3_nodrop_gelu_jitter(void **state) {
    (void)state;
    run_fd(&(fd_case){"top-3, no-drop, GELU, jitter", 5, 3, false, false, true, DSC_MOE_EXPERT_KIND_GELU, 1.0});
}

/* ---- expert banks ---------------------------------------------------------------------- */

static float gelu_ref(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

/* y = FFN_e(x) for one row through the bank's parameters, naively. */
static void ffn_ref(dsc_param *const *p, bool swiglu, int e, int count, const float *x, int64_t M, int64_t F,
                    float *y) {
    float *h = malloc((size_t)F * sizeof *h);
    const float *w1 = p[e]->value.data;
    for (int64_t f = 0; f < F; f++) {
        double a = 0, u = 0;
        for (int64_t c = 0; c < M; c++)
            a += (double)w1[f * M + c] * x[c];
        if (swiglu) {
            const float *wu = p[count + e]->value.data;
            for (int64_t c = 0; c < M; c++)
                u += (double)wu[f * M + c] * x[c];
            h[f] = (float)(a / (1.0 + exp(-a)) * u);
        } else {
            h[f] = gelu_ref((float)a + ((float *)p[count + e]->value.data)[f]);
        }
    }
    const float *w2 = p[2 * count + e]->value.data;
    for (int64_t c = 0; c < M; c++) {
        double a = swiglu ? 0 : ((float *)p[3 * count + e]->value.data)[c];
        for (int64_t f = 0; f < F; f++)
            a += (double)w2[c * F + f] * h[f];
        y[c] = (float)a;
    }
    free(h);
}

/* Slot 1 of the 3-FFN bank again in parts, FFN 2 then FFNs 0-1: each call
 * writes only its range, and together they give the whole call's output,
 * input gradient and parameter gradients (`once`, at grad_scale 0.5). */
static void bank_parts(dsc_moe_experts *bank, dsc_param_store *store, const dsc_tensor *x, const dsc_tensor *y,
                       const dsc_tensor *g, const dsc_tensor *dx, const float *once) {
    const int64_t n = dsc_tensor_numel(x), per = n / 3;
    dsc_tensor y2, dx2;
    assert_ok(dsc_tensor_alloc(&y2, DSC_DTYPE_F32, 3, x->shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    assert_ok(dsc_tensor_alloc(&dx2, DSC_DTYPE_F32, 3, x->shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    float *yv = y2.data, *dv = dx2.data;
    for (int64_t i = 0; i < n; i++)
        yv[i] = dv[i] = 7.0f;
    assert_ok(dsc_moe_experts_forward_part(bank, 1, 2, 1, x, &y2));
    for (int64_t i = 0; i < 2 * per; i++)
        assert_true(yv[i] == 7.0f);
    assert_ok(dsc_moe_experts_forward_part(bank, 1, 0, 2, x, &y2));
    assert_true(dsc_test_max_rel_err(yv, y->data, n, 1e-6, "bank output in parts") <= 1e-6);
    assert_ok(dsc_params_zero_grads(store));
    assert_ok(dsc_moe_experts_backward_part(bank, 1, 2, 1, g, &dx2, 0.5f));
    for (int64_t i = 0; i < 2 * per; i++)
        assert_true(dv[i] == 7.0f);
    assert_ok(dsc_moe_experts_backward_part(bank, 1, 0, 2, g, &dx2, 0.5f));
    assert_true(dsc_test_max_rel_err(dv, dx->data, n, 1e-6, "bank input gradient in parts") <= 1e-6);
    dsc_tensor values, grads;
    dsc_params_flat(store, DSC_PARAM_GROUP_EXPERT, &values, &grads);
    assert_true(
        dsc_test_max_rel_err(grads.data, once, dsc_tensor_numel(&grads), 1e-6, "bank gradients in parts") <= 1e-6);
    dsc_status s = dsc_moe_experts_forward_part(bank, 1, 2, 2, x, &y2);
    assert_non_null(s);
    assert_non_null(strstr(dsc_status_message(s), "FFNs [2, 2 + 2) outside the bank's 3"));
    dsc_status_free(s);
    dsc_tensor_free(&y2);
    dsc_tensor_free(&dx2);
}

static void bank_case(dsc_moe_expert_kind kind, int64_t M, int64_t F) {
    const int count = 3;
    const int64_t R = 5;
    dsc_moe_experts_options eo = {.kind = kind,
                                  .d_model = M,
                                  .d_ff = F,
                                  .count = count,
                                  .first = 4,
                                  .flags = DSC_PARAM_EXPERT,
                                  .init_std = 0.3f,
                                  .init_std_out = 0.3f};
    dsc_param_store *store;
    dsc_moe_experts *bank;
    assert_ok(dsc_params_create(&store, DSC_CPU, 8));
    assert_ok(dsc_moe_experts_create(&eo, "bank", store, DSC_CPU, &bank));
    assert_ok(dsc_params_finalize(store));
    assert_ok(dsc_moe_experts_reserve(bank, 2, R + 1));
    assert_non_null(
        dsc_params_find(store, kind == DSC_MOE_EXPERT_KIND_GELU ? "bank.6.fc.bias" : "bank.6.up.weight"));
    dsc_param *const *p = dsc_moe_experts_params(bank);
    for (int i = 0; i < dsc_moe_experts_param_count(bank); i++)
        moe_test_fill(p[i]->value.data, dsc_param_numel(p[i]), 70 + (uint64_t)i, 0.3f);
    const int64_t shape[3] = {count, R, M}, n = count * R * M;
    dsc_tensor x, y, g, dx;
    assert_ok(dsc_tensor_alloc(&x, DSC_DTYPE_F32, 3, shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    assert_ok(dsc_tensor_alloc(&y, DSC_DTYPE_F32, 3, shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    assert_ok(dsc_tensor_alloc(&g, DSC_DTYPE_F32, 3, shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    assert_ok(dsc_tensor_alloc(&dx, DSC_DTYPE_F32, 3, shape, DSC_CPU, DSC_MEM_ACTIVATIONS));
    moe_test_fill(x.data, n, 1, 1.0f);
    moe_test_fill(g.data, n, 2, 1.0f);
    assert_ok(dsc_moe_experts_forward(bank, 1, &x, &y));
    float *ref = malloc((size_t)n * sizeof *ref);
    for (int e = 0; e < count; e++)
        for (int64_t r = 0; r < R; r++)
            ffn_ref(p, kind == DSC_MOE_EXPERT_KIND_SWIGLU, e, count, (float *)x.data + (e * R + r) * M, M, F,
                    ref + (e * R + r) * M);
    assert_true(dsc_test_max_rel_err(y.data, ref, n, 1e-6, "bank output vs per-expert loop") <= 1e-5);
    /* grad_scale: backward with scale 0.5, then again with 1.5, accumulates 4x the first. */
    assert_ok(dsc_params_zero_grads(store));
    assert_ok(dsc_moe_experts_backward(bank, 1, &g, &dx, 0.5f));
    dsc_tensor values, grads;
    dsc_params_flat(store, DSC_PARAM_GROUP_EXPERT, &values, &grads);
    float *once = malloc((size_t)dsc_tensor_numel(&grads) * sizeof *once);
    memcpy(once, grads.data, (size_t)dsc_tensor_numel(&grads) * sizeof *once);
    bank_parts(bank, store, &x, &y, &g, &dx, once);
    assert_ok(dsc_moe_experts_forward(bank, 0, &x, &y));
    assert_ok(dsc_moe_experts_backward(bank, 0, &g, &dx, 1.5f));
    for (int64_t i = 0; i < dsc_tensor_numel(&grads); i++)
        assert_true(fabsf(((float *)grads.data)[i] - 4.0f * once[i]) <= 1e-5f * (1.0f + fabsf(4.0f * once[i])));
    double worst = 0;
    /* Input gradient by central differences on a few coordinates (f64 objective sum(g * y)). */
    for (int64_t i = 0; i < n; i += n / 7) {
        float *xi = (float *)x.data + i, old = *xi;
        double jp = 0, jm = 0;
        *xi = old + 1e-2f;
        assert_ok(dsc_moe_experts_forward(bank, 0, &x, &y));
        for (int64_t j = 0; j < n; j++)
            jp += (double)((float *)y.data)[j] * ((float *)g.data)[j];
        *xi = old - 1e-2f;
        assert_ok(dsc_moe_experts_forward(bank, 0, &x, &y));
        for (int64_t j = 0; j < n; j++)
            jm += (double)((float *)y.data)[j] * ((float *)g.data)[j];
        *xi = old;
        worst = fmax(worst, fabs((jp - jm) / 2e-2 - ((float *)dx.data)[i]));
    }
    printf("  bank %s M %lld F %lld: input gradient vs finite differences, max abs err %.2e\n",
           kind == DSC_MOE_EXPERT_KIND_GELU ? "gelu" : "swiglu", (long long)M, (long long)F, worst);
    assert_true(worst <= 1e-2);
    free(once);
    free(ref);
    dsc_tensor_free(&x);
    dsc_tensor_free(&y);
    dsc_tensor_free(&g);
    dsc_tensor_free(&dx);
    dsc_moe_experts_destroy(bank);
    dsc_params_destroy(store);
}

static void test_expert_banks(void **state) {
    (void)state;
    bank_case(DSC_MOE_EXPERT_KIND_GELU, 8, 16);   /* weights 128 floats: back to back; biases packed */
    bank_case(DSC_MOE_EXPERT_KIND_SWIGLU, 6, 10); /* 60 floats: every tensor packed */
}

/* A (2, 8) micro-batch of fixed tokens and targets (ids < 32) in tok and tgt, viewed as tokens and
 * targets. */
static void fixed_batch(int32_t tok[16], int32_t tgt[16], dsc_tensor *tokens, dsc_tensor *targets) {
    for (int i = 0; i < 16; i++)
        tok[i] = (i * 5) % 32, tgt[i] = (i * 3 + 1) % 32;
    const int64_t shape[2] = {2, 8};
    *tokens = dsc_tensor_view(tok, DSC_DTYPE_I32, 2, shape, DSC_CPU);
    *targets = dsc_tensor_view(tgt, DSC_DTYPE_I32, 2, shape, DSC_CPU);
}

/* ---- statistics inside a model ---------------------------------------------------------------- */

static void test_block_stats(void **state) {
    (void)state;
    dsc_model_config mc;
    moe_test_model_config(&mc, DSC_ARCH_GPT_MOE, 2, 4, 2);
    dsc_moe_build_extra extra = {.ep = NULL};
    moe_test_options(&extra.options, 4, 2, true, false, DSC_MOE_EXPERT_KIND_GELU);
    extra.options.gate.capacity_factor = 0.5;
    moe_test_model m;
    assert_ok(moe_test_model_build(&m, &mc, &extra, 1, 2, 8));
    int32_t tok[16], tgt[16];
    dsc_tensor tokens, targets;
    fixed_batch(tok, tgt, &tokens, &targets);
    double loss, aux;
    for (int step = 0; step < 2; step++)
        assert_ok(moe_test_model_step(&m, &tokens, &targets, NULL, &loss, &aux));
    dsc_moe_stats st;
    assert_err(dsc_moe_stats_get(m.layers[1], &st), DSC_ERR_INVALID, "neither a MoE layer nor a block");
    assert_ok(dsc_moe_stats_get(m.layers[2], &st)); /* block 1 is the MoE block */
    assert_int_equal(st.num_experts, 4);
    assert_int_equal(st.forwards, 2);
    assert_int_equal(st.tokens, 32);
    int64_t routed = 0, kept = 0, dropped = 0;
    for (int e = 0; e < 4; e++) {
        routed += st.routed[e];
        kept += st.kept[e];
        dropped += st.dropped[e];
        assert_true(st.kept[e] <= 2 * st.capacity);
    }
    printf("  routed %lld, kept %lld, dropped %lld, capacity %lld, l_aux sum %.4f, aux %.4f\n", (long long)routed,
           (long long)kept, (long long)dropped, (long long)st.capacity, st.l_aux, aux);
    assert_int_equal(routed, 2 * 16 * 2);
    assert_int_equal(kept + dropped, routed);
    assert_true(dropped > 0);
    assert_true(st.seconds[DSC_MOE_PHASE_EXPERTS] > 0);
    assert_string_equal(dsc_moe_phase_name(DSC_MOE_PHASE_ALLTOALL), "all-to-all");
    assert_ok(dsc_moe_stats_reset(m.layers[2]));
    assert_ok(dsc_moe_stats_get(m.layers[2], &st));
    assert_int_equal(st.forwards, 0);
    assert_int_equal(st.routed[0], 0);
    moe_test_model_free(&m);
}

/* ---- activation checkpointing ----------------------------------------------------------------- */

/* One training step of fixed_batch's micro-batch, the gate's stream seeded 5. */
static void fixed_step(moe_test_model *m, double *loss, double *aux) {
    int32_t tok[16], tgt[16];
    dsc_tensor tokens, targets;
    fixed_batch(tok, tgt, &tokens, &targets);
    dsc_rng rng;
    dsc_rng_init(&rng, 5, 0, DSC_RNG_GATE);
    assert_ok(moe_test_model_step(m, &tokens, &targets, &rng, loss, aux));
}

/* A Mixtral-style model with jitter and random second-expert sampling: with
 * activation checkpointing the block's recompute replays the same draws, so
 * loss, gate loss and every gradient equal the plain run's bitwise. The two
 * runs take different paths: the checkpointed blocks keep 3 (B, T, C)
 * buffers per token and recompute their forward (the MoE layer's forward
 * count doubles). */
static void test_checkpointing_replays_noise(void **state) {
    (void)state;
    double loss[2], aux[2];
    int64_t block_bytes[2], moe_forwards[2];
    float *grads[2][DSC_PARAM_GROUP_COUNT];
    int64_t numel[DSC_PARAM_GROUP_COUNT];
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        dsc_model_config mc;
        moe_test_model_config(&mc, DSC_ARCH_MIXTRAL, 2, 4, 1);
        mc.activation_checkpointing = ckpt;
        dsc_moe_build_extra extra = {.ep = NULL};
        moe_test_options(&extra.options, 4, 2, true, false, DSC_MOE_EXPERT_KIND_SWIGLU);
        extra.options.gate.noisy_gate_policy = DSC_MOE_NOISY_GATE_JITTER;
        extra.options.gate.top2_2nd_expert_sampling = true;
        moe_test_model m;
        assert_ok(moe_test_model_build(&m, &mc, &extra, 1, 2, 8));
        fixed_step(&m, &loss[ckpt], &aux[ckpt]);
        block_bytes[ckpt] = m.layers[1]->activation_bytes_per_token;
        dsc_moe_stats st;
        assert_ok(dsc_moe_stats_get(m.layers[1], &st));
        moe_forwards[ckpt] = st.forwards;
        for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
            dsc_tensor values, flat;
            dsc_params_flat(m.store, (dsc_param_group)g, &values, &flat);
            numel[g] = dsc_tensor_numel(&flat);
            grads[ckpt][g] = malloc((size_t)(numel[g] + 1) * sizeof(float));
            memcpy(grads[ckpt][g], flat.data, (size_t)numel[g] * sizeof(float));
        }
        moe_test_model_free(&m);
    }
    printf(
        "  loss %.9f vs %.9f, gate loss %.9f vs %.9f; block bytes/token %lld vs %lld, MoE forwards %lld vs %lld\n",
        loss[0], loss[1], aux[0], aux[1], (long long)block_bytes[0], (long long)block_bytes[1],
        (long long)moe_forwards[0], (long long)moe_forwards[1]);
    assert_int_equal(block_bytes[1], 3 * 16 * (int64_t)sizeof(float)); /* x, out, din: (B, T, C = 16) */
    assert_true(block_bytes[0] > block_bytes[1]);
    assert_int_equal(moe_forwards[1], 2 * moe_forwards[0]); /* the recompute */
    assert_true(loss[0] == loss[1]);
    assert_true(aux[0] == aux[1]);
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        assert_memory_equal(grads[0][g], grads[1][g], (size_t)numel[g] * sizeof(float));
        free(grads[0][g]);
        free(grads[1][g]);
    }
}

/* ---- mixed precision's 2-byte storage ------------------------------------------------------------ */

/* Under bf16 products the experts' (and the residual MLP's) hidden activations hold values of the type,
 * so keeping them in 2 bytes (dsc_layer_set_saved_dtype) changes no loss and no gradient bit, and the
 * MoE block's bytes per token fall by 2 a value of them; under f32 products the same storage rounds
 * them and the gradients move, so the check can fail. */
static void storage_case(dsc_model_arch arch, dsc_moe_expert_kind kind, bool residual) {
    double loss[3], aux[3];
    int64_t block_bytes[3];
    float *grads[3];
    int64_t numel = 0;
    const dsc_dtype saved[3] = {DSC_DTYPE_F32, DSC_DTYPE_BF16, DSC_DTYPE_BF16},
                    products[3] = {DSC_DTYPE_BF16, DSC_DTYPE_BF16, DSC_DTYPE_F32};
    for (int k = 0; k < 3; k++) {
        dsc_model_config mc;
        moe_test_model_config(&mc, arch, 2, 4, 1);
        dsc_moe_build_extra extra = {.ep = NULL};
        moe_test_options(&extra.options, 4, 2, true, residual, kind);
        moe_test_model m;
        assert_ok(moe_test_model_build(&m, &mc, &extra, 1, 2, 8));
        for (int l = 0; l < m.n; l++) {
            dsc_layer_set_saved_dtype(m.layers[l], saved[k]);
            assert_ok(dsc_layer_reserve(m.layers[l], 1, 2, 8));
        }
        const dsc_dtype was = dsc_kernels_set_matmul_dtype(products[k]);
        fixed_step(&m, &loss[k], &aux[k]);
        dsc_kernels_set_matmul_dtype(was);
        block_bytes[k] = m.layers[1]->activation_bytes_per_token;
        dsc_tensor values, flat;
        dsc_params_flat(m.store, DSC_PARAM_GROUP_EXPERT, &values, &flat);
        numel = dsc_tensor_numel(&flat);
        grads[k] = malloc((size_t)(numel + 1) * sizeof(float));
        memcpy(grads[k], flat.data, (size_t)numel * sizeof(float));
        moe_test_model_free(&m);
    }
    printf("  loss %.9f vs %.9f (f32 products %.9f); block bytes/token %lld vs %lld\n", loss[0], loss[1], loss[2],
           (long long)block_bytes[0], (long long)block_bytes[1]);
    assert_true(loss[0] == loss[1] && aux[0] == aux[1]);
    assert_true(numel > 0);
    assert_memory_equal(grads[0], grads[1], (size_t)numel * sizeof(float));
    assert_true(memcmp(grads[1], grads[2], (size_t)numel * sizeof(float)) != 0);
    assert_true(block_bytes[1] < block_bytes[0]);
    for (int k = 0; k < 3; k++)
        free(grads[k]);
}

static void test_two_byte_storage_is_bitwise(void **state) {
    (void)state;
    storage_case(DSC_ARCH_MIXTRAL, DSC_MOE_EXPERT_KIND_SWIGLU, false);
    storage_case(DSC_ARCH_GPT_MOE, DSC_MOE_EXPERT_KIND_GELU, true);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void test_bad_input(void **state) {
    (void)state;
    dsc_model_config mc;
    moe_test_model_config(&mc, DSC_ARCH_GPT_MOE, 1, 4, 1);
    dsc_param_store *store;
    dsc_layer *layer;
    assert_ok(dsc_params_create(&store, DSC_CPU, 1));
    dsc_moe_options o;
    moe_test_options(&o, 4, 5, true, false, DSC_MOE_EXPERT_KIND_GELU);
    assert_err(dsc_moe_layer_create(&o, &mc, 0, store, DSC_CPU, NULL, &layer), DSC_ERR_INVALID, "k");
    moe_test_options(&o, 4, 1, true, false, DSC_MOE_EXPERT_KIND_GELU);
    o.gate.capacity_factor = 0;
    assert_err(dsc_moe_layer_create(&o, &mc, 0, store, DSC_CPU, NULL, &layer), DSC_ERR_INVALID, "capacity_factor");
    o.gate.capacity_factor = -1;
    assert_err(dsc_moe_layer_create(&o, &mc, 0, store, DSC_CPU, NULL, &layer), DSC_ERR_INVALID, "capacity_factor");
    moe_test_options(&o, 4, 1, true, false, DSC_MOE_EXPERT_KIND_GELU);
    assert_err(dsc_moe_layer_create(&o, &mc, 0, store, (dsc_device){DSC_DEVICE_CUDA, 0}, NULL, &layer),
               DSC_ERR_UNSUPPORTED, "only CPU devices");
    assert_err(dsc_moe_check_parallel(8, 3, 6), DSC_ERR_INVALID,
               "moe.ep_size 3 does not divide moe.num_experts 8");
    assert_err(dsc_moe_check_parallel(8, 4, 6), DSC_ERR_INVALID, "moe.ep_size 4 does not divide the 6 ranks");
    assert_err(dsc_moe_check_parallel(8, 0, 4), DSC_ERR_INVALID, "moe.ep_size must be >= 1");
    assert_ok(dsc_moe_check_parallel(8, 4, 8));

    dsc_config_moe cm = {.num_experts = 4, .ep_size = 1, .k = 5, .capacity_factor = 1, .eval_capacity_factor = 1};
    dsc_moe_options out;
    assert_err(dsc_moe_options_from_config(&cm, DSC_ARCH_GPT, &out), DSC_ERR_CONFIG, "has no MoE layers");
    assert_err(dsc_moe_options_from_config(&cm, DSC_ARCH_MIXTRAL, &out), DSC_ERR_INVALID,
               "config section \"moe\"");
    cm.k = 2;
    cm.capacity_factor = 0;
    assert_err(dsc_moe_options_from_config(&cm, DSC_ARCH_MIXTRAL, &out), DSC_ERR_INVALID, "capacity_factor");
    cm.capacity_factor = 1.25;
    assert_ok(dsc_moe_options_from_config(&cm, DSC_ARCH_MIXTRAL, &out));
    assert_int_equal(out.expert_kind, DSC_MOE_EXPERT_KIND_SWIGLU);
    assert_int_equal(out.gate.k, 2);

    /* A moe_block needs its build extra. */
    assert_ok(dsc_nn_register_dense_layers());
    assert_ok(dsc_moe_register_layers());
    assert_ok(dsc_moe_register_layers()); /* idempotent */
    dsc_layer_spec spec = {.type = "moe_block", .block = 0};
    dsc_build_ctx ctx = {.model = &mc, .params = store, .device = DSC_CPU};
    assert_err(dsc_layer_build(&spec, &ctx, &layer), DSC_ERR_INVALID, "dsc_moe_build_extra");

    /* Backward without a forward. */
    assert_ok(dsc_moe_layer_create(&o, &mc, 0, store, DSC_CPU, NULL, &layer));
    assert_ok(dsc_params_finalize(store));
    assert_ok(dsc_layer_reserve(layer, 1, 1, 4));
    float g[64] = {0};
    dsc_tensor gt = dsc_tensor_view(g, DSC_DTYPE_F32, 3, (int64_t[]){1, 4, 16}, DSC_CPU), dx;
    dsc_micro_ctx mctx = {.loss_scale = 1.0f, .training = true};
    assert_err(dsc_layer_backward(layer, 0, &gt, &dx, &mctx), DSC_ERR_INVALID, "without a pending forward");
    dsc_layer_destroy(layer);
    dsc_params_destroy(store);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_top1_drop_gelu),
        cmocka_unit_test(test_fd_top2_drop_swiglu_residual),
        cmocka_unit_test(test_fd_top3_nodrop_gelu_jitter),
        cmocka_unit_test(test_expert_banks),
        cmocka_unit_test(test_block_stats),
        cmocka_unit_test(test_checkpointing_replays_noise),
        cmocka_unit_test(test_two_byte_storage_is_bitwise),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
