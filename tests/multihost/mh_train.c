/* mh_train: the PP x EP training job the multi-host tests launch across
 * hosts and on one host, to compare the two.
 *
 *   mh_train CONFIG [--set key=value]...
 *   mh_train --hosts       world rank 0 prints "rank R of N on host H" for every rank
 *
 * Builds the pipeline trainer (pipe/) from the config with the MoE layers
 * (moe/) plugged in through its build hook, so pipeline.stages x moe.ep_size
 * both take effect, and runs train.steps steps. Prints, on world rank 0,
 * "step N loss L" with every digit of the loss averaged over the ranks, and
 * on every rank "params rank R: n=N sum=S sumsq=Q" over its own parameters,
 * so that two runs of the same layout can be compared rank by rank. On
 * failure every rank prints the launcher's note ("dsc: rank R failed: ...")
 * and aborts the job. dsc-train does not build pipelines yet; once it does,
 * the tests can launch it instead.
 * Not here: the comparison itself (test_multihost.sh). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/comm.h"
#include "dsc/config.h"
#include "dsc/moe.h"
#include "dsc/pipe.h"
#include "dsc/zero.h"

/* Lives until the stage is built; the moe_block factory reads it then. */
static dsc_moe_build_extra moe_extra;

static dsc_status prepare_moe(const dsc_config *cfg, dsc_groups *groups, void *ctx, const void **build_extra) {
    (void)ctx;
    DSC_TRY(dsc_moe_register_layers());
    DSC_TRY(dsc_moe_options_from_config(&cfg->moe, cfg->model.arch, &moe_extra.options));
    moe_extra.ep = dsc_groups_get(groups, DSC_GROUP_KIND_EXPERT);
    *build_extra = &moe_extra;
    return NULL;
}

static void print_params(dsc_param_store *params, int rank) {
    double sum = 0, sumsq = 0;
    int64_t n = 0;
    for (int i = 0; i < dsc_params_count(params); i++) {
        const dsc_param *p = dsc_params_at(params, i);
        const float *v = p->value.data;
        for (int64_t k = 0; k < dsc_param_numel(p); k++) {
            sum += v[k];
            sumsq += (double)v[k] * v[k];
        }
        n += dsc_param_numel(p);
    }
    printf("params rank %d: n=%lld sum=%.9e sumsq=%.9e\n", rank, (long long)n, sum, sumsq);
    fflush(stdout);
}

static void print_hosts(dsc_comm *world) {
    if (dsc_comm_rank(world) != 0) return;
    for (int r = 0; r < dsc_comm_size(world); r++)
        printf("rank %d of %d on host %s\n", r, dsc_comm_size(world), dsc_comm_host(world, r));
    fflush(stdout);
}

static dsc_status train(dsc_comm *world, const char *path, const char **overrides, int n_overrides) {
    dsc_config cfg;
    DSC_TRY(dsc_config_load_file(path, overrides, n_overrides, &cfg));
    dsc_pipe_trainer *t = NULL;
    /* Set before the groups exist: they inherit the world's timeout. */
    dsc_status s = dsc_comm_set_timeout(world, cfg.comm.timeout_s);
    if (!s) s = dsc_config_resolve_batch(&cfg, dsc_comm_size(world) / cfg.pipeline.stages);
    dsc_pipe_trainer_options o = {
        .cfg = &cfg,
        .world = world,
        .hooks = {.prepare_build = cfg.moe.num_experts > 0 ? prepare_moe : NULL,
                  .make_optimizer = dsc_zero_make_optimizer},
    };
    if (!s) s = dsc_pipe_trainer_create(&o, &t);
    for (int64_t step = 0; !s && step < cfg.train.steps; step++) {
        dsc_step_metrics m;
        s = dsc_engine_step(dsc_pipe_trainer_engine(t), &m);
        if (!s && dsc_comm_rank(world) == 0) {
            printf("step %lld loss %.9e\n", (long long)m.step, m.loss);
            fflush(stdout);
        }
    }
    if (!s) print_params(dsc_pipe_trainer_params(t), dsc_comm_rank(world));
    dsc_pipe_trainer_destroy(t);
    dsc_config_free(&cfg);
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: mh_train CONFIG [--set key=value]... | mh_train --hosts\n");
        return 2;
    }
    bool hosts_only = strcmp(argv[1], "--hosts") == 0;
    const char *overrides[64];
    int n_overrides = 0;
    for (int i = 2; i + 1 < argc && n_overrides < 64; i += 2)
        if (strcmp(argv[i], "--set") == 0) overrides[n_overrides++] = argv[i + 1];
    dsc_comm *world = NULL;
    dsc_status s = dsc_comm_world(NULL, &world);
    if (!s && hosts_only) print_hosts(world);
    if (!s && !hosts_only) s = train(world, argv[1], overrides, n_overrides);
    if (s) {
        fprintf(stderr, "dsc: rank %d failed: %s\n", world ? dsc_comm_rank(world) : -1, dsc_status_message(s));
        fflush(stderr);
        dsc_status_free(s);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    dsc_comm_free(world);
    dsc_status_free(dsc_comm_finalize());
    return 0;
}
