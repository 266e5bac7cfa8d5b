/* Expert parallelism on 4 ranks: the MoE layer with EP = 2 and EP = 4
 * (groups from the topology's plan, DeepSpeed's layout) must give, on every
 * rank's own token set, the output and input gradient of the single-rank
 * layer holding all experts, and — after the optimizer's rule (dense
 * gradients averaged over all ranks, expert gradients over the
 * expert-data-parallel group) — the parameter gradients of the single-rank
 * layer averaged over the 4 token sets, within 1e-5 relative. Cases cover
 * top-1 and top-2, dropping and no-drop capacity, GELU experts with the
 * PR-MoE residual and SwiGLU experts.
 *
 * Each case runs with both exchanges (moe.overlap_alltoall off: blocking
 * all-to-alls; on: point-to-point messages overlapping the local experts),
 * which must also agree bitwise with each other.
 *
 * Also: the all-to-all (or send) byte counters equal 4 * (ep-1)/ep * E*Cap*M*4
 * bytes (two exchanges forward, two backward), ranks gating different token
 * counts fail together with a message instead of hanging, and an
 * expert-parallel group that does not divide the experts is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/moe.h"
#include "dsc/topology.h"
#include "moe_test_util.h"
#include "test_mpi.h"

#define B 2
#define T 8
#define TOL 1e-5
#define FLOOR 1e-6

typedef struct ep_env {
    dsc_comm *world;
    dsc_group_plan plan;
    dsc_groups *groups;
} ep_env;

static void env_open(ep_env *env, int ep) {
    assert_ok(dsc_comm_world(NULL, &env->world));
    dsc_parallel_dims dims = {.pp = 1, .tp = 1, .ep = ep};
    assert_ok(dsc_groups_plan(dsc_comm_size(env->world), dsc_comm_rank(env->world), &dims, &env->plan));
    assert_ok(dsc_groups_create(env->world, &env->plan, &env->groups));
}

static void env_close(ep_env *env) {
    dsc_groups_free(env->groups);
    dsc_group_plan_free(&env->plan);
    dsc_comm_free(env->world);
}

typedef struct layer_run {
    dsc_param_store *store;
    dsc_layer *layer;
} layer_run;

static void layer_open(layer_run *L, const dsc_moe_options *o, const dsc_model_config *mc, dsc_comm *ep,
                       int64_t t) {
    assert_ok(dsc_params_create(&L->store, DSC_CPU, 7));
    assert_ok(dsc_moe_layer_create(o, mc, 0, L->store, DSC_CPU, ep, &L->layer));
    assert_ok(dsc_params_finalize(L->store));
    assert_ok(dsc_layer_reserve(L->layer, 1, B, t));
}

static void layer_close(layer_run *L) {
    dsc_layer_destroy(L->layer);
    dsc_params_destroy(L->store);
}

/* Forward and backward of token set q: out and din copied to the caller's (B, T, M) buffers. */
static void run_set(layer_run *L, int q, int64_t M, float *out, float *din, double *gate_loss) {
    float *x = malloc(B * T * M * sizeof *x), *g = malloc(B * T * M * sizeof *g);
    moe_test_fill(x, B * T * M, 100 + (uint64_t)q, 1.0f);
    moe_test_fill(g, B * T * M, 200 + (uint64_t)q, 1.0f);
    const int64_t shape[3] = {B, T, M};
    dsc_tensor xt = dsc_tensor_view(x, DSC_DTYPE_F32, 3, shape, DSC_CPU);
    dsc_tensor gt = dsc_tensor_view(g, DSC_DTYPE_F32, 3, shape, DSC_CPU), y, dx;
    dsc_micro_ctx ctx = {.loss_scale = 1.0f, .training = true};
    assert_ok(dsc_layer_forward(L->layer, 0, &xt, &y, &ctx));
    memcpy(out, y.data, B * T * M * sizeof *out);
    assert_ok(dsc_layer_backward(L->layer, 0, &gt, &dx, &ctx));
    memcpy(din, dx.data, B * T * M * sizeof *din);
    *gate_loss = ctx.aux_loss;
    free(x);
    free(g);
}

