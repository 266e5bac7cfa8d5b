/* Mixed-precision training against PyTorch: the tiny untied GPT of the nn
 * fixtures trained 8 steps on one batch with AdamW + clipping through dsc's
 * real path (default runner, plain optimizer, the mixed-precision wrapper),
 * per-step losses compared with make_mixed_fixture.py's runs:
 *  - the same scheme in PyTorch (fp32 master, parameters, gradients and the
 *    activations between layers rounded to bf16 / fp16, every product's
 *    operands rounded to it with f32 sums, f32 compute otherwise; the first
 *    step's bf16 gradients, and fp16's at a loss scale that does not
 *    overflow, element by element; fp16 with DeepSpeed's own dynamic loss
 *    scaler, initial_scale_power 20 so that steps overflow and are skipped):
 *    within TOL_SCHEME (fp16: TOL_SCHEME_FP16), and the skipped steps and
 *    scales exactly;
 *  - PyTorch computing in bf16 / fp16 itself (model.to(dtype), DeepSpeed on
 *    a GPU): within TOL_LOWP of the bf16 run (fp16: its overflow pattern
 *    differs, activation gradients overflow in fp16 there; not compared).
 * Also the overflow path on its own: an inf gradient injected into one
 * step skips it (parameters and optimizer state unchanged, scale halved
 * after the hysteresis, the step logged), and the scale doubles after
 * loss_scale_window clean steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/engine.h"
#include "dsc/kernels.h"
#include "dsc/precision.h"
#include "nn_test_util.h"
#include "test_mpi.h"

#define FIXTURE "../../precision/fixtures/mixed_gpt" /* fixture_load reads tests/nn/fixtures/<name> */
/* Measured (see docs/training.md): scheme vs dsc max |loss diff| fp32 7.6e-7, bf16 1.2e-3, fp16 1.3e-3
 * (fp16 with f32 products: 6.8e-4): the first step's gradients agree element by element (but one-ulp
 * roundings decided by f32 noise), and over 8 steps those flips grow (bf16 has 8 bits). fp16's one
 * difference is its first update (steps 0-3 overflow), AdamW's first step, lr times each gradient's
 * sign, so a gradient whose sum cancels to near 0 and takes the other sign in dsc's f32 summation
 * order moves its parameter by 2 lr: as the rounding of the MLP's fc output, the residual sums and
 * the logits came in, it went 8.9e-5, 1.4e-3 (3 such signs), 1.6e-4, 1.3e-3. bf16-computing PyTorch
 * vs dsc's bf16 2.5e-2 (every activation in bf16 there). */
#define TOL_SCHEME 2e-3
#define TOL_SCHEME_FP16 2e-3
#define TOL_LOWP 5e-2
/* torch.autocast over the f32 model (the fixture's *_autocast: its linears and matmuls in bf16 /
 * fp16 with 2-byte outputs, the residual stream f32, f32 parameter gradients): measured bf16 5.0e-3,
 * fp16 5.3e-4; below f32 training's own distance to bf16 autocast, 7.4e-3 (see docs/training.md). */
#define TOL_AUTOCAST 7e-3

typedef struct fixed_source {
    dsc_batch_source base;
    const fixture_array *tok, *tgt;
} fixed_source;

static dsc_status fixed_next(dsc_batch_source *base, dsc_tensor *tokens, dsc_tensor *targets) {
    fixed_source *s = (fixed_source *)base;
    memcpy(tokens->data, s->tok->data, (size_t)s->tok->numel * sizeof(int32_t));
    memcpy(targets->data, s->tgt->data, (size_t)s->tgt->numel * sizeof(int32_t));
    base->consumed++;
    return NULL;
}

typedef struct run_opts {
    dsc_dtype dtype; /* F32: no wrapper */
    unsigned inject; /* bit s: step s's gradients get an inf */
    int64_t window;  /* fp16 loss_scale_window override (0: the fixture's) */
    double init_power;
    bool check;        /* bf16.check_grad_overflow */
    bool expect_error; /* the step at inject_at fails (an unchecked non-finite gradient) */
    int inject_at;
    bool ranges; /* the master a copy of the ranges (ZeRO-1/2's path), not the store's values */
    /* after the steps, the layer calls are checked to read the master rounded (the store's path) */
    bool check_reads;
    bool tied;   /* the head reads the embedding's table (the fixture's head.weight unused) */
    bool grads0; /* the first step's gradients are compared with the fixture's of the dtype */
} run_opts;

