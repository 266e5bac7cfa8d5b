/* The process grid: rank <-> coordinate mapping against DeepSpeed's
 * PipeModelDataParallelTopology (rank = (pipe*dp + data)*tp + model, last
 * axis fastest), axis lists against DeepSpeed's documented
 * get_axis_comm_lists example, generic axes, and errors. */
#include <string.h>

#include "dsc/topology.h"
#include "test_mpi.h"

static void expect_lists(const dsc_group_list *l, int count, int size, const int *ranks) {
    assert_int_equal(l->count, count);
    assert_int_equal(l->size, size);
    for (int i = 0; i < count * size; i++)
        assert_int_equal(l->ranks[i], ranks[i]);
}

static void test_pipe_data_model_2x2x2(void **state) {
    (void)state;
    dsc_topology t;
    assert_ok(dsc_topology_pipe_data_model(&t, 2, 2, 2));
    assert_int_equal(dsc_topology_world_size(&t), 8);
    assert_int_equal(dsc_topology_dim(&t, "pipe"), 2);
    assert_int_equal(dsc_topology_dim(&t, "expert"), 0);
    /* The worked example of docs/topology.md, rank by rank: (pipe, data, model). */
    const int coords[8][3] = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
                              {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
    for (int r = 0; r < 8; r++) {
        int c[3], back;
        assert_ok(dsc_topology_coord(&t, r, c));
        assert_memory_equal(c, coords[r], sizeof c);
        assert_ok(dsc_topology_rank(&t, coords[r], &back));
        assert_int_equal(back, r);
        assert_int_equal(back, (c[0] * 2 + c[1]) * 2 + c[2]);
    }
    /* DeepSpeed's get_axis_comm_lists for [pipe, data, model] = [2, 2, 2]. */
    dsc_group_list l;
    assert_ok(dsc_topology_axis_lists(&t, "pipe", &l));
    expect_lists(&l, 4, 2, (const int[]){0, 4, 1, 5, 2, 6, 3, 7});
    dsc_group_list_free(&l);
    assert_ok(dsc_topology_axis_lists(&t, "data", &l));
    expect_lists(&l, 4, 2, (const int[]){0, 2, 1, 3, 4, 6, 5, 7});
    assert_int_equal(dsc_group_list_find(&l, 6), 2);
    dsc_group_list_free(&l);
    assert_ok(dsc_topology_axis_lists(&t, "model", &l));
    expect_lists(&l, 4, 2, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    dsc_group_list_free(&l);
    assert_ok(dsc_topology_axis_lists(&t, "expert", &l));
    assert_int_equal(l.count, 0);
    assert_int_equal(dsc_group_list_find(&l, 0), -1);
}

static void test_uneven_grid_mapping(void **state) {
    (void)state;
    /* pipe=4 x data=3 x model=2: every rank against the closed form. */
    dsc_topology t;
    assert_ok(dsc_topology_pipe_data_model(&t, 4, 3, 2));
    for (int r = 0; r < 24; r++) {
        int c[3];
        assert_ok(dsc_topology_coord(&t, r, c));
        assert_int_equal(c[0], r / 6);
        assert_int_equal(c[1], (r / 2) % 3);
        assert_int_equal(c[2], r % 2);
    }
    dsc_group_list l;
    assert_ok(dsc_topology_axis_lists(&t, "data", &l));
    /* One list per (pipe, model), row-major; each along data. */
    expect_lists(&l, 8, 3, (const int[]){0,  2,  4,  1,  3,  5,  6,  8,  10, 7,  9,  11,
                                         12, 14, 16, 13, 15, 17, 18, 20, 22, 19, 21, 23});
    dsc_group_list_free(&l);
}

static void test_generic_axes(void **state) {
    (void)state;
    dsc_topology t;
    const char *axes[] = {"a", "b", "c", "d"};
    assert_ok(dsc_topology_init(&t, 4, axes, (const int[]){2, 3, 1, 4}));
    assert_int_equal(dsc_topology_world_size(&t), 24);
    assert_int_equal(dsc_topology_axis(&t, "c"), 2);
    int c[4] = {1, 2, 0, 3}, r;
    assert_ok(dsc_topology_rank(&t, c, &r));
    assert_int_equal(r, ((1 * 3 + 2) * 1 + 0) * 4 + 3);
    dsc_group_list l;
    assert_ok(dsc_topology_axis_lists(&t, "b", &l));
    assert_int_equal(l.count, 8);
    assert_int_equal(l.size, 3);
    /* Second list: a=0, c=0, d=1 along b. */
    assert_int_equal(dsc_group_list_at(&l, 1)[0], 1);
    assert_int_equal(dsc_group_list_at(&l, 1)[1], 5);
    assert_int_equal(dsc_group_list_at(&l, 1)[2], 9);
    dsc_group_list_free(&l);
}

static void test_topology_errors(void **state) {
    (void)state;
    dsc_topology t;
    const char *dup[] = {"pipe", "pipe"};
    assert_err(dsc_topology_init(&t, 2, dup, (const int[]){2, 2}), DSC_ERR_INVALID, "axis \"pipe\" appears twice");
    const char *axes[] = {"pipe", "data"};
    assert_err(dsc_topology_init(&t, 2, axes, (const int[]){2, 0}), DSC_ERR_INVALID, "axis \"data\" has size 0");
    assert_ok(dsc_topology_pipe_data_model(&t, 2, 2, 2));
    int c[3];
    assert_err(dsc_topology_coord(&t, 8, c), DSC_ERR_INVALID, "rank 8 not in [0, 8)");
    int r;
    assert_err(dsc_topology_rank(&t, (const int[]){0, 2, 0}, &r), DSC_ERR_INVALID,
               "coordinate data=2 not in [0, 2)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipe_data_model_2x2x2),
        cmocka_unit_test(test_uneven_grid_mapping),
        cmocka_unit_test(test_generic_axes),
        cmocka_unit_test(test_topology_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
