/* The plain data-parallel optimizer on every rank of the job: bucketed
 * averaging equals the hand-computed mean of every rank's gradients (and the
 * unbucketed result); a bucket is reduced as soon as its parameters are final
 * (a parameter read by two layers only after both); AdamW with clipping and
 * no-decay parameters matches a naive double-precision reference; a NaN
 * gradient stops the step with DSC_ERR_NUMERIC naming it and leaves the
 * parameters alone; the checkpoint state is enumerated by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/comm.h"
#include "dsc/optimizer.h"
#include "test_mpi.h"

enum { NP = 3 };
static const int64_t sizes[NP] = {100, 37, 260};
static const char *const names[NP] = {"a.weight", "b.bias", "c.weight"};

typedef struct fixture {
    dsc_comm *world;
    dsc_param_store *store;
    dsc_param *p[NP];
    dsc_layer layers[2]; /* layer 0 reads a, b; layer 1 reads c, a (a is tied) */
    dsc_param *l0[2], *l1[2];
} fixture;

/* Gradient of parameter j, element i, on rank r: distinct per rank. */
static float grad_value(int r, int j, int64_t i) {
    return (float)(0.01 * (double)((r + 1) * (j + 2)) * sin((double)i + r));
}

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    assert_ok(dsc_comm_world(NULL, &f->world));
    assert_ok(dsc_params_create(&f->store, DSC_CPU, 7));
    for (int j = 0; j < NP; j++)
        assert_ok(dsc_params_declare(f->store, names[j], 1, &sizes[j], j == 1 ? DSC_PARAM_NO_DECAY : 0,
                                     DSC_INIT_NORMAL, 0.5f, &f->p[j]));
    assert_ok(dsc_params_finalize(f->store));
    f->l0[0] = f->p[0];
    f->l0[1] = f->p[1];
    f->l1[0] = f->p[2];
    f->l1[1] = f->p[0];
    f->layers[0] = (dsc_layer){.name = "layer0", .params = f->l0, .n_params = 2};
    f->layers[1] = (dsc_layer){.name = "layer1", .params = f->l1, .n_params = 2};
}

static void set_grads(fixture *f) {
    int r = dsc_comm_rank(f->world);
    for (int j = 0; j < NP; j++)
        for (int64_t i = 0; i < sizes[j]; i++)
            ((float *)f->p[j]->grad.data)[i] = grad_value(r, j, i);
}

static double mean_grad(int size, int j, int64_t i) {
    double s = 0;
    for (int r = 0; r < size; r++)
        s += grad_value(r, j, i);
    return s / size;
}

static dsc_optimizer *make_opt_hp(fixture *f, int64_t bucket, dsc_optim_hparams hp) {
    dsc_layer *layers[2] = {&f->layers[0], &f->layers[1]};
    dsc_optimizer_options o = {
        .params = f->store,
        .layers = layers,
        .n_layers = 2,
        .dp = f->world,
        .hparams = hp,
        .reduce_bucket_size = bucket,
    };
    dsc_optimizer *opt;
    assert_ok(dsc_optimizer_create_plain(&o, &opt));
    return opt;
}

static dsc_optimizer *make_opt(fixture *f, int64_t bucket, double clip) {
    return make_opt_hp(f, bucket,
                       (dsc_optim_hparams){.type = DSC_OPTIMIZER_TYPE_ADAMW,
                                           .beta1 = 0.9f,
                                           .beta2 = 0.95f,
                                           .eps = 1e-8f,
                                           .weight_decay = 0.1f,
                                           .clip_norm = clip});
}

static void fixture_free(fixture *f) {
    dsc_params_destroy(f->store);
    dsc_comm_free(f->world);
}

static int64_t allreduce_calls(dsc_comm *c) {
    dsc_comm_stats st;
    dsc_comm_get_stats(c, &st);
    return st.calls[DSC_COMM_OP_ALLREDUCE];
}

