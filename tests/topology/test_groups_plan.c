/* Group formation as a pure function: hand-written member lists for small
 * grids (including DeepSpeed's own examples from groups.py and the MoE notes),
 * closed-form membership for every rank of 4096-rank jobs, and the errors for
 * degrees that do not divide. */
#include <stdlib.h>
#include <string.h>

#include "dsc/topology.h"
#include "test_mpi.h"

static void plan(int world, int pp, int dp, int tp, int ep, bool expert_tp, dsc_group_plan *p) {
    dsc_parallel_dims d = {.pp = pp, .dp = dp, .tp = tp, .ep = ep, .expert_tp = expert_tp};
    assert_ok(dsc_groups_plan(world, 0, &d, p));
}

static void expect(const dsc_group_plan *p, dsc_group_kind k, int count, int size, const int *ranks) {
    const dsc_group_list *l = &p->all[k];
    if (l->count != count || l->size != size) {
        print_error("%s: %d groups of %d, want %d of %d\n", dsc_group_kind_name(k), l->count, l->size, count,
                    size);
        fail();
    }
    for (int i = 0; i < count * size; i++)
        if (l->ranks[i] != ranks[i]) {
            print_error("%s: entry %d is rank %d, want %d\n", dsc_group_kind_name(k), i, l->ranks[i], ranks[i]);
            fail();
        }
}

