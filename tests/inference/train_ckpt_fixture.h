/* Test-only fixture shared by test_engine_dsc and test_dsc_moe: tiny models
 * trained on tinyshakespeare through the training stack, saved as dsc
 * checkpoints, and the comparisons of the inference engine against the
 * training layers (logits at every prompt position, greedy continuation).
 * Not here: which models are trained, how the trainer is created, or the
 * tolerances; each test decides those. */
#ifndef DSC_TESTS_INFERENCE_TRAIN_CKPT_FIXTURE_H
#define DSC_TESTS_INFERENCE_TRAIN_CKPT_FIXTURE_H

#include <stdint.h>

#include "dsc/config.h"
#include "dsc/engine.h"
#include "dsc/inference.h"
#include "dsc/model.h"
#include "dsc/moe.h"

/* Writes the first 20000 bytes of data/tinyshakespeare.txt to DIR/tokens.bin
 * as byte tokens and parses `json` with "data.path=DIR/tokens.bin" followed
 * by `overrides` (at most 7), batch resolved for one rank. */
void train_ckpt_config(const char *json, const char *dir, const char *const *overrides, int n_overrides,
                       dsc_config *cfg);

/* A one-rank trainer for cfg; MoE configs (moe.num_experts > 0) get the moe/
 * layers with *extra as their build extra (zeroed and filled here). */
dsc_trainer *train_ckpt_trainer(const dsc_config *cfg, dsc_moe_build_extra *extra);

/* Saves the trainer's parameters as tag "step4" of a one-rank layout in
 * `save_dir`, with `cfg` as the checkpoint's training config. */
void train_ckpt_save(dsc_trainer *t, const dsc_config *cfg, const char *save_dir);

/* An engine over `m` with blocks of 8 tokens and a 1 MiB KV cache. */
dsc_infer_engine *train_ckpt_engine(dsc_infer_model *m);

/* Logits (T, vocab) of the training model's layers (eval mode; `extra` is
 * the build extra of MoE layers, NULL for dense models), rebuilt in a fresh
 * parameter store holding t's trained values, over one (1, T) prompt. The
 * caller frees the result. */
float *train_ckpt_training_logits(const dsc_config *cfg, const dsc_moe_build_extra *extra, dsc_trainer *t,
                                  const int32_t *prompt, int64_t T);

/* Worst relative error of the engine's logits (vocab V) at every position of
 * prompt[0 .. n) fed one token at a time as sequence `uid`, against the
 * training logits `train` (n, V); the sequence is flushed afterwards. */
double train_ckpt_prompt_error(dsc_infer_engine *e, const float *train, const int32_t *prompt, int32_t n,
                               uint64_t uid, int32_t V);

/* The engine's greedy continuation of prompt[0 .. n) by n_new tokens (as
 * sequence `uid`, flushed afterwards) must equal dsc_trainer_generate's
 * (temperature 0) token for token; both are printed as text. */
void train_ckpt_check_greedy(dsc_infer_engine *e, dsc_trainer *t, const int32_t *prompt, int32_t n, int32_t n_new,
                             uint64_t uid, int32_t V);

/* Removes the directory tree `dir`. */
void train_ckpt_remove_dir(const char *dir);

#endif