typedef struct run_out {
    double loss[16];
    double scale[16];
    bool skipped[16];
    float *params; /* after the run, flat values of the dense group */
    int64_t n_params;
    int bad_grads, exact_grads, n_grads;        /* first step's gradients vs grad0_bf16/, grad0_fp16/ */
    float worst_rel;                            /* the largest difference over its tensor's largest |gradient| */
    int64_t wrap_bytes[DSC_MEM_CATEGORY_COUNT]; /* what wrapping the optimizer allocated */
    int64_t largest_layer;                      /* the most elements one layer reads rounded */
    /* the most gradient elements of one layer, and of those its kernels do not round (its norms') */
    int64_t largest_grads, largest_unrounded_grads;
    int weights;   /* parameter uses flagged as product operands */
    float *grads0; /* tied runs: the first step's flat dense gradients */
} run_out;

static const fixture_array *grad0_of(const fixture *f, const dsc_param *p, dsc_dtype dtype) {
    char name[200];
    snprintf(name, sizeof name, "grad0_%s/%s", dtype == DSC_DTYPE_BF16 ? "bf16" : "fp16", p->name);
    const fixture_array *a = fixture_get(f, name);
    if (!a) fail_msg("fixture has no %s", name);
    return a;
}

static float largest_abs(const float *x, int64_t n) {
    float top = 0;
    for (int64_t j = 0; j < n; j++)
        top = fmaxf(top, fabsf(x[j]));
    return top;
}

/* Each gradient element equals PyTorch's bf16 / fp16 gradient (grad0_bf16/, grad0_fp16/: at the loss
 * scale), or is within one ulp of it or within 2^-8 of its tensor's largest element (a rounding of an
 * activation gradient decided by f32 noise in another summation order moves a sum that cancels to
 * near 0). A gradient that is 0 but for rounding noise (the key bias: softmax is shift invariant;
 * under fp16 the rounded score gradients leave a residue of their ulps) stays at that noise, far
 * below every real gradient. fp16's products, unlike bf16's, do not sum exactly in f32 (22-bit
 * products), so f32's summation order flips one-ulp roundings more often there. */
static void compare_grads(const fixture *f, dsc_param_store *store, dsc_dtype dtype, run_out *out) {
    const float ulp_of_value = dtype == DSC_DTYPE_BF16 ? 0x1p-7f : 0x1p-10f; /* bits after the point */
    out->bad_grads = out->exact_grads = out->n_grads = 0;
    out->worst_rel = 0;
    float everywhere = 0;
    for (int i = 0; i < dsc_params_count(store); i++) {
        const fixture_array *a = grad0_of(f, dsc_params_at(store, i), dtype);
        everywhere = fmaxf(everywhere, largest_abs(a->data, a->numel));
    }
    for (int i = 0; i < dsc_params_count(store); i++) {
        dsc_param *p = dsc_params_at(store, i);
        const fixture_array *a = grad0_of(f, p, dtype);
        const float *want = a->data, *got = p->grad.data;
        float top = largest_abs(want, a->numel);
        if (top < 0x1p-12f * everywhere) { /* noise: stays noise */
            out->bad_grads += largest_abs(got, a->numel) > 0x1p-10f * everywhere;
            continue;
        }
        for (int64_t j = 0; j < a->numel; j++) {
            float ulp = fabsf(want[j]) * ulp_of_value, d = fabsf(got[j] - want[j]);
            out->exact_grads += got[j] == want[j];
            out->bad_grads += d > 1.01f * ulp && d > 0x1p-8f * top;
            out->worst_rel = fmaxf(out->worst_rel, top > 0 ? d / top : 0);
            if (getenv("DSC_TEST_VERBOSE") && d > 1.01f * ulp && d > 0x1p-8f * top)
                printf("    %s[%lld]: %g, PyTorch %g (largest %g)\n", p->name, (long long)j, (double)got[j],
                       (double)want[j], (double)top);
            out->n_grads++;
        }
    }
}

/* Whether a layer call reads the parameter's master as it is, said from what the layers do: the
 * embedding's backward reads no value (it scatters dout) and its lookup rounds the rows it reads
 * under bf16 / fp16; the other layers read their matrices (every ".weight" but the norms') only in
 * products, which round them under bf16 / fp16. */
