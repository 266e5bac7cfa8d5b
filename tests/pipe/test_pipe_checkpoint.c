/* A pipeline run (P = 2, DP = world / 2, tied embeddings) saved after 3 steps
 * and resumed by a new trainer continues exactly as the uninterrupted run:
 * steps 4 and 5 have the same losses and the final parameters are the same
 * (bitwise: same layout, deterministic kernels). The checkpointer stores
 * parameters by global name, so the tied embedding held by both end stages
 * is one tensor in the file. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/train_fixture.h"
#include "dsc/checkpoint.h"
#include "dsc/pipe.h"
#include "test_mpi.h"

enum { STEPS = 5, SAVE_AT = 3 };

static char data_path[128], ckpt_dir[512];

typedef struct run {
    dsc_config cfg;
    dsc_pipe_trainer *t;
    dsc_checkpointer *ckpt;
} run;

static void start(run *r, dsc_comm *world) {
    char dir[600];
    snprintf(dir, sizeof dir, "checkpoint.save_dir=%s", ckpt_dir);
    const char *over[] = {"model.n_layer=6", "pipeline.stages=2", "checkpoint.save_interval=1000", dir};
    train_fixture_config(&r->cfg, data_path, over, 4, dsc_comm_size(world) / 2);
    dsc_pipe_trainer_options o = {.cfg = &r->cfg, .world = world};
    assert_ok(dsc_pipe_trainer_create(&o, &r->t));
    int size = dsc_comm_size(world);
    dsc_checkpointer_options co = {&r->cfg,
                                   dsc_pipe_trainer_engine(r->t),
                                   dsc_pipe_trainer_params(r->t),
                                   dsc_pipe_trainer_optimizer(r->t),
                                   MPI_COMM_WORLD,
                                   2,
                                   size / 2,
                                   1,
                                   dsc_pipe_trainer_rng(r->t),
                                   1,
                                   false};
    assert_ok(dsc_checkpointer_create(&co, &r->ckpt));
}

static void finish(run *r) {
    dsc_checkpointer_destroy(r->ckpt);
    dsc_pipe_trainer_destroy(r->t);
    dsc_config_free(&r->cfg);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static double step(run *r) {
    dsc_step_metrics m;
    assert_ok(dsc_engine_step(dsc_pipe_trainer_engine(r->t), &m));
    return m.loss;
}

static void test_resume_continues_exactly(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    snprintf(data_path, sizeof data_path, "/tmp/dsc_test_pipe_ckpt_%d.tok", (int)getpid());
    int job = (int)getpid(); /* rank 0's: one directory per run */
    MPI_Bcast(&job, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(ckpt_dir, sizeof ckpt_dir, "/tmp/dsc_test_pipe_ckpt_%d", job);
    train_fixture_tokens(data_path, 20000);

    run full, first, resumed;
    double want[STEPS], got[STEPS];
    start(&full, world);
    for (int s = 0; s < STEPS; s++)
        want[s] = step(&full);

    start(&first, world);
    for (int s = 0; s < SAVE_AT; s++)
        step(&first);
    assert_ok(dsc_checkpointer_save(first.ckpt));
    finish(&first);

    start(&resumed, world);
    assert_ok(dsc_checkpointer_resume(resumed.ckpt, "latest"));
    assert_int_equal(dsc_engine_steps_done(dsc_pipe_trainer_engine(resumed.t)), SAVE_AT);
    for (int s = SAVE_AT; s < STEPS; s++) {
        got[s] = step(&resumed);
        if (dsc_comm_rank(world) == 0)
            printf("  step %d: resumed loss %.9f, uninterrupted %.9f\n", s + 1, got[s], want[s]);
        assert_true(got[s] == want[s]);
    }
    dsc_param_store *a = dsc_pipe_trainer_params(resumed.t), *b = dsc_pipe_trainer_params(full.t);
    for (int i = 0; i < dsc_params_count(a); i++) {
        const dsc_param *p = dsc_params_at(a, i);
        assert_memory_equal(p->value.data, dsc_params_find(b, p->name)->value.data,
                            (size_t)dsc_param_numel(p) * sizeof(float));
    }
    finish(&resumed);
    finish(&full);
    unlink(data_path);
    assert_ok(dsc_comm_barrier(world));
    if (dsc_comm_rank(world) == 0) nftw(ckpt_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_continues_exactly),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
