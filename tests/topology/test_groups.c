/* Communicators from a group plan on 1, 2, 3, 4 and 8 ranks: every kind's
 * communicator has the planned members in the planned order and the kind's
 * name, and an all-reduce over it sums exactly those members' world ranks. */
#include "dsc/topology.h"
#include "test_mpi.h"

static void check_groups(dsc_comm *world, const dsc_parallel_dims *dims) {
    dsc_group_plan plan;
    assert_ok(dsc_groups_plan(dsc_comm_size(world), dsc_comm_rank(world), dims, &plan));
    dsc_groups *groups;
    assert_ok(dsc_groups_create(world, &plan, &groups));
    for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++) {
        int n;
        const int *members = dsc_group_plan_members(&plan, (dsc_group_kind)k, &n);
        dsc_comm *c = dsc_groups_get(groups, (dsc_group_kind)k);
        assert_string_equal(dsc_comm_name(c), dsc_group_kind_name((dsc_group_kind)k));
        assert_int_equal(dsc_comm_size(c), n);
        int64_t want = 0;
        for (int i = 0; i < n; i++) {
            assert_int_equal(dsc_comm_world_rank(c, i), members[i]);
            want += members[i];
        }
        assert_int_equal(members[dsc_comm_rank(c)], dsc_comm_rank(world));
        int64_t one = 1, value = dsc_comm_rank(world);
        dsc_tensor t = dsc_tensor_view(&value, DSC_DTYPE_I64, 1, &one, DSC_CPU);
        assert_ok(dsc_comm_allreduce(c, &t, DSC_REDUCE_OP_SUM));
        assert_int_equal(value, want);
    }
    dsc_groups_free(groups);
    dsc_group_plan_free(&plan);
}

static void test_groups_for_world(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int p = dsc_comm_size(world);
    /* The richest layout each size allows, then expert tensor parallelism. */
    dsc_parallel_dims dims = {.pp = p >= 4 ? 2 : 1, .tp = p >= 8 ? 2 : 1, .ep = p % 2 == 0 ? 2 : 1};
    check_groups(world, &dims);
    dims.expert_tp = true;
    check_groups(world, &dims);
    dsc_parallel_dims data_only = {.pp = 1, .tp = 1, .ep = p};
    check_groups(world, &data_only);
    dsc_comm_free(world);
}

static void test_plan_for_another_world(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    dsc_group_plan plan;
    dsc_parallel_dims dims = {.pp = 1, .tp = 1};
    assert_ok(dsc_groups_plan(dsc_comm_size(world) + 1, 0, &dims, &plan));
    dsc_groups *groups;
    assert_err(dsc_groups_create(world, &plan, &groups), DSC_ERR_INVALID, "the plan is for rank 0 of");
    dsc_group_plan_free(&plan);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_for_world),
        cmocka_unit_test(test_plan_for_another_world),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
