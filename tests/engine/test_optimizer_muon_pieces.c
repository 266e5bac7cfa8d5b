/* Muon on matrices spread over ranks (dsc_optim_muon_piece) against
 * DeepSpeed's own functions: the fixture of test_optimizer_muon
 * (muon_fixtures.json, from tests/ref/make_muon_fixtures.py: a tall, a wide
 * and a square matrix, an expert bank, an embedding and a vector) after 3
 * steps, with both Newton-Schulz methods, on 2 and 3 ranks, laid out
 *  - as ZeRO holds it: each rank an even piece of every flattened parameter
 *    (its momentum and Adam moments too), the matrices assembled over the
 *    world for Newton-Schulz (summed into zeros, or all-gathered) and
 *    orthogonalised by every rank or (stage 3's round robin) by one, which
 *    broadcasts the result; the Adam parameters' pieces step on their own;
 *  - as tensor parallelism holds it: each rank a slice of every matrix
 *    along its rows, then along its columns (declared with
 *    dsc_params_declare_shard), assembled over the world as the tensor
 *    group.
 * Every rank's elements must equal DeepSpeed's (<= 1e-5 relative). The
 * hyper-parameters come from the fixture itself here (test_optimizer_muon
 * reads them through the config). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dsc/optimizer.h"
#include "dsc/zero.h"
#include "json_floats.h"
#include "muon_fixture.h"
#include "test_mpi.h"

enum { MAX_NUMEL = 64, STEPS = 3 };

static cJSON *fixture;
static dsc_comm *world;

static double number(const char *key) {
    return cJSON_GetObjectItem(fixture, key)->valuedouble;
}

static void hparams(const char *method, dsc_optim_hparams *hp) {
    const cJSON *betas = cJSON_GetObjectItem(fixture, "betas");
    double lr = number("lr");
    *hp = (dsc_optim_hparams){
        .type = DSC_OPTIMIZER_TYPE_MUON,
        .beta1 = (float)cJSON_GetArrayItem(betas, 0)->valuedouble,
        .beta2 = (float)cJSON_GetArrayItem(betas, 1)->valuedouble,
        .eps = (float)number("eps"),
        .momentum = (float)number("momentum"),
        .weight_decay = (float)number("weight_decay"),
        .muon_lr_scale = (float)(number("muon_lr") / lr),
        .adam_lr_scale = (float)(number("adam_lr") / lr),
        .ns_method = strcmp(method, "gram") == 0 ? DSC_MUON_NS_GRAM : DSC_MUON_NS_STANDARD,
    };
}

/* Parameter i of the fixture: its name, shape and flags. */
typedef struct fx {
    const char *name;
    int ndim;
    int64_t shape[DSC_MAX_DIMS];
    int64_t numel;
    uint32_t flags;
} fx;

static fx fixture_param(int i) {
    const cJSON *desc = cJSON_GetArrayItem(cJSON_GetObjectItem(fixture, "params"), i);
    const cJSON *shape = cJSON_GetObjectItem(desc, "shape");
    fx f = {.name = cJSON_GetObjectItem(desc, "name")->valuestring, .ndim = cJSON_GetArraySize(shape), .numel = 1};
    for (int d = 0; d < f.ndim; d++)
        f.numel *= f.shape[d] = (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble;
    f.flags = cJSON_IsTrue(cJSON_GetObjectItem(desc, "decay")) ? 0 : DSC_PARAM_NO_DECAY;
    assert_true(f.numel <= MAX_NUMEL);
    return f;
}

/* The whole tensor of parameter i: "init", "grads" of a step, or "expected" of a method. */
static void whole(const char *what, const char *sub, int step, int i, float *out, int64_t n) {
    const cJSON *a = cJSON_GetObjectItem(fixture, what);
    if (sub) a = cJSON_GetObjectItem(a, sub);
    if (step >= 0) a = cJSON_GetArrayItem(a, step);
    json_floats(cJSON_GetArrayItem(a, i), out, n);
}

static dsc_tensor flat(float *data, int64_t n) {
    return dsc_tensor_view(data, DSC_DTYPE_F32, 1, &n, DSC_CPU);
}

static void check(const char *layout, const char *method, const fx *f, const float *got, const float *want,
                  int64_t n) {
    char what[200];
    snprintf(what, sizeof what, "muon (%s), %s, rank %d: %s after %d steps", method, layout, dsc_comm_rank(world),
             f->name, STEPS);
    assert_true(dsc_test_max_rel_err(got, want, n, 1e-3, what) <= 1e-5);
}

/* ZeRO's layout: an even piece of every flattened parameter on every rank. */
static void run_pieces(const char *method, bool round_robin) {
    dsc_optim_hparams hp;
    hparams(method, &hp);
    const int n_params = cJSON_GetArraySize(cJSON_GetObjectItem(fixture, "params"));
    for (int i = 0; i < n_params; i++) {
        fx f = fixture_param(i);
        dsc_param_store *store;
        dsc_param *p;
        assert_ok(dsc_params_create(&store, DSC_CPU, 1));
        assert_ok(dsc_params_declare(store, f.name, f.ndim, f.shape, f.flags, DSC_INIT_ZEROS, 0.0f, &p));
        assert_ok(dsc_params_finalize(store));
        int64_t lo, hi;
        dsc_zero_param_piece(f.numel, dsc_comm_size(world), dsc_comm_rank(world), &lo, &hi);
        int owner = round_robin ? i % dsc_comm_size(world) : -1;
        int64_t counts[8]; /* round robin: the pieces all-gathered, as ZeRO-3 does; else summed into zeros */
        assert_true(dsc_comm_size(world) <= 8);
        for (int r = 0; r < dsc_comm_size(world); r++) {
            int64_t a, b;
            dsc_zero_param_piece(f.numel, dsc_comm_size(world), r, &a, &b);
            counts[r] = b - a;
        }
        float *value = p->value.data, *grad = p->grad.data, m[MAX_NUMEL] = {0}, v[MAX_NUMEL] = {0};
        whole("init", NULL, -1, i, value, f.numel);
        for (int step = 1; step <= STEPS; step++) {
            whole("grads", NULL, step - 1, i, grad, f.numel);
            dsc_tensor pv = flat(value + lo, hi - lo), pg = flat(grad + lo, hi - lo);
            dsc_tensor pm = flat(m + lo, hi - lo), pv2 = flat(v + lo, hi - lo);
            if (dsc_optim_uses_muon(p))
                assert_ok(dsc_optim_muon_piece(
                    &hp, p, &(dsc_muon_piece){&pv, &pg, &pm, lo, world, NULL, owner, round_robin ? counts : NULL},
                    0.01f));
            else if (hi > lo)
                assert_ok(
                    dsc_optim_muon_adam(&hp, &pv, &pg, &pm, &pv2, 0.01f, !(f.flags & DSC_PARAM_NO_DECAY), step));
        }
        float want[MAX_NUMEL];
        whole("expected", method, -1, i, want, f.numel);
        check(round_robin ? "ZeRO pieces, one rank orthogonalising" : "ZeRO pieces", method, &f, value + lo,
              want + lo, hi - lo);
        dsc_params_destroy(store);
    }
}

/* Copies between the global tensor and this rank's slice [start, start + count) along `axis`. */
static void slice(float *global, float *local, const fx *f, int axis, int64_t start, int64_t count,
                  bool to_local) {
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++)
        outer *= f->shape[d];
    for (int d = axis + 1; d < f->ndim; d++)
        inner *= f->shape[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < count * inner; k++) {
            float *g = &global[(o * f->shape[axis] + start) * inner + k], *l = &local[o * count * inner + k];
            if (to_local)
                *l = *g;
            else
                *g = *l;
        }
}