static bool as_is(const dsc_layer *layer, const dsc_param *p, dsc_dtype dtype, bool backward) {
    const char *leaf = strrchr(p->name, '.');
    bool matrix = leaf && strcmp(leaf, ".weight") == 0 && !strstr(p->name, "norm");
    if (strcmp(layer->name, "embed") == 0) return backward || dtype != DSC_DTYPE_F32;
    return dtype != DSC_DTYPE_F32 && matrix;
}

/* Each layer call reads its values rounded from elsewhere (but the weights bf16 / fp16 products round), and
 * after it the parameters view the store's values again, unchanged. */
static void check_reads(dsc_layer **layers, int n, dsc_optimizer *opt, dsc_dtype dtype) {
    for (int l = 0; l < n; l++) {
        for (int backward = 0; backward < 2; backward++) {
            dsc_layer *layer = layers[l];
            float *master[16];
            assert_true(layer->n_params <= 16);
            for (int j = 0; j < layer->n_params; j++)
                master[j] = layer->params[j]->value.data;
            assert_ok(dsc_optimizer_before_layer(opt, layer, backward));
            for (int j = 0; j < layer->n_params; j++) {
                const dsc_param *p = layer->params[j];
                int64_t k = dsc_param_numel(p);
                float *want = malloc((size_t)k * sizeof *want);
                dsc_round_to_dtype_from(want, master[j], k, dtype);
                if (as_is(layer, p, dtype, backward)) { /* the products round it, or nothing reads it */
                    assert_ptr_equal(p->value.data, master[j]);
                } else {
                    assert_ptr_not_equal(p->value.data, master[j]);
                    assert_memory_equal(p->value.data, want, (size_t)k * sizeof *want);
                }
                free(want);
            }
            assert_ok(dsc_optimizer_after_layer(opt, layer, backward)); /* adds the scratch's 0 gradients */
            for (int j = 0; j < layer->n_params; j++)
                assert_ptr_equal(layer->params[j]->value.data, master[j]);
        }
    }
    /* A backward that failed (no after_layer): the next call puts its gradient views back. */
    float *grads[16];
    for (int j = 0; j < layers[0]->n_params; j++)
        grads[j] = layers[0]->params[j]->grad.data;
    assert_ok(dsc_optimizer_before_layer(opt, layers[0], true));
    assert_ok(dsc_optimizer_before_layer(opt, layers[1], false));
    for (int j = 0; j < layers[0]->n_params; j++)
        assert_ptr_equal(layers[0]->params[j]->grad.data, grads[j]);
    assert_ok(dsc_optimizer_after_layer(opt, layers[1], false));
}

