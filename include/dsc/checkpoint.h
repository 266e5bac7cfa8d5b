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

#include <mpi.h>
#include <stdint.h>

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
    MPI_Comm comm;               /* every rank of the job */
    dsc_param_store *params;     /* this rank's parameters */
    dsc_optimizer *optimizer;    /* NULL: model only */
    int64_t global_step;
    const char *config_json;
    const char *layout_json;     /* {"world": 4, "pp": 2, "dp": 2, "ep": 1, "zero_stage": 1} */
    const char *model_signature;
    const char *engine_json;     /* scheduler, data position, loss scale */
    dsc_rng *rngs;               /* this rank's streams, restored only into the same world size */
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
dsc_status dsc_checkpoint_save(const dsc_checkpoint_state *st, const char *save_dir, const char *tag,
                               int keep_last);

/* Collective. Restores from save_dir/<tag> (`tag` NULL or "latest" follows
 * the latest file) into st's live tensors. On success st->global_step is the
 * saved step and *engine_json (when not NULL) a malloc'd copy of the saved
 * engine state. */
dsc_status dsc_checkpoint_load(dsc_checkpoint_state *st, const char *save_dir, const char *tag,
                               dsc_checkpoint_scope scope, char **engine_json);

/* Complete checkpoints in save_dir, oldest step first (free() the array),
 * and the tag `latest` names; for tools. */
dsc_status dsc_checkpoint_list(const char *save_dir, char (**tags)[128], int *count);
dsc_status dsc_checkpoint_latest(const char *save_dir, char *tag, size_t len);

/* The path of a checkpoint's file ("latest" resolved), for tools. */
dsc_status dsc_checkpoint_path(const char *save_dir, const char *tag, char *path, size_t len);

#ifdef __cplusplus
}
#endif
#endif