static void test_bucketed_average(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    int size = dsc_comm_size(f.world);
    for (int pass = 0; pass < 2; pass++) {
        int64_t bucket = pass == 0 ? 50 : 0; /* 50 elements, or one bucket */
        dsc_optimizer *opt = make_opt(&f, bucket, 0);
        set_grads(&f);
        int64_t before = allreduce_calls(f.world);
        /* Backward order: layer 1 first. a is still awaited by layer 0, so
         * only the buckets lying inside c are reduced now. */
        assert_ok(dsc_optimizer_grads_ready(opt, &f.layers[1]));
        int64_t after_l1 = allreduce_calls(f.world);
        if (bucket > 0) {
            int64_t inside_c = 0; /* buckets wholly inside c's elements */
            for (int64_t b = 0; b * bucket < dsc_params_numel(f.store, DSC_PARAM_GROUP_DENSE); b++)
                inside_c += b * bucket >= f.p[2]->offset && (b + 1) * bucket <= f.p[2]->offset + sizes[2];
            if (size > 1) assert_true(after_l1 - before >= inside_c && inside_c > 0);
            /* a (offset 0) is not final: its first element is untouched */
            assert_true(((float *)f.p[0]->grad.data)[1] == grad_value(dsc_comm_rank(f.world), 0, 1));
        } else {
            assert_int_equal(after_l1, before); /* one bucket waits for everything */
        }
        assert_ok(dsc_optimizer_grads_ready(opt, &f.layers[0]));
        assert_ok(dsc_optimizer_reduce_grads(opt));
        double worst = 0;
        for (int j = 0; j < NP; j++)
            for (int64_t i = 0; i < sizes[j]; i++)
                worst = fmax(worst, fabs(((float *)f.p[j]->grad.data)[i] - mean_grad(size, j, i)));
        printf("  bucket %lld: max |avg - expected| = %.3e over %d ranks\n", (long long)bucket, worst, size);
        assert_true(worst <= 1e-7);
        dsc_optimizer_destroy(opt);
    }
    fixture_free(&f);
}

/* AdamW with PyTorch's semantics, in double. */
static void adamw_ref(double *p, double g, double *m, double *v, double lr, double wd, int64_t t) {
    const double b1 = 0.9, b2 = 0.95, eps = 1e-8;
    *p -= lr * wd * *p;
    *m = b1 * *m + (1 - b1) * g;
    *v = b2 * *v + (1 - b2) * g * g;
    double mh = *m / (1 - pow(b1, (double)t)), vh = *v / (1 - pow(b2, (double)t));
    *p -= lr * mh / (sqrt(vh) + eps);
}

static void test_adamw_step_with_clipping(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    int size = dsc_comm_size(f.world);
    const double clip = 0.05, lr = 0.01;
    dsc_optimizer *opt = make_opt(&f, 64, clip);
    int64_t total = sizes[0] + sizes[1] + sizes[2];
    double *p = malloc((size_t)total * sizeof *p), *m = calloc((size_t)total, sizeof *m),
           *v = calloc((size_t)total, sizeof *v);
    for (int j = 0, k = 0; j < NP; j++)
        for (int64_t i = 0; i < sizes[j]; i++)
            p[k++] = ((float *)f.p[j]->value.data)[i];
    for (int64_t step = 1; step <= 3; step++) {
        set_grads(&f);
        assert_ok(dsc_optimizer_reduce_grads(opt)); /* no grads_ready: reduce_grads does every bucket */
        dsc_optim_stats st;
        assert_ok(dsc_optimizer_step(opt, lr, &st));
        double sq = 0;
        for (int j = 0; j < NP; j++)
            for (int64_t i = 0; i < sizes[j]; i++)
                sq += mean_grad(size, j, i) * mean_grad(size, j, i);
        double norm = sqrt(sq), coef = norm > clip ? clip / (norm + 1e-6) : 1.0;
        assert_true(fabs(st.grad_norm - norm) <= 1e-5 * norm);
        assert_true(fabs(st.clip_coef - coef) <= 1e-5);
        assert_int_equal(st.step, step);
        for (int j = 0, k = 0; j < NP; j++)
            for (int64_t i = 0; i < sizes[j]; i++, k++)
                adamw_ref(&p[k], mean_grad(size, j, i) * coef, &m[k], &v[k], lr, j == 1 ? 0.0 : 0.1, step);
        /* gradients are zeroed by the step */
        for (int j = 0; j < NP; j++)
            assert_true(((float *)f.p[j]->grad.data)[0] == 0.0f);
    }
    double worst = 0;
    for (int j = 0, k = 0; j < NP; j++)
        for (int64_t i = 0; i < sizes[j]; i++)
            worst = fmax(worst, fabs(((float *)f.p[j]->value.data)[i] - p[k++]));
    printf("  AdamW after 3 clipped steps: max |param - reference| = %.3e\n", worst);
    assert_true(worst <= 2e-6);

    /* The checkpoint view of the state. */
    assert_int_equal(dsc_optimizer_state_count(opt), 2 * NP + 1);
    dsc_optim_state s;
    dsc_optimizer_state_at(opt, 0, &s);
    assert_string_equal(s.name, "exp_avg/a.weight");
    assert_ptr_equal(s.param, f.p[0]);
    assert_int_equal(dsc_tensor_numel(&s.local), sizes[0]);
    assert_true(fabs(((float *)s.local.data)[5] - m[5]) <= 1e-6);
    dsc_optimizer_state_at(opt, NP + 2, &s);
    assert_string_equal(s.name, "exp_avg_sq/c.weight");
    dsc_optimizer_state_at(opt, 2 * NP, &s);
    assert_string_equal(s.name, "step");
    assert_int_equal(((int64_t *)s.local.data)[0], 3);
    free(p);
    free(m);
    free(v);
    dsc_optimizer_destroy(opt);
    fixture_free(&f);
}