typedef struct ep_case {
    const char *name;
    int ep, k;
    bool drop, residual;
    dsc_moe_expert_kind kind;
    double capacity_factor;
    int experts;
} ep_case;

/* The expert-parallel layer on this rank's token set, then the optimizer's
 * reduction (dense gradients over all ranks, experts over their EDP group),
 * with the exchange's messages counted: two all-to-alls each way, or with
 * overlap_alltoall the same bytes as 4 * (ep-1) point-to-point sends. */
static void count_call(void *arg) {
    ++*(int64_t *)arg;
}

/* ... and with a kernel progress hook of the caller's installed (the runner's,
 * in training): `hook_calls` counts its calls, which the layer's own hook must
 * pass on (one per kernel call either way) and leave installed. */
static void run_ep(const ep_case *c, const dsc_moe_options *o, const dsc_model_config *mc, ep_env *env,
                   layer_run *L, float *out, float *din, double *loss, int64_t *hook_calls) {
    const int rank = dsc_comm_rank(env->world);
    dsc_comm *ep = dsc_groups_get(env->groups, DSC_GROUP_KIND_EXPERT);
    dsc_comm *edp = dsc_groups_get(env->groups, DSC_GROUP_KIND_EXPERT_DATA);
    const int64_t M = mc->d_model;
    layer_open(L, o, mc, ep, T);
    dsc_comm_reset_stats(ep);
    *hook_calls = 0;
    dsc_kernels_set_progress(count_call, hook_calls);
    run_set(L, rank, M, out, din, loss);
    dsc_kernels_progress_fn fn;
    void *arg;
    dsc_kernels_get_progress(&fn, &arg);
    dsc_kernels_set_progress(NULL, NULL);
    assert_true(fn == count_call && arg == hook_calls);
    assert_true(*hook_calls > 0);
    dsc_moe_stats st;
    assert_ok(dsc_moe_stats_get(L->layer, &st));
    dsc_comm_stats cs;
    dsc_comm_get_stats(ep, &cs);
    const int64_t a2a_bytes = 4 * (c->ep - 1) * (c->experts * st.capacity * M * 4) / c->ep;
    const dsc_comm_op op = o->overlap_alltoall ? DSC_COMM_OP_SEND : DSC_COMM_OP_ALLTOALL;
    if (rank == 0)
        printf(
            "  overlap %d: capacity %lld, dropped tokens %lld; %s: %lld calls, %lld bytes sent (formula %lld)\n",
            o->overlap_alltoall, (long long)st.capacity, (long long)st.dropped_tokens,
            o->overlap_alltoall ? "sends" : "all-to-all", (long long)cs.calls[op], (long long)cs.bytes_sent[op],
            (long long)a2a_bytes);
    assert_int_equal(cs.calls[op], o->overlap_alltoall ? 4 * (c->ep - 1) : 4);
    assert_int_equal(cs.bytes_sent[op], a2a_bytes);
    assert_int_equal(cs.calls[o->overlap_alltoall ? DSC_COMM_OP_ALLTOALL : DSC_COMM_OP_SEND], 0);
    int64_t dropped = st.dropped_tokens, one = 1;
    dsc_tensor dt = dsc_tensor_view(&dropped, DSC_DTYPE_I64, 1, &one, DSC_CPU);
    assert_ok(dsc_comm_allreduce(env->world, &dt, DSC_REDUCE_OP_SUM));
    if (c->drop)
        assert_true(dropped > 0); /* the case really drops tokens */
    else
        assert_int_equal(dropped, 0);
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        dsc_tensor values, grads;
        dsc_params_flat(L->store, (dsc_param_group)g, &values, &grads);
        if (dsc_tensor_numel(&grads) > 0)
            assert_ok(
                dsc_comm_allreduce(g == DSC_PARAM_GROUP_EXPERT ? edp : env->world, &grads, DSC_REDUCE_OP_AVG));
    }
}

/* Each exchange (blocking all-to-alls, overlapped messages) against the
 * single-rank layer, and the two bitwise equal to each other. */