static void train(const fixture *f, const run_opts *ro, int steps, run_out *out) {
    dsc_model_config mc;
    fixture_model_config(f, &mc);
    mc.tie_embeddings = ro->tied;
    const fixture_array *tok = fixture_get(f, "tokens"), *tgt = fixture_get(f, "targets");
    test_model m;
    assert_ok(test_model_build(&m, &mc, DSC_CPU, 1, 1, tok->shape[0], tok->shape[1]));
    for (int i = 0; i < dsc_params_count(m.store); i++) {
        dsc_param *p = dsc_params_at(m.store, i);
        char name[200];
        snprintf(name, sizeof name, "param/%s", p->name);
        const fixture_array *a = fixture_get(f, name);
        if (!a) fail_msg("fixture has no %s", name);
        dsc_tensor src = dsc_tensor_view(a->data, DSC_DTYPE_F32, p->value.ndim, p->value.shape, DSC_CPU);
        assert_ok(dsc_tensor_copy(&p->value, &src));
    }
    dsc_optimizer_options oo = {
        .params = m.store,
        .layers = m.layers,
        .n_layers = m.n,
        .hparams = {.type = DSC_OPTIMIZER_TYPE_ADAMW,
                    .beta1 = (float)fixture_meta(f, "beta1"),
                    .beta2 = (float)fixture_meta(f, "beta2"),
                    .eps = (float)fixture_meta(f, "eps"),
                    .weight_decay = (float)fixture_meta(f, "weight_decay"),
                    .clip_norm = fixture_meta(f, "clip")},
    };
    dsc_optimizer *opt;
    assert_ok(dsc_optimizer_create_plain(&oo, &opt));
    if (ro->dtype != DSC_DTYPE_F32) {
        dsc_precision_options po = {.dtype = ro->dtype, .opt = &oo, .log = true};
        bool fp16 = ro->dtype == DSC_DTYPE_F16;
        po.check_overflow = fp16 || ro->check;
        po.scaler = (dsc_loss_scaler_options){
            .dynamic = fp16,
            .init_scale = fp16 ? ldexp(1.0, (int)(ro->init_power > 0 ? ro->init_power
                                                                     : fixture_meta(f, "initial_scale_power")))
                               : 1.0,
            .scale_window = ro->window > 0 ? ro->window : (int64_t)fixture_meta(f, "loss_scale_window"),
            .hysteresis = (int)fixture_meta(f, "hysteresis"),
            .min_scale = fixture_meta(f, "min_loss_scale"),
            .scale_factor = 2.0,
        };
        dsc_tensor grads;
        dsc_params_flat(m.store, DSC_PARAM_GROUP_DENSE, NULL, &grads);
        po.ranges[DSC_PARAM_GROUP_DENSE] = (dsc_precision_range){0, dsc_tensor_numel(&grads), grads};
        po.whole = !ro->ranges;
        dsc_mem_stats before, after;
        dsc_mem_get_stats(&before);
        dsc_optimizer *wrapped;
        assert_ok(dsc_precision_wrap(&po, opt, &wrapped));
        dsc_mem_get_stats(&after);
        for (int c = 0; c < DSC_MEM_CATEGORY_COUNT; c++)
            out->wrap_bytes[c] = after.current[c] - before.current[c];
        opt = wrapped;
    }
    out->largest_layer = out->weights = out->largest_grads = out->largest_unrounded_grads = 0;
    out->grads0 = NULL;
    for (int l = 0; l < m.n; l++) {
        int64_t n = 0, grads = 0, unrounded = 0;
        for (int j = 0; j < m.layers[l]->n_params; j++) {
            const dsc_param *p = m.layers[l]->params[j];
            grads += dsc_param_numel(p);
            if (!(m.layers[l]->param_uses[j] & DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS))
                unrounded += dsc_param_numel(p);
            if (!as_is(m.layers[l], p, ro->dtype, false)) n += dsc_param_numel(p);
            if (as_is(m.layers[l], p, DSC_DTYPE_BF16, false)) out->weights++;
        }
        if (n > out->largest_layer) out->largest_layer = n;
        if (grads > out->largest_grads) out->largest_grads = grads;
        if (unrounded > out->largest_unrounded_grads) out->largest_unrounded_grads = unrounded;
    }
    dsc_batch_runner *runner;
    assert_ok(dsc_runner_create_default(m.layers, m.n, opt, tok->shape[0], tok->shape[1], NULL, &runner));
    for (int s = 0; s < steps; s++) {
        fixed_source src = {{fixed_next, 1, 0}, tok, tgt};
        dsc_batch_result res;
        assert_ok(runner->ops->train_batch(runner, &src.base, &res));
        if (ro->inject >> s & 1u) { /* an overflow in one gradient element */
            dsc_param *p = dsc_params_at(m.store, 1);
            ((float *)p->grad.data)[3] = INFINITY;
        }
        assert_ok(dsc_optimizer_reduce_grads(opt));
        if (s == 0 && ro->tied) {
            dsc_tensor grads;
            dsc_params_flat(m.store, DSC_PARAM_GROUP_DENSE, NULL, &grads);
            out->grads0 = malloc((size_t)dsc_tensor_numel(&grads) * sizeof(float));
            memcpy(out->grads0, grads.data, (size_t)dsc_tensor_numel(&grads) * sizeof(float));
        } else if (s == 0 && ro->grads0) {
            compare_grads(f, m.store, ro->dtype, out);
        }
        dsc_optim_stats st;
        dsc_status step_status = dsc_optimizer_step(opt, fixture_meta(f, "lr"), &st);
        if (ro->expect_error && s == ro->inject_at) {
            assert_err(step_status, DSC_ERR_NUMERIC, "global gradient norm is");
            out->loss[s] = res.loss;
            break; /* the run stops there */
        }
        assert_ok(step_status);
        out->loss[s] = res.loss;
        out->skipped[s] = dsc_precision_last_step(opt, &out->scale[s]);
    }
    if (ro->check_reads) check_reads(m.layers, m.n, opt, ro->dtype);
    dsc_tensor values;
    dsc_params_flat(m.store, DSC_PARAM_GROUP_DENSE, &values, NULL);
    out->n_params = dsc_tensor_numel(&values);
    out->params = malloc((size_t)out->n_params * sizeof(float));
    memcpy(out->params, values.data, (size_t)out->n_params * sizeof(float));
    dsc_batch_runner_destroy(runner);
    dsc_optimizer_destroy(opt);
    test_model_free(&m);
}