/* Tensor parallelism's layout: every matrix cut along `axis_from_end` (2: rows, 1: columns). */
static void run_slices(const char *method, int axis_from_end) {
    dsc_optim_hparams hp;
    hparams(method, &hp);
    const int n_params = cJSON_GetArraySize(cJSON_GetObjectItem(fixture, "params"));
    for (int i = 0; i < n_params; i++) {
        fx f = fixture_param(i);
        if (f.ndim < 2) continue;
        int axis = f.ndim - axis_from_end;
        /* uneven slices, none empty (every matrix extent is at least 3) */
        const int64_t r = dsc_comm_rank(world), size = dsc_comm_size(world);
        const int64_t start = r * f.shape[axis] / size, end = (r + 1) * f.shape[axis] / size;
        dsc_param_store *store;
        dsc_param *p;
        assert_ok(dsc_params_create(&store, DSC_CPU, 1));
        assert_ok(dsc_params_declare_shard(store, f.name, f.ndim, f.shape, axis, start, end - start, f.flags,
                                           DSC_INIT_ZEROS, 0.0f, &p));
        assert_ok(dsc_params_finalize(store));
        if (!dsc_optim_uses_muon(p)) { /* the embedding: Adam, elementwise; the pieces cover it */
            dsc_params_destroy(store);
            continue;
        }
        assert_true(dsc_optim_muon_needs_tensor_group(p, world) == (dsc_comm_size(world) > 1));
        int64_t n = dsc_param_numel(p);
        float buf[MAX_NUMEL], m[MAX_NUMEL] = {0}, want[MAX_NUMEL], mine[MAX_NUMEL];
        whole("init", NULL, -1, i, buf, f.numel);
        slice(buf, p->value.data, &f, axis, start, end - start, true);
        for (int step = 1; step <= STEPS; step++) {
            whole("grads", NULL, step - 1, i, buf, f.numel);
            slice(buf, p->grad.data, &f, axis, start, end - start, true);
            dsc_tensor pv = flat(p->value.data, n), pg = flat(p->grad.data, n), pm = flat(m, n);
            assert_ok(
                dsc_optim_muon_piece(&hp, p, &(dsc_muon_piece){&pv, &pg, &pm, 0, NULL, world, -1, NULL}, 0.01f));
        }
        whole("expected", method, -1, i, want, f.numel);
        slice(want, mine, &f, axis, start, end - start, true);
        check(axis_from_end == 2 ? "TP rows" : "TP columns", method, &f, p->value.data, mine, n);
        dsc_params_destroy(store);
    }
}

static void test_zero_pieces_match_deepspeed(void **state) {
    (void)state;
    for (int round_robin = 0; round_robin <= 1; round_robin++) {
        run_pieces("gram", round_robin);
        run_pieces("standard", round_robin);
    }
}

static void test_tp_slices_match_deepspeed(void **state) {
    (void)state;
    for (int axis_from_end = 2; axis_from_end >= 1; axis_from_end--) {
        run_slices("gram", axis_from_end);
        run_slices("standard", axis_from_end);
    }
}

static int setup(void **state) {
    (void)state;
    return dsc_comm_world(NULL, &world) ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    dsc_comm_free(world);
    return 0;
}

int main(void) {
    fixture = muon_fixture_load();
    if (!fixture) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_zero_pieces_match_deepspeed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tp_slices_match_deepspeed, setup, teardown),
    };
    int rc = DSC_RUN_MPI_TESTS(tests);
    cJSON_Delete(fixture);
    return rc;
}