static void run_case(const ep_case *c) {
    ep_env env;
    env_open(&env, c->ep);
    const int rank = dsc_comm_rank(env.world), world = dsc_comm_size(env.world);
    if (rank == 0) printf("case %s: world %d, ep %d\n", c->name, world, c->ep);
    dsc_model_config mc;
    moe_test_model_config(&mc, c->kind == DSC_MOE_EXPERT_KIND_SWIGLU ? DSC_ARCH_MIXTRAL : DSC_ARCH_GPT_MOE, 1, 8,
                          1);
    dsc_moe_options o;
    moe_test_options(&o, c->experts, c->k, c->drop, c->residual, c->kind);
    o.gate.capacity_factor = c->capacity_factor;
    const int64_t M = mc.d_model, n = B * T * M;
    float *out[2], *din[2];
    double loss[2], ref_loss = 0;
    int64_t hook_calls[2];
    layer_run L[2];
    for (int v = 0; v < 2; v++) {
        out[v] = malloc(n * sizeof *out[v]);
        din[v] = malloc(n * sizeof *din[v]);
        o.overlap_alltoall = v == 1;
        run_ep(c, &o, &mc, &env, &L[v], out[v], din[v], &loss[v], &hook_calls[v]);
    }
    assert_int_equal(hook_calls[1], hook_calls[0]);

    /* The single-rank layer with all experts, on every token set. */
    layer_run R;
    layer_open(&R, &o, &mc, NULL, T);
    float *ref_out = malloc(n * sizeof *ref_out), *ref_din = malloc(n * sizeof *ref_din);
    float *tmp_out = malloc(n * sizeof *tmp_out), *tmp_din = malloc(n * sizeof *tmp_din);
    for (int q = 0; q < world; q++) {
        double l;
        run_set(&R, q, M, q == rank ? ref_out : tmp_out, q == rank ? ref_din : tmp_din, &l);
        if (q == rank) ref_loss = l;
    }
    dsc_tensor ref_values, ref_grads;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        dsc_params_flat(R.store, (dsc_param_group)g, &ref_values, &ref_grads);
        if (dsc_tensor_numel(&ref_grads) > 0) assert_ok(dsc_kernel_scale(&ref_grads, 1.0f / (float)world));
    }

    for (int v = 0; v < 2; v++) {
        double worst = dsc_test_max_rel_err(out[v], ref_out, n, FLOOR, "output");
        worst = fmax(worst, dsc_test_max_rel_err(din[v], ref_din, n, FLOOR, "input gradient"));
        float fl = (float)loss[v], frl = (float)ref_loss;
        worst = fmax(worst, dsc_test_max_rel_err(&fl, &frl, 1, FLOOR, "gate loss"));
        int expert_params = 0;
        for (int i = 0; i < dsc_params_count(L[v].store); i++) {
            dsc_param *p = dsc_params_at(L[v].store, i), *r = dsc_params_find(R.store, p->name);
            assert_non_null(r);
            expert_params += (p->flags & DSC_PARAM_EXPERT) != 0;
            worst =
                fmax(worst, dsc_test_max_rel_err(p->grad.data, r->grad.data, dsc_param_numel(p), FLOOR, p->name));
            if (v == 1) {
                const dsc_param *b = dsc_params_at(L[0].store, i);
                assert_memory_equal(p->grad.data, b->grad.data, (size_t)dsc_param_numel(p) * sizeof(float));
            }
        }
        /* This rank holds exactly its E / ep experts, by global name. */
        assert_int_equal(expert_params, (c->experts / c->ep) * (c->kind == DSC_MOE_EXPERT_KIND_SWIGLU ? 3 : 4));
        if (rank == 0) printf("  overlap %d: worst relative error %.3e (tolerance %.0e)\n", v, worst, TOL);
        assert_true(worst <= TOL);
    }
    assert_memory_equal(out[1], out[0], (size_t)n * sizeof(float));
    assert_memory_equal(din[1], din[0], (size_t)n * sizeof(float));

    free(tmp_out);
    free(tmp_din);
    free(ref_out);
    free(ref_din);
    layer_close(&R);
    for (int v = 0; v < 2; v++) {
        free(out[v]);
        free(din[v]);
        layer_close(&L[v]);
    }
    env_close(&env);
}