static double compare(const fixture *f, const char *mode, const run_out *got, int steps) {
    char name[64];
    snprintf(name, sizeof name, "loss/%s", mode);
    const fixture_array *ref = fixture_get(f, name);
    assert_non_null(ref);
    double worst = 0;
    for (int s = 0; s < steps; s++)
        worst = fmax(worst, fabs(got->loss[s] - ((const float *)ref->data)[s]));
    return worst;
}

static void test_against_pytorch(void **state) {
    (void)state;
    fixture f;
    fixture_load(&f, FIXTURE);
    const int steps = (int)fixture_meta(&f, "steps");
    struct {
        const char *mode;
        dsc_dtype dtype;
    } modes[] = {{"fp32", DSC_DTYPE_F32}, {"bf16", DSC_DTYPE_BF16}, {"fp16", DSC_DTYPE_F16}};
    run_out outs[3];
    for (int k = 0; k < 3; k++) {
        run_opts ro = {.dtype = modes[k].dtype, .grads0 = modes[k].dtype == DSC_DTYPE_BF16};
        train(&f, &ro, steps, &outs[k]);
        double d = compare(&f, modes[k].mode, &outs[k], steps);
        if (getenv("DSC_TEST_VERBOSE"))
            for (int s = 0; s < steps; s++)
                printf("    %s step %d: %.7f\n", modes[k].mode, s, outs[k].loss[s]);
        printf("  %-4s vs PyTorch's %-4s scheme: max |loss diff| %.2e over %d steps (losses %.5f -> %.5f)\n",
               modes[k].mode, modes[k].mode, d, steps, outs[k].loss[0], outs[k].loss[steps - 1]);
        assert_true(d <= (modes[k].dtype == DSC_DTYPE_F16 ? TOL_SCHEME_FP16 : TOL_SCHEME));
    }
    /* the first step's gradients, bf16's and fp16's at a loss scale that does not overflow */
    run_out g16;
    run_opts ro16 = {
        .dtype = DSC_DTYPE_F16, .init_power = fixture_meta(&f, "fp16_grad0_scale_power"), .grads0 = true};
    train(&f, &ro16, 1, &g16);
    const run_out *grads[2] = {&outs[1], &g16};
    for (int k = 0; k < 2; k++) {
        printf("  %s first-step gradients: %d of %d elements equal PyTorch's, %d outside one ulp / 2^-8 of the "
               "tensor's largest; largest difference %.2e of its tensor's largest\n",
               k ? "fp16" : "bf16", grads[k]->exact_grads, grads[k]->n_grads, grads[k]->bad_grads,
               (double)grads[k]->worst_rel);
        assert_true(grads[k]->n_grads > 0 && grads[k]->bad_grads == 0);
        assert_true(grads[k]->exact_grads >= (k ? 0.5 : 0.99) * grads[k]->n_grads); /* compare_grads: why */
    }
    free(g16.params);
    /* fp16's overflow pattern and scales are DeepSpeed's */
    const fixture_array *sk = fixture_get(&f, "skipped/fp16"), *sc = fixture_get(&f, "scale/fp16");
    int n_skipped = 0;
    for (int s = 0; s < steps; s++) {
        assert_int_equal(outs[2].skipped[s], ((const int32_t *)sk->data)[s] != 0);
        assert_true(outs[2].scale[s] == ((const float *)sc->data)[s]);
        n_skipped += outs[2].skipped[s];
    }
    assert_true(n_skipped > 0); /* the fixture exercises the overflow path */
    double lowp = compare(&f, "bf16_lowp", &outs[1], steps);
    printf("  bf16 vs PyTorch computing in bf16 (model.to(bfloat16)): max |loss diff| %.2e; fp16 skipped %d "
           "of %d steps as DeepSpeed's scaler\n",
           lowp, n_skipped, steps);
    assert_true(lowp <= TOL_LOWP);
    /* torch.autocast: bf16's losses, and fp16's with the same overflowing steps */
    const double ac16 = compare(&f, "bf16_autocast", &outs[1], steps),
                 ac = compare(&f, "fp16_autocast", &outs[2], steps);
    printf("  vs torch.autocast: bf16 max |loss diff| %.2e, fp16 %.2e\n", ac16, ac);
    assert_true(ac16 <= TOL_AUTOCAST && ac <= TOL_AUTOCAST);
    const fixture_array *sk_ac = fixture_get(&f, "skipped/fp16_autocast");
    for (int s = 0; s < steps; s++)
        assert_int_equal(outs[2].skipped[s], ((const int32_t *)sk_ac->data)[s] != 0);
    /* bf16 differs from f32 (the rounding is real), and learns */
    assert_true(compare(&f, "fp32", &outs[1], steps) > 1e-4);
    assert_true(outs[1].loss[steps - 1] < outs[1].loss[0] - 1.0);
    for (int k = 0; k < 3; k++)
        free(outs[k].params);
    fixture_free(&f);
}

