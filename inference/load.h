/* Private to inference/: the checkpoint loaders behind dsc_infer_model_load
 * (load_model.c picks one from the path). */
#ifndef DSC_INFERENCE_LOAD_H
#define DSC_INFERENCE_LOAD_H

#include "dsc/inference.h"

/* A Hugging Face directory (config.json + safetensors). */
dsc_status dsc_load_hf(const char *dir, dsc_infer_model **out);
/* Its config.json alone: the architecture's policy and the model config it gives. */
dsc_status dsc_load_hf_config(const char *dir, const dsc_policy **policy, dsc_infer_model_config *mc);
/* A dsc training checkpoint file (state.h5), model parameters only. */
dsc_status dsc_load_dsc(const char *file, dsc_infer_model **out);
/* A whole text file, NUL-terminated; free() it. */
dsc_status dsc_load_read_text(const char *path, char **out);

#endif
