/* dsc/checkpoint.h — saving and restoring a training job as one HDF5 file.
 *
 * Layout (docs/checkpoint.md): save_dir/<tag>/state.h5 and save_dir/latest.
 * Every parameter is the dataset model/<global name> with its global shape;
 * optimizer state is optimizer/<state name> ("optimizer/exp_avg/<param>",
 * "optimizer/step"); root attributes hold the format version, dsc version,
 * global step, the config, the parallel layout, the model signature and the
 * engine state; rng/states holds each rank's RNG streams.
 *
 * Each rank contributes what it holds (its stage's parameters, its ZeRO
 * shard of the optimizer state, its experts) as flat ranges of global
 * tensors, and reads back whatever ranges it holds in the restoring job, so a
 * checkpoint restores into another (PP, DP, EP, ZeRO) layout directly.
 * Restores stage everything and validate it on every rank before anything
 * live is touched: a failed restore leaves the job's state as it was.
 *
 * Not here: when to save (the engine hook in dsc-train), how files are
 * written (dsc/tensor_file.h), directory publication (runtime/checkpoint). */
#ifndef DSC_CHECKPOINT_H
#define DSC_CHECKPOINT_H

#include "dsc/api.h"
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "dsc/config.h"
#include "dsc/engine.h"
#include "dsc/nn.h"
#include "dsc/optimizer.h"
#include "dsc/rng.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_CHECKPOINT_FORMAT_VERSION 1

/* What a job saves and restores. Strings are JSON; the model signature must
 * match exactly on restore (it names the architecture and every shape). */
typedef struct dsc_checkpoint_state {
    MPI_Comm comm;            /* every rank of the job */
    dsc_param_store *params;  /* this rank's parameters */
    dsc_optimizer *optimizer; /* NULL: model only */
    int64_t global_step;
    const char *config_json;
    const char *layout_json; /* {"world": 4, "pp": 2, "dp": 2, "ep": 1, "zero_stage": 1} */
    const char *model_signature;
    const char *engine_json; /* scheduler, data position, loss scale */
    dsc_rng *rngs;           /* this rank's streams, restored only into the same world size */
    int n_rngs;
} dsc_checkpoint_state;

typedef enum dsc_checkpoint_scope {
    DSC_CHECKPOINT_FULL = 0,      /* parameters, optimizer state, step, RNG */
    DSC_CHECKPOINT_MODEL_ONLY = 1 /* parameters only (inference, fine-tuning) */
} dsc_checkpoint_scope;

/* Collective. Writes save_dir/<tag>/state.h5 through a partial directory and
 * publishes it (then `latest`) only when every rank succeeded; keeps the
 * newest `keep_last` checkpoints (0 keeps all). An existing tag is never
 * overwritten. */
DSC_API dsc_status dsc_checkpoint_save(const dsc_checkpoint_state *st, const char *save_dir, const char *tag,
                                       int keep_last);

/* Collective. Restores from save_dir/<tag> (`tag` NULL or "latest" follows
 * the latest file) into st's live tensors. On success st->global_step is the
 * saved step and *engine_json (when not NULL) a malloc'd copy of the saved
 * engine state. */
DSC_API dsc_status dsc_checkpoint_load(dsc_checkpoint_state *st, const char *save_dir, const char *tag,
                                       dsc_checkpoint_scope scope, char **engine_json);

/* Reads elements [begin, begin + count) (row-major) of the global tensor
 * `name` (a parameter's name, no "model/" prefix) of shape (ndim, shape) as
 * f32 into dst: a source of initial parameter values in another format. */
typedef dsc_status (*dsc_checkpoint_read_fn)(void *ctx, const char *name, int ndim, const int64_t *shape,
                                             int64_t begin, int64_t count, float *dst);

/* Collective. Sets st's parameters (whatever ranges this rank holds, ZeRO-3
 * shards included) from `read`, as a model-only restore does: everything
 * is read and agreed on every rank before any parameter changes. */
DSC_API dsc_status dsc_checkpoint_load_params(dsc_checkpoint_state *st, dsc_checkpoint_read_fn read, void *ctx);

/* Not collective (rank 0 of a job, or a tool): repairs what a crash left in
 * save_dir so that `latest` can be resumed. A tag newer than the one latest
 * names (by the step in its name) is the save a crash stopped between its
 * publication and latest's update: newest first, each is verified (the file
 * opens, its step matches, every tensor's checksums hold) and the first sound
 * one adopted as latest; a damaged one is set aside as <tag>.damaged, never
 * deleted. Each repair is reported on `log` (may be NULL). An error when
 * nothing can be resumed (no latest and no sound tag). */
DSC_API dsc_status dsc_checkpoint_recover(const char *save_dir, FILE *log);

/* Complete checkpoints in save_dir, oldest step first (free() the array),
 * and the tag `latest` names; for tools. */
DSC_API dsc_status dsc_checkpoint_list(const char *save_dir, char (**tags)[128], int *count);
DSC_API dsc_status dsc_checkpoint_latest(const char *save_dir, char *tag, size_t len);

/* The path of a checkpoint's file ("latest" resolved), for tools. */
DSC_API dsc_status dsc_checkpoint_path(const char *save_dir, const char *tag, char *path, size_t len);

/* ---- checkpointing a training run -------------------------------------------------
 * Saves every checkpoint.save_interval steps and after the last step into
 * checkpoint.save_dir (keeping checkpoint.keep_last), and resumes from a tag.
 * Attach it to the run's engine with dsc_engine_set_hook(engine,
 * dsc_checkpointer_on_step, checkpointer). The data position and the LR
 * schedule are functions of the step, so the step restores both. */
typedef struct dsc_checkpointer dsc_checkpointer;

typedef struct dsc_checkpointer_options {
    const dsc_config *cfg; /* checkpoint section, train.steps, the config saved with the state */
    dsc_engine *engine;
    dsc_param_store *params; /* this rank's */
    dsc_optimizer *optimizer;
    MPI_Comm comm;  /* every rank of the job */
    int pp, dp, ep; /* the layout, recorded in the checkpoint */
    dsc_rng *rngs;  /* per-rank streams whose state must survive a resume */
    int n_rngs;
    bool log; /* this rank prints "saved ..." lines */
} dsc_checkpointer_options;

DSC_API dsc_status dsc_checkpointer_create(const dsc_checkpointer_options *opts, dsc_checkpointer **out);
DSC_API void dsc_checkpointer_destroy(dsc_checkpointer *c);
/* Collective: restores the full state from checkpoint.save_dir/<tag> ("latest"
 * or NULL follows latest) and moves the engine to the saved step. */
DSC_API dsc_status dsc_checkpointer_resume(dsc_checkpointer *c, const char *tag);
/* Collective: saves now as global_step<N> (N = steps done). */
DSC_API dsc_status dsc_checkpointer_save(dsc_checkpointer *c);
/* The step of the last save of this checkpointer; -1 before the first. */
DSC_API int64_t dsc_checkpointer_saved_step(const dsc_checkpointer *c);
/* The engine hook: saves when the step is a multiple of save_interval or the last. */
DSC_API dsc_status dsc_checkpointer_on_step(dsc_engine *e, const dsc_step_metrics *m, void *ctx);
/* The model signature of a config: architecture and shapes, layout-independent. */
DSC_API dsc_status dsc_checkpoint_model_signature(const dsc_config *cfg, char **json);

#ifdef __cplusplus
}
#endif
#endif