/* The plain optimizer's path: the store's values are the fp32 master (no copy of it is allocated, only
 * one layer's scratch of working values; after 3 steps not every value is a bf16 / fp16 one) and each
 * layer call reads them rounded. ZeRO-1/2's path (the master a copy of the ranges): every value of the
 * store is the working value, exact in the reduced type. */
static void test_where_the_master_lives(void **state) {
    (void)state;
    fixture f;
    fixture_load(&f, FIXTURE);
    dsc_dtype types[2] = {DSC_DTYPE_BF16, DSC_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        for (int ranges = 0; ranges < 2; ranges++) {
            run_out o;
            run_opts ro = {.dtype = types[k], .init_power = 8, .ranges = ranges, .check_reads = !ranges};
            train(&f, &ro, 3, &o);
            float *copy = malloc((size_t)o.n_params * sizeof(float));
            dsc_round_to_dtype_from(copy, o.params, o.n_params, types[k]);
            bool rounded = memcmp(copy, o.params, (size_t)o.n_params * sizeof(float)) == 0;
            int64_t master = o.wrap_bytes[DSC_MEM_OPTIM], working = o.wrap_bytes[DSC_MEM_PARAMS];
            printf("  %s, master %s: %lld bytes of master and %lld of working values allocated for %lld "
                   "parameters\n",
                   dsc_dtype_name(types[k]), ranges ? "a copy of the ranges" : "the store's values",
                   (long long)master, (long long)working, (long long)o.n_params);
            if (ranges) {
                assert_true(rounded);
                assert_int_equal(master, o.n_params * (int64_t)sizeof(float));
                assert_int_equal(working, 0);
            } else {
                assert_false(rounded);
                assert_int_equal(master, 0);
                assert_int_equal(working, o.largest_layer * (int64_t)sizeof(float));
                assert_true(o.weights > 0);
            }
            /* The gradient scratch holds one layer's norm gradients: the products' and the embedding's
             * contributions are rounded by their kernels, not in a scratch of the largest layer's size
             * (the tied embedding's, here). */
            printf("  %s: %lld bytes of gradient scratch; the largest layer has %lld gradient elements\n",
                   dsc_dtype_name(types[k]), (long long)o.wrap_bytes[DSC_MEM_GRADS], (long long)o.largest_grads);
            assert_true(o.largest_unrounded_grads > 0 && o.largest_unrounded_grads * 8 < o.largest_grads);
            assert_int_equal(o.wrap_bytes[DSC_MEM_GRADS], o.largest_unrounded_grads * (int64_t)sizeof(float));
            free(copy);
            free(o.params);
        }
    }
    fixture_free(&f);
}

/* A tied embedding under bf16: the head and the lookup read it as it is (the products and the lookup
 * round what they read), the embedding's backward not at all, and the run is bitwise ZeRO-1/2's
 * path, where every layer reads the rounded store. */
