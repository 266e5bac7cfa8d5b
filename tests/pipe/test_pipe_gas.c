/* DeepSpeed's gradient-scaling regression (issue #8152, PR #8154), ported:
 * two 1x1 linear layers with weight 1 on two stages, input 1, target 0, MSE,
 * M = 2 micro-batches, SGD lr 0.1. The loss gradient is divided by M exactly
 * once (in the loss layer), so after one train_batch both weights are 0.8,
 * as one process computes: grad = 2 (x w1 w2 - 0) x = 2 per weight. Dividing
 * again on each stage would leave 0.9 (or 0.95). Also with GPipe and with
 * the interleaved schedule (three weights, four virtual stages). And the
 * runner's progress hook: the optimizer's progress runs before the kernels of
 * each stage's last backward of the batch, and only then. */
#include <math.h>
#include <stdio.h>

#include "test_mpi.h"
#include "test_pipe_layers.h"

/* The plain optimizer's table with its progress counted. */
static dsc_optimizer_ops counting_ops;
static dsc_status (*plain_progress)(dsc_optimizer *opt);
static int progress_calls;

static dsc_status counted_progress(dsc_optimizer *opt) {
    progress_calls++;
    return plain_progress ? plain_progress(opt) : NULL;
}

static void count_progress(dsc_optimizer *opt) {
    counting_ops = *opt->ops;
    plain_progress = counting_ops.progress;
    counting_ops.progress = counted_progress;
    opt->ops = &counting_ops;
    progress_calls = 0;
}

static void run(const char *const *types, int n, const char *method, int chunks, dsc_schedule_kind kind) {
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    test_pipe_spec spec = {types, n, method, chunks, kind, 2, 30};
    test_pipe tp;
    assert_ok(test_pipe_build(world, &spec, &tp));
    count_progress(tp.opt);
    test_const_source src;
    test_const_source_init(&src, 2, 1, 0);
    dsc_batch_result res;
    assert_ok(tp.runner->ops->train_batch(tp.runner, &src.base, &res));
    /* Each test layer's backward makes one kernel call per micro-batch: the hook ran before the
     * call of each local layer's last backward of the batch, and not in the first. */
    int n_local;
    dsc_pipe_stage_layers(tp.stage, &n_local);
    printf("  %s schedule, stage %d: progress ran %d times over %d layers\n", dsc_schedule_kind_name(kind),
           dsc_comm_rank(world), progress_calls, n_local);
    assert_int_equal(progress_calls, n_local);
    assert_ok(dsc_optimizer_reduce_grads(tp.opt));
    dsc_optim_stats st;
    assert_ok(dsc_optimizer_step(tp.opt, 0.1, &st));
    /* The one-process value, in the same float arithmetic. */
    const float expect = 1.0f - 0.1f * 2.0f;
    for (int i = 0; i < dsc_params_count(tp.store); i++) {
        const dsc_param *p = dsc_params_at(tp.store, i);
        float w = *(const float *)p->value.data;
        printf("  %s schedule, stage %d: %s = %.9g (expect %.9g), batch loss %.6f\n", dsc_schedule_kind_name(kind),
               dsc_comm_rank(world), p->name, w, expect, res.loss);
        assert_true(w == expect);
    }
    assert_true(fabs(res.loss - 1.0) < 1e-12);
    /* Both weights' gradients were 2: the global norm is sqrt(2^2 * layers). */
    assert_true(fabs(st.grad_norm - sqrt(4.0 * (n - 1))) < 1e-6);
    test_pipe_free(&tp);
    dsc_comm_free(world);
}

static const char *const two[] = {"test_linear", "test_linear", "test_mse"};
static const char *const three[] = {"test_linear", "test_linear", "test_linear", "test_mse"};

static void test_gas_1f1b(void **state) {
    (void)state;
    run(two, 3, "type:linear", 1, DSC_SCHEDULE_TRAIN_1F1B);
}

static void test_gas_gpipe(void **state) {
    (void)state;
    run(two, 3, "type:linear", 1, DSC_SCHEDULE_GPIPE);
}

static void test_gas_interleaved(void **state) {
    (void)state;
    run(three, 4, "uniform", 2, DSC_SCHEDULE_INTERLEAVED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gas_1f1b),
        cmocka_unit_test(test_gas_gpipe),
        cmocka_unit_test(test_gas_interleaved),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
