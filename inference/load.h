/* Private to inference/: the checkpoint loaders behind dsc_infer_model_load
 * (load_model.c picks one from the path). */
#ifndef DSC_INFERENCE_LOAD_H
#define DSC_INFERENCE_LOAD_H

#include "dsc/inference.h"

/* What a loader is asked for: the model (*model, whole or this rank's
 * shard) or only the tensor-parallel plan (*plan, no weights read). */
typedef struct dsc_load_request {
    const dsc_infer_tp *tp; /* NULL: one rank */
    const dsc_infer_pp *pp; /* NULL: one stage */
    dsc_infer_model **model;
    dsc_tp_plan **plan;
} dsc_load_request;

/* A Hugging Face directory (config.json + safetensors). */
dsc_status dsc_load_hf(const char *dir, const dsc_load_request *req);
/* Its config.json alone: the architecture's policy and the model config it
 * gives; *json (when json is not NULL) the file's text, to free(). */
dsc_status dsc_load_hf_config(const char *dir, const dsc_policy **policy, dsc_infer_model_config *mc, char **json);
/* A dsc training checkpoint file (state.h5), model parameters only. */
dsc_status dsc_load_dsc(const char *file, const dsc_load_request *req);
/* What every loader ends with (load_tp.c): the plan when asked for, else
 * the model built from src, sharded when req->tp has more than one rank.
 * config_json (NULL for none) may carry base_model_tp_plan. */
/* The plan of a Hugging Face family with no policy: sizes from config.json's
 * common keys, kinds from partition_config, base_model_tp_plan and the name
 * rules only (GPT-2's Conv1D weights known as transposed); a tensor no rule
 * places is refused, listed. */
dsc_status dsc_load_plan_by_names(const dsc_tensor_source *src, const char *config_json, const char *source,
                                  const dsc_load_request *req);
dsc_status dsc_load_finish(const dsc_policy *policy, const dsc_infer_model_config *mc,
                           const dsc_tensor_source *src, const char *config_json, const char *source,
                           const dsc_load_request *req);
/* A whole text file, NUL-terminated; free() it. */
dsc_status dsc_load_read_text(const char *path, char **out);

#endif