static void test_tied_weight_uses(void **state) {
    (void)state;
    fixture f;
    fixture_load(&f, FIXTURE);
    run_out o[2];
    for (int ranges = 0; ranges < 2; ranges++) {
        run_opts ro = {.dtype = DSC_DTYPE_BF16, .ranges = ranges, .check_reads = !ranges, .tied = true};
        train(&f, &ro, 3, &o[ranges]);
    }
    assert_int_equal(o[0].n_params, o[1].n_params);
    assert_memory_equal(o[0].grads0, o[1].grads0, (size_t)o[0].n_params * sizeof(float));
    for (int s = 0; s < 3; s++)
        assert_true(o[0].loss[s] == o[1].loss[s]);
    float *rounded = malloc((size_t)o[0].n_params * sizeof(float));
    dsc_round_to_dtype_from(rounded, o[0].params, o[0].n_params, DSC_DTYPE_BF16);
    assert_memory_equal(rounded, o[1].params, (size_t)o[0].n_params * sizeof(float));
    printf("  tied bf16: first-step gradients and 3 losses bitwise those of the rounded store\n");
    free(rounded);
    for (int k = 0; k < 2; k++) {
        free(o[k].params);
        free(o[k].grads0);
    }
    fixture_free(&f);
}

/* An inf in step 2's gradients (scale 2^8, hysteresis 2, window 2): step 2
 * is skipped with the parameters untouched; over a longer run two overflows
 * halve the scale and clean steps double it again. */
static void test_overflow_path(void **state) {
    (void)state;
    fixture f;
    fixture_load(&f, FIXTURE);
    run_out clean, hit;
    run_opts ro_clean = {.dtype = DSC_DTYPE_F16, .window = 2, .init_power = 8},
             ro_hit = {.dtype = DSC_DTYPE_F16, .inject = 1u << 2, .window = 2, .init_power = 8};
    train(&f, &ro_clean, 2, &clean); /* the parameters after steps 0, 1 */
    train(&f, &ro_hit, 3, &hit);     /* steps 0, 1, then the injected step 2 */
    assert_false(hit.skipped[0] || hit.skipped[1]);
    assert_true(hit.skipped[2]);
    assert_int_equal(hit.n_params, clean.n_params);
    /* skipped: nothing moved */
    assert_memory_equal(hit.params, clean.params, (size_t)clean.n_params * sizeof(float));
    free(clean.params);
    free(hit.params);

    /* the scale over a longer run: 2^8, window 2, hysteresis 2, overflows at steps 1 and 2. DeepSpeed's
     * rule: the first overflow uses up the hysteresis, the second halves; the scale doubles when
     * (iteration - last overflow - 1) is a positive multiple of the window. The scale each step used: */
    run_out o;
    run_opts ro = {.dtype = DSC_DTYPE_F16, .inject = 3u << 1, .window = 2, .init_power = 8};
    train(&f, &ro, 8, &o);
    const double want[8] = {256, 256, 256, 128, 128, 128, 256, 256};
    for (int s = 0; s < 8; s++) {
        printf("  step %d: loss scale %g%s\n", s, o.scale[s], o.skipped[s] ? " (skipped)" : "");
        assert_true(o.scale[s] == want[s]);
        assert_int_equal(o.skipped[s], s == 1 || s == 2);
    }
    free(o.params);
    fixture_free(&f);
}

/* bf16 has no loss scale: an inf gradient stops the run with the step named (as f32 training), unless
 * bf16.check_grad_overflow, which skips that step with nothing moved. */
static void test_bf16_check_grad_overflow(void **state) {
    (void)state;
    fixture f;
    fixture_load(&f, FIXTURE);
    run_out clean, hit, stop;
    run_opts ro_clean = {.dtype = DSC_DTYPE_BF16},
             ro_hit = {.dtype = DSC_DTYPE_BF16, .inject = 1u << 2, .check = true};
    train(&f, &ro_clean, 2, &clean);
    train(&f, &ro_hit, 3, &hit);
    assert_true(hit.skipped[2] && !hit.skipped[0] && !hit.skipped[1]);
    assert_memory_equal(hit.params, clean.params, (size_t)clean.n_params * sizeof(float));
    run_opts ro_stop = {.dtype = DSC_DTYPE_BF16, .inject = 1u << 1, .expect_error = true, .inject_at = 1};
    train(&f, &ro_stop, 3, &stop);
    free(clean.params);
    free(hit.params);
    free(stop.params);
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_pytorch),          cmocka_unit_test(test_where_the_master_lives),
        cmocka_unit_test(test_tied_weight_uses),         cmocka_unit_test(test_overflow_path),
        cmocka_unit_test(test_bf16_check_grad_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
