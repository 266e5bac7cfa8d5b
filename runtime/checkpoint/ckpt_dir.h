/* The checkpoint directory: save_dir/<tag>/state.h5 plus a `latest` file, as
 * DeepSpeed lays it out, with crash-safe publication:
 *   1. rank 0 makes save_dir/.<tag>.partial/ and everyone writes state.h5 there;
 *   2. the file is fsynced, the directory renamed to save_dir/<tag>, save_dir fsynced;
 *   3. `latest` is replaced atomically (write latest.tmp, fsync, rename).
 * A job killed at any moment leaves `latest` naming a complete checkpoint;
 * killed between 2 and 3, it leaves a complete tag newer than `latest`,
 * which a resume verifies and adopts (checkpoint.c). Pruning renames a tag
 * to .<tag>.pruning before deleting it, so a kill there leaves no tag
 * directory that looks like a checkpoint. Nothing here deletes a saved
 * checkpoint other than pruning: a damaged one is set aside as
 * <tag>.damaged. Only rank 0 touches the file system here; callers agree on
 * the outcome. */
#ifndef DSC_RUNTIME_CHECKPOINT_DIR_H
#define DSC_RUNTIME_CHECKPOINT_DIR_H

#include <stddef.h>
#include <stdint.h>

#include "dsc/status.h"

#define DSC_CKPT_FILE "state.h5"

/* mkdir -p: `path` and its parents (also the monitors' output directories). */
dsc_status dsc_fs_make_dirs(const char *path);

/* Paths of the in-progress and final directory of `tag`. */
void dsc_ckpt_partial_dir(const char *save_dir, const char *tag, char *buf, size_t len);
void dsc_ckpt_final_dir(const char *save_dir, const char *tag, char *buf, size_t len);

/* Rank 0: creates save_dir (and parents) and a fresh partial directory.
 * Fails if the final tag already exists: a saved checkpoint is never replaced. */
dsc_status dsc_ckpt_dir_begin(const char *save_dir, const char *tag);
/* Rank 0: fsyncs the file, renames partial -> final, fsyncs save_dir, updates latest. */
dsc_status dsc_ckpt_dir_publish(const char *save_dir, const char *tag);
/* Rank 0: removes the partial directory of a failed save. */
void dsc_ckpt_dir_abandon(const char *save_dir, const char *tag);

/* Reads the tag named by save_dir/latest. */
dsc_status dsc_ckpt_read_latest(const char *save_dir, char *tag, size_t len);
/* Rank 0: points save_dir/latest at `tag` atomically (write latest.tmp, fsync, rename). */
dsc_status dsc_ckpt_write_latest(const char *save_dir, const char *tag);
/* Rank 0: renames save_dir/<tag> to save_dir/<tag>.damaged (or .damaged.2, ...)
 * so that no listing, resume or save sees it again; `name` receives the new name. */
dsc_status dsc_ckpt_set_aside(const char *save_dir, const char *tag, char *name, size_t len);
/* The step a tag names: its last run of digits ("global_step12" -> 12), or -1. */
long long dsc_ckpt_tag_step(const char *tag);

/* Tags in save_dir that have a complete state.h5, oldest step first (by
 * dsc_ckpt_tag_step, then by name); hidden (.name) and set-aside (.damaged)
 * directories are not tags. Caller frees with free(). */
dsc_status dsc_ckpt_list_tags(const char *save_dir, char (**tags)[128], int *count);

/* Rank 0: deletes the oldest complete checkpoints so that `keep_last` remain
 * (never the one `latest` names), each renamed to .<tag>.pruning first; then
 * finishes what a killed prune left (.*.pruning directories) and removes
 * empty tag directories. keep_last <= 0 keeps everything. */
dsc_status dsc_ckpt_prune(const char *save_dir, int keep_last);

#endif
