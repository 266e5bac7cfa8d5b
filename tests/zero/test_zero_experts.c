/* MoE + ZeRO: expert parameters are partitioned over the
 * expert-data-parallel group, dense ones over the data-parallel group, as
 * DeepSpeed does. On 2 and 4 ranks with expert-parallel size 2 (groups from
 * dsc/topology.h), each rank holds its own experts (named by global expert
 * index); the test checks which ranks own which expert state (exactly the
 * partition of the expert flat buffer over the rank's expert-data-parallel
 * group, or in stage 3 its piece of each parameter, every element owned once
 * within the group), and that stages 1-3 train the
 * same parameters as the plain optimizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/topology.h"
#include "test_mpi.h"
#include "zero_test_util.h"

typedef struct moe_groups {
    dsc_group_plan plan;
    dsc_groups *groups;
    dsc_comm *dp, *edp, *ep;
} moe_groups;

static void moe_groups_init(moe_groups *g, dsc_comm *world) {
    dsc_parallel_dims dims = {.pp = 1, .tp = 1, .ep = 2};
    assert_ok(dsc_groups_plan(dsc_comm_size(world), dsc_comm_rank(world), &dims, &g->plan));
    assert_ok(dsc_groups_create(world, &g->plan, &g->groups));
    g->dp = dsc_groups_get(g->groups, DSC_GROUP_KIND_DATA);
    g->edp = dsc_groups_get(g->groups, DSC_GROUP_KIND_EXPERT_DATA);
    g->ep = dsc_groups_get(g->groups, DSC_GROUP_KIND_EXPERT);
}

static void moe_groups_free(moe_groups *g) {
    dsc_groups_free(g->groups);
    dsc_group_plan_free(&g->plan);
}

/* Dense parameters 0-3, this rank's two experts' weights 4-7 (named by the expert-parallel rank). */
static void moe_spec(toy_spec *spec, char *expert_prefix, size_t len, int ep_rank) {
    static const int64_t sizes[] = {3000, 100, 2500, 64, 1200, 1200, 777, 777};
    static const int layers[4][3] = {{0, 1, -1}, {2, 4, 5}, {6, 7, 3}, {0, -1, -1}};
    snprintf(expert_prefix, len, "experts.ep%d", ep_rank);
    *spec = (toy_spec){.n_params = 8, .n_layers = 4, .prefix = "dense", .expert_prefix = expert_prefix};
    for (int i = 0; i < spec->n_params; i++) {
        spec->sizes[i] = sizes[i];
        spec->flags[i] = i >= 4 ? DSC_PARAM_EXPERT : 0;
    }
    for (int l = 0; l < spec->n_layers; l++) {
        for (int j = 0; j < TOY_MAX_PARAMS; j++)
            spec->layer_params[l][j] = -1;
        for (int j = 0; j < 3 && layers[l][j] >= 0; j++)
            spec->layer_params[l][j] = layers[l][j];
    }
}

static dsc_optimizer *train(moe_groups *g, toy_model *m, int stage, int ep_rank, float *out) {
    toy_spec spec;
    char prefix[32];
    moe_spec(&spec, prefix, sizeof prefix, ep_rank);
    toy_model_init(m, &spec, dsc_comm_rank(g->dp));
    dsc_optimizer_options o = toy_options(m, g->dp);
    o.expert_dp = g->edp;
    o.ep = g->ep;
    o.reduce_bucket_size = 1000;
    dsc_optimizer *opt;
    assert_ok(dsc_zero_create(&o, &(dsc_zero_options){stage, 1, 1500, 1 << 30, 1 << 30, 0}, &opt));
    toy_train(m, opt, &(toy_run){.steps = 10, .micro_batches = 2, .lr = 1e-2}, NULL);
    toy_read_params(m, opt, out);
    return opt;
}

/* Each exp_avg entry lies in the partition of its group's flat buffer over
 * the group's communicator (stage 3: is the rank's piece of its parameter);
 * within each group every element is owned once. */
static void check_ownership(dsc_optimizer *opt, toy_model *m, moe_groups *g, int stage) {
    dsc_comm *comms[2] = {g->dp, g->edp};
    for (int grp = 0; grp < 2; grp++) {
        dsc_comm *c = comms[grp];
        int64_t numel = dsc_params_numel(m->store, (dsc_param_group)grp), begin, end;
        dsc_zero_partition(numel, dsc_comm_size(c), dsc_comm_rank(c), &begin, &end);
        float *owned = calloc((size_t)numel, sizeof *owned);
        assert_non_null(owned);
        int64_t mine = 0;
        for (int k = 0; k < dsc_optimizer_state_count(opt); k++) {
            dsc_optim_state st;
            dsc_optimizer_state_at(opt, k, &st);
            if (!st.param || (int)st.param->group != grp || strncmp(st.name, "exp_avg/", 8) != 0) continue;
            assert_true((grp == 1) == (strncmp(st.param->name, "experts.", 8) == 0));
            int64_t at = st.param->offset + st.offset, n = dsc_tensor_numel(&st.local);
            if (stage < 3) {
                assert_true(at >= begin && at + n <= end);
            } else { /* stage 3: the rank's piece of the parameter */
                int64_t lo, hi;
                dsc_zero_param_piece(dsc_param_numel(st.param), dsc_comm_size(c), dsc_comm_rank(c), &lo, &hi);
                assert_true(st.offset == lo && n == hi - lo);
            }
            for (int64_t e = 0; e < n; e++)
                owned[at + e] += 1.0f;
            mine += n;
        }
        dsc_tensor t = dsc_tensor_view(owned, DSC_DTYPE_F32, 1, &numel, DSC_CPU);
        assert_ok(dsc_comm_allreduce(c, &t, DSC_REDUCE_OP_SUM));
        for (int i = 0; i < dsc_params_count(m->store); i++) {
            const dsc_param *p = dsc_params_at(m->store, i);
            if ((int)p->group != grp) continue;
            for (int64_t e = 0; e < dsc_param_numel(p); e++)
                assert_true(owned[p->offset + e] == 1.0f);
        }
        printf("  %s state of rank %d of \"%s\" (%d ranks): [%lld, %lld) of %lld, %lld elements in pieces\n",
               grp ? "expert" : "dense", dsc_comm_rank(c), dsc_comm_name(c), dsc_comm_size(c), (long long)begin,
               (long long)end, (long long)numel, (long long)mine);
        free(owned);
    }
}

static void test_experts_sharded_over_expert_data_parallel(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    moe_groups g;
    moe_groups_init(&g, world);
    int ep_rank = dsc_comm_rank(g.ep);
    for (int stage = 1; stage <= 3; stage++) {
        toy_model pm, zm;
        float ref[12000], got[12000];
        dsc_optimizer *plain = train(&g, &pm, 0, ep_rank, ref);
        dsc_optimizer *zero = train(&g, &zm, stage, ep_rank, got);
        int64_t total = toy_param_total(&pm);
        assert_true(total <= 12000);
        char what[64];
        snprintf(what, sizeof what, "stage %d, experts over %d ranks", stage, dsc_comm_size(g.edp));
        assert_true(dsc_test_max_rel_err(got, ref, total, 1e-3, what) <= 1e-6);
        check_ownership(zero, &zm, &g, stage);
        dsc_optimizer_destroy(zero);
        dsc_optimizer_destroy(plain);
        toy_model_free(&zm);
        toy_model_free(&pm);
    }
    moe_groups_free(&g);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_experts_sharded_over_expert_data_parallel),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