static void test_ep2_top2_drop_gelu_residual(void **state) {
    (void)state;
    run_case(&(ep_case){"ep2 top-2 drop gelu+residual", 2, 2, true, true, DSC_MOE_EXPERT_KIND_GELU, 0.5, 8});
}

static void test_ep2_top2_nodrop_swiglu(void **state) {
    (void)state;
    run_case(&(ep_case){"ep2 top-2 no-drop swiglu", 2, 2, false, false, DSC_MOE_EXPERT_KIND_SWIGLU, 1.0, 8});
}

static void test_ep4_top1_drop_swiglu(void **state) {
    (void)state;
    run_case(&(ep_case){"ep4 top-1 drop swiglu", 4, 1, true, false, DSC_MOE_EXPERT_KIND_SWIGLU, 1.0, 8});
}

/* One expert a rank: the own piece has no first half and runs whole after the other ranks' pieces. */
static void test_ep4_one_expert_each(void **state) {
    (void)state;
    run_case(&(ep_case){"ep4 one expert a rank, top-2 no-drop gelu", 4, 2, false, false, DSC_MOE_EXPERT_KIND_GELU,
                        1.0, 4});
}

static void test_ep4_top2_nodrop_gelu_residual(void **state) {
    (void)state;
    run_case(&(ep_case){"ep4 top-2 no-drop gelu+residual", 4, 2, false, true, DSC_MOE_EXPERT_KIND_GELU, 1.0, 8});
}

/* The first rank of each EP group gates fewer tokens than its peer: every rank fails with the reason. */
static void test_token_count_mismatch(void **state) {
    (void)state;
    ep_env env;
    env_open(&env, 2);
    const int rank = dsc_comm_rank(env.world);
    dsc_model_config mc;
    moe_test_model_config(&mc, DSC_ARCH_GPT_MOE, 1, 8, 1);
    for (int drop = 0; drop < 2; drop++) {
        dsc_moe_options o;
        moe_test_options(&o, 8, 2, drop, false, DSC_MOE_EXPERT_KIND_GELU);
        layer_run L;
        layer_open(&L, &o, &mc, dsc_groups_get(env.groups, DSC_GROUP_KIND_EXPERT), T);
        const int64_t shape[3] = {B, rank % 2 == 0 ? T - 1 : T, mc.d_model}; /* EP groups {0,1} {2,3} */
        float *x = calloc(B * T * (size_t)mc.d_model, sizeof *x);
        dsc_tensor xt = dsc_tensor_view(x, DSC_DTYPE_F32, 3, shape, DSC_CPU), y;
        dsc_micro_ctx ctx = {.loss_scale = 1.0f, .training = true};
        assert_err(dsc_layer_forward(L.layer, 0, &xt, &y, &ctx), DSC_ERR_INVALID, "gate different token counts");
        free(x);
        layer_close(&L);
    }
    env_close(&env);
}

static void test_bad_ep_group(void **state) {
    (void)state;
    ep_env env;
    env_open(&env, 4);
    dsc_model_config mc;
    moe_test_model_config(&mc, DSC_ARCH_GPT_MOE, 1, 6, 1);
    dsc_moe_options o;
    moe_test_options(&o, 6, 1, true, false, DSC_MOE_EXPERT_KIND_GELU);
    dsc_param_store *store;
    dsc_layer *layer;
    assert_ok(dsc_params_create(&store, DSC_CPU, 7));
    assert_err(dsc_moe_layer_create(&o, &mc, 0, store, DSC_CPU, dsc_groups_get(env.groups, DSC_GROUP_KIND_EXPERT),
                                    &layer),
               DSC_ERR_INVALID, "moe.ep_size 4 does not divide moe.num_experts 6");
    dsc_params_destroy(store);
    env_close(&env);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep2_top2_drop_gelu_residual),
        cmocka_unit_test(test_ep2_top2_nodrop_swiglu),
        cmocka_unit_test(test_ep4_top1_drop_swiglu),
        cmocka_unit_test(test_ep4_top2_nodrop_gelu_residual),
        cmocka_unit_test(test_ep4_one_expert_each),
        cmocka_unit_test(test_token_count_mismatch),
        cmocka_unit_test(test_bad_ep_group),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