static void test_pipe2_data2_model2(void **state) {
    (void)state;
    dsc_group_plan p;
    plan(8, 2, 2, 2, 1, false, &p);
    expect(&p, DSC_GROUP_KIND_WORLD, 1, 8, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect(&p, DSC_GROUP_KIND_PIPE, 4, 2, (const int[]){0, 4, 1, 5, 2, 6, 3, 7});
    expect(&p, DSC_GROUP_KIND_DATA, 4, 2, (const int[]){0, 2, 1, 3, 4, 6, 5, 7});
    expect(&p, DSC_GROUP_KIND_TENSOR, 4, 2, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect(&p, DSC_GROUP_KIND_EXPERT, 8, 1, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    /* ep = 1, tp = 2: expert-data groups are whole stages (every rank holds every expert). */
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 2, 4, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    int n;
    const int *m = dsc_group_plan_members(&p, DSC_GROUP_KIND_DATA, &n);
    assert_int_equal(n, 2);
    assert_int_equal(m[1], 2);
    dsc_group_plan_free(&p);

    /* The same grid seen from rank 5 = (pipe 1, data 0, model 1). */
    dsc_parallel_dims d = {.pp = 2, .tp = 2};
    assert_ok(dsc_groups_plan(8, 5, &d, &p));
    assert_int_equal(p.dims.dp, 2);
    const int want[DSC_GROUP_KIND_COUNT][2] = {{0, 1}, {1, 5}, {5, 7}, {4, 5}, {5, -1}, {4, 5}};
    for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++) {
        const int *members = dsc_group_plan_members(&p, (dsc_group_kind)k, &n);
        if (k == DSC_GROUP_KIND_WORLD) continue;
        assert_int_equal(members[0], want[k][0]);
        if (n > 1) assert_int_equal(members[1], want[k][1]);
    }
    dsc_group_plan_free(&p);
}

static void test_pipe4_data2(void **state) {
    (void)state;
    dsc_group_plan p;
    plan(8, 4, 2, 1, 2, false, &p);
    expect(&p, DSC_GROUP_KIND_PIPE, 2, 4, (const int[]){0, 2, 4, 6, 1, 3, 5, 7});
    expect(&p, DSC_GROUP_KIND_DATA, 4, 2, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect(&p, DSC_GROUP_KIND_TENSOR, 8, 1, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    /* ep = dp = 2: each stage's pair splits the experts; no expert replicas. */
    expect(&p, DSC_GROUP_KIND_EXPERT, 4, 2, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 8, 1, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    dsc_group_plan_free(&p);
}

static void test_data8_ep4(void **state) {
    (void)state;
    /* DeepSpeed "E + D", world 8, ep 4. */
    dsc_group_plan p;
    plan(8, 1, 0, 1, 4, false, &p);
    expect(&p, DSC_GROUP_KIND_DATA, 1, 8, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect(&p, DSC_GROUP_KIND_EXPERT, 2, 4, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 4, 2, (const int[]){0, 4, 1, 5, 2, 6, 3, 7});
    dsc_group_plan_free(&p);
    /* The docstring example of _create_expert_and_data_parallel: world 16, ep 2. */
    plan(16, 1, 0, 1, 2, false, &p);
    expect(&p, DSC_GROUP_KIND_EXPERT, 8, 2, (const int[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 2, 8,
           (const int[]){0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15});
    dsc_group_plan_free(&p);
    /* With two pipeline stages, each stage forms its own expert groups. */
    plan(16, 2, 8, 1, 4, false, &p);
    expect(&p, DSC_GROUP_KIND_EXPERT, 4, 4, (const int[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 8, 2,
           (const int[]){0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15});
    dsc_group_plan_free(&p);
}

static void test_experts_with_tensor_parallel(void **state) {
    (void)state;
    dsc_group_plan p;
    /* world 8, ep 4, tp 2, expert TP off: blocks of consecutive ranks, as DeepSpeed's default. */
    plan(8, 1, 0, 2, 4, false, &p);
    expect(&p, DSC_GROUP_KIND_TENSOR, 4, 2, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect(&p, DSC_GROUP_KIND_DATA, 2, 4, (const int[]){0, 2, 4, 6, 1, 3, 5, 7});
    expect(&p, DSC_GROUP_KIND_EXPERT, 2, 4, (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 4, 2, (const int[]){0, 4, 1, 5, 2, 6, 3, 7});
    dsc_group_plan_free(&p);
    /* expert TP on (_create_expert_data_and_model_parallel). */
    plan(8, 1, 0, 2, 4, true, &p);
    expect(&p, DSC_GROUP_KIND_EXPERT, 2, 4, (const int[]){0, 2, 4, 6, 1, 3, 5, 7});
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 8, 1, (const int[]){0, 2, 4, 6, 1, 3, 5, 7});
    dsc_group_plan_free(&p);
    plan(8, 1, 0, 2, 2, true, &p);
    expect(&p, DSC_GROUP_KIND_EXPERT, 4, 2, (const int[]){0, 2, 4, 6, 1, 3, 5, 7});
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 4, 2, (const int[]){0, 4, 2, 6, 1, 5, 3, 7});
    dsc_group_plan_free(&p);
    /* The docstring example of _get_expert_parallel_ranks: world 16, tp 2, ep 4. */
    plan(16, 1, 0, 2, 4, true, &p);
    expect(&p, DSC_GROUP_KIND_EXPERT, 4, 4, (const int[]){0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15});
    expect(&p, DSC_GROUP_KIND_EXPERT_DATA, 8, 2,
           (const int[]){0, 8, 2, 10, 4, 12, 6, 14, 1, 9, 3, 11, 5, 13, 7, 15});
    dsc_group_plan_free(&p);
}

static void test_invalid_degrees(void **state) {
    (void)state;
    dsc_group_plan p;
    dsc_parallel_dims d = {.pp = 4, .tp = 1};
    assert_err(dsc_groups_plan(6, 0, &d, &p), DSC_ERR_INVALID,
               "world size 6 is not divisible by pipeline stages 4");
    d = (dsc_parallel_dims){.pp = 1, .tp = 1, .ep = 3};
    assert_err(dsc_groups_plan(4, 0, &d, &p), DSC_ERR_INVALID, "ep_size 3 does not divide data-parallel size 4");
    d = (dsc_parallel_dims){.pp = 2, .tp = 3};
    assert_err(dsc_groups_plan(8, 0, &d, &p), DSC_ERR_INVALID,
               "the 4 ranks of a pipeline stage (world 8 / pp 2) are not divisible by tensor-parallel size 3");
    d = (dsc_parallel_dims){.pp = 2, .dp = 2, .tp = 1};
    assert_err(dsc_groups_plan(8, 0, &d, &p), DSC_ERR_INVALID,
               "pp 2 x dp 2 x tp 1 = 4 does not equal world size 8");
    d = (dsc_parallel_dims){.pp = 1, .tp = 2, .ep = 3};
    assert_err(dsc_groups_plan(8, 0, &d, &p), DSC_ERR_INVALID,
               "ep_size 3 does not divide the 8 ranks of a pipeline stage (data 4 x model 2)");
    d = (dsc_parallel_dims){.pp = 1, .tp = 2, .ep = 3, .expert_tp = true};
    assert_err(dsc_groups_plan(16, 0, &d, &p), DSC_ERR_INVALID, "ep_size 3 does not divide data-parallel size 8");
    d = (dsc_parallel_dims){.pp = 0, .tp = 1};
    assert_err(dsc_groups_plan(8, 0, &d, &p), DSC_ERR_INVALID, "must be positive");
    d = (dsc_parallel_dims){.pp = 1, .tp = 1};
    assert_err(dsc_groups_plan(8, 8, &d, &p), DSC_ERR_INVALID, "rank 8 not in [0, 8)");
}

/* Each kind must partition the world: every rank exactly once. */
static void check_partition(const dsc_group_plan *p, dsc_group_kind k, int *seen) {
    const dsc_group_list *l = &p->all[k];
    assert_int_equal(l->count * l->size, p->world_size);
    memset(seen, 0, (size_t)p->world_size * sizeof *seen);
    for (int i = 0; i < p->world_size; i++)
        seen[l->ranks[i]]++;
    for (int r = 0; r < p->world_size; r++)
        assert_int_equal(seen[r], 1);
}

/* The group of kind k holding rank r, from the closed forms of docs/topology.md. */
static void closed_form(const dsc_parallel_dims *d, dsc_group_kind k, int r, int *out, int *n) {
    int dp = d->dp, tp = d->tp, pp = d->pp, e = d->ep;
    int pipe = r / (dp * tp), data = (r / tp) % dp, model = r % tp, s0 = pipe * dp * tp, stage = dp * tp;
    *n = 0;
    switch (k) {
    case DSC_GROUP_KIND_WORLD:
        for (int q = 0; q < pp * stage; q++)
            out[(*n)++] = q;
        break;
    case DSC_GROUP_KIND_PIPE:
        for (int q = 0; q < pp; q++)
            out[(*n)++] = (q * dp + data) * tp + model;
        break;
    case DSC_GROUP_KIND_DATA:
        for (int q = 0; q < dp; q++)
            out[(*n)++] = (pipe * dp + q) * tp + model;
        break;
    case DSC_GROUP_KIND_TENSOR:
        for (int q = 0; q < tp; q++)
            out[(*n)++] = (pipe * dp + data) * tp + q;
        break;
    case DSC_GROUP_KIND_EXPERT:
        if (d->expert_tp)
            for (int j = 0; j < e; j++)
                out[(*n)++] = (pipe * dp + data / e * e + j) * tp + model;
        else
            for (int j = 0; j < e; j++)
                out[(*n)++] = s0 + (r - s0) / e * e + j;
        break;
    default:
        if (d->expert_tp)
            for (int q = 0; q < dp / e; q++)
                out[(*n)++] = (pipe * dp + q * e + data % e) * tp + model;
        else
            for (int q = 0; q < stage / e; q++)
                out[(*n)++] = s0 + (r - s0) % e + q * e;
        break;
    }
}

static void test_4096_ranks(void **state) {
    (void)state;
    const dsc_parallel_dims cases[] = {
        {.pp = 4, .tp = 8, .ep = 16},
        {.pp = 4, .tp = 8, .ep = 16, .expert_tp = true},
        {.pp = 1, .tp = 1, .ep = 64},
        {.pp = 16, .tp = 4, .ep = 8, .expert_tp = true},
    };
    const int world = 4096;
    int *seen = malloc(world * sizeof *seen), *want = malloc(world * sizeof *want);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dsc_group_plan p;
        assert_ok(dsc_groups_plan(world, 0, &cases[c], &p));
        for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++) {
            check_partition(&p, (dsc_group_kind)k, seen);
            const dsc_group_list *l = &p.all[k];
            for (int r = 0; r < world; r++) {
                int n;
                closed_form(&p.dims, (dsc_group_kind)k, r, want, &n);
                const int *got = dsc_group_list_at(l, dsc_group_list_find(l, r));
                assert_int_equal(l->size, n);
                for (int i = 0; i < n; i++)
                    if (got[i] != want[i]) {
                        print_error("case %zu %s rank %d: member %d is %d, want %d\n", c,
                                    dsc_group_kind_name((dsc_group_kind)k), r, i, got[i], want[i]);
                        fail();
                    }
            }
        }
        dsc_group_plan_free(&p);
        /* A plan made for another rank picks that rank's groups. */
        assert_ok(dsc_groups_plan(world, 3001, &cases[c], &p));
        for (int k = 0; k < DSC_GROUP_KIND_COUNT; k++) {
            int n, m;
            const int *members = dsc_group_plan_members(&p, (dsc_group_kind)k, &n);
            closed_form(&p.dims, (dsc_group_kind)k, 3001, want, &m);
            assert_int_equal(n, m);
            assert_memory_equal(members, want, (size_t)n * sizeof *want);
        }
        dsc_group_plan_free(&p);
    }
    free(seen);
    free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipe2_data2_model2), cmocka_unit_test(test_pipe4_data2),
        cmocka_unit_test(test_data8_ep4),          cmocka_unit_test(test_experts_with_tensor_parallel),
        cmocka_unit_test(test_invalid_degrees),    cmocka_unit_test(test_4096_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
