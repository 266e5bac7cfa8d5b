/* Failures end with errors naming stages, within the p2p timeout, on every
 * rank; nothing hangs and nothing is silently misread:
 *  - stage 0's model emits two features per token where the others expect
 *    one: stage 1 rejects the meta header naming both stages; stage 0 then
 *    times out waiting for stage 1's gradient, later stages waiting for
 *    stage 1's activations;
 *  - the last stage stops answering (takes no part in the batch): every
 *    other stage times out naming the stage it waited for;
 *  - a world size that pipeline.stages does not divide is a config error
 *    on every rank before any communication. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../engine/train_fixture.h"
#include "dsc/pipe.h"
#include "test_mpi.h"
#include "test_pipe_layers.h"

enum { MAX_P = 8 };
static const double TIMEOUT_S = 1.5;

/* A pipe communicator over the world for one failing pipeline. It is never
 * freed: the failed batch leaves unreceived messages on it, and MPI may give
 * a freed communicator's context to the next one created. */
static dsc_comm *pipe_comm(dsc_comm *world) {
    int P = dsc_comm_size(world), all[MAX_P];
    for (int i = 0; i < P; i++)
        all[i] = i;
    dsc_comm *pipe;
    assert_ok(dsc_comm_create_sub(world, all, P, "pipe", &pipe));
    return pipe;
}

/* P linear layers (one per stage) and the loss; stage 0 may build a wide one. */
static dsc_status build(dsc_comm *world, bool wide_first, test_pipe *tp) {
    int P = dsc_comm_size(world);
    const char *types[MAX_P + 1];
    for (int i = 0; i < P; i++)
        types[i] = "test_linear";
    if (wide_first && dsc_comm_rank(world) == 0) types[0] = "test_wide";
    types[P] = "test_mse";
    test_pipe_spec spec = {types, P + 1, "type:linear|wide", 1, DSC_SCHEDULE_TRAIN_1F1B, 2, TIMEOUT_S};
    return test_pipe_build(pipe_comm(world), &spec, tp);
}

static dsc_status train_once(test_pipe *tp) {
    test_const_source src;
    test_const_source_init(&src, 2, 1, 0);
    dsc_batch_result res;
    return tp->runner->ops->train_batch(tp->runner, &src.base, &res);
}

static void expect(dsc_status s, dsc_code code, const char *needle, int stage) {
    printf("  stage %d: %s\n", stage, dsc_status_message(s));
    fflush(stdout);
    assert_err(s, code, needle);
}

static void test_wrong_shape(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int stage = dsc_comm_rank(world);
    test_pipe tp;
    assert_ok(build(world, true, &tp));
    dsc_status s = train_once(&tp);
    char needle[96];
    if (stage == 1) {
        expect(s, DSC_ERR_INVALID, "stage 0 chunk 0 sends activations of shape (1, 1, 2) f32, but stage 1 accepts",
               stage);
    } else if (stage == 0) {
        expect(s, DSC_ERR_TIMEOUT, "receiving gradients from stage 1", stage);
    } else {
        snprintf(needle, sizeof needle, "receiving activations from stage %d", stage - 1);
        expect(s, DSC_ERR_TIMEOUT, needle, stage);
    }
    test_pipe_free(&tp);
    assert_ok(dsc_comm_barrier(world));
    dsc_comm_free(world);
}

static void test_silent_peer(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int stage = dsc_comm_rank(world), P = dsc_comm_size(world);
    test_pipe tp;
    assert_ok(build(world, false, &tp));
    if (stage < P - 1) {
        char needle[96];
        snprintf(needle, sizeof needle, "receiving gradients from stage %d", stage + 1);
        expect(train_once(&tp), DSC_ERR_TIMEOUT, needle, stage);
    }
    test_pipe_free(&tp);
    assert_ok(dsc_comm_barrier(world));
    dsc_comm_free(world);
}

static void test_world_not_divisible(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int W = dsc_comm_size(world), P = W + 1;
    char data[128], stages[48];
    snprintf(data, sizeof data, "/tmp/dsc_test_pipe_fail_%d.tok", (int)getpid());
    snprintf(stages, sizeof stages, "pipeline.stages=%d", P);
    train_fixture_tokens(data, 4000);
    const char *over[] = {"model.n_layer=6", stages};
    dsc_config cfg;
    train_fixture_config(&cfg, data, over, 2, 1);
    dsc_pipe_trainer_options o = {.cfg = &cfg, .world = world};
    dsc_pipe_trainer *t = NULL;
    char needle[96];
    snprintf(needle, sizeof needle, "%d ranks are not divisible by \"pipeline.stages\" %d", W, P);
    expect(dsc_pipe_trainer_create(&o, &t), DSC_ERR_CONFIG, needle, dsc_comm_rank(world));
    dsc_config_free(&cfg);
    unlink(data);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrong_shape),
        cmocka_unit_test(test_silent_peer),
        cmocka_unit_test(test_world_not_divisible),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