/* SGD with momentum and L2 weight decay, PyTorch's semantics, against a
 * double-precision reference; its state is one momentum buffer per parameter. */
static void test_sgd_momentum(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    int size = dsc_comm_size(f.world);
    const double lr = 0.1, mom = 0.9, wd = 0.01;
    dsc_optimizer *opt = make_opt_hp(
        &f, 30,
        (dsc_optim_hparams){.type = DSC_OPTIMIZER_TYPE_SGD, .momentum = (float)mom, .weight_decay = (float)wd});
    double p[260], buf[260];
    for (int64_t i = 0; i < sizes[2]; i++)
        p[i] = ((float *)f.p[2]->value.data)[i];
    for (int64_t step = 1; step <= 3; step++) {
        set_grads(&f);
        assert_ok(dsc_optimizer_grads_ready(opt, &f.layers[1]));
        assert_ok(dsc_optimizer_grads_ready(opt, &f.layers[0]));
        assert_ok(dsc_optimizer_reduce_grads(opt));
        assert_ok(dsc_optimizer_step(opt, lr, NULL));
        for (int64_t i = 0; i < sizes[2]; i++) {
            double g = mean_grad(size, 2, i) + wd * p[i];
            buf[i] = step == 1 ? g : mom * buf[i] + g;
            p[i] -= lr * buf[i];
        }
    }
    double worst = 0;
    for (int64_t i = 0; i < sizes[2]; i++)
        worst = fmax(worst, fabs(((float *)f.p[2]->value.data)[i] - p[i]));
    printf("  SGD momentum after 3 steps: max |param - reference| = %.3e\n", worst);
    assert_true(worst <= 1e-6);
    assert_int_equal(dsc_optimizer_state_count(opt), NP + 1);
    dsc_optim_state st;
    dsc_optimizer_state_at(opt, 2, &st);
    assert_string_equal(st.name, "momentum_buffer/c.weight");
    assert_true(fabs(((float *)st.local.data)[7] - buf[7]) <= 1e-6);
    dsc_optimizer_destroy(opt);
    fixture_free(&f);
}

static void test_nan_gradient_stops_the_step(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    dsc_optimizer *opt = make_opt(&f, 0, 1.0);
    set_grads(&f);
    assert_ok(dsc_optimizer_reduce_grads(opt));
    assert_ok(dsc_optimizer_step(opt, 0.01, NULL));
    set_grads(&f);
    ((float *)f.p[2]->grad.data)[3] = NAN; /* on one rank only: the average spreads it */
    if (dsc_comm_rank(f.world) != 0) ((float *)f.p[2]->grad.data)[3] = 1.0f;
    float before = ((float *)f.p[0]->value.data)[0];
    assert_ok(dsc_optimizer_reduce_grads(opt));
    assert_err(dsc_optimizer_step(opt, 0.01, NULL), DSC_ERR_NUMERIC, "step 2: the global gradient norm is nan");
    assert_true(((float *)f.p[0]->value.data)[0] == before);
    dsc_optimizer_destroy(opt);
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucketed_average),
        cmocka_unit_test(test_adamw_step_with_clipping),
        cmocka_unit_test(test_sgd_momentum),
        cmocka_unit_test(test_nan_gradient_stops_the_step),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
