/* Private to inference/: the checkpoint loaders behind dsc_infer_model_load
 * (load_model.c picks one from the path). */
#ifndef DSC_INFERENCE_LOAD_H
#define DSC_INFERENCE_LOAD_H

#include "dsc/inference.h"

/* A Hugging Face directory (config.json + safetensors). */
dsc_status dsc_load_hf(const char *dir, dsc_infer_model **out);
/* A dsc training checkpoint file (state.h5), model parameters only. */
dsc_status dsc_load_dsc(const char *file, dsc_infer_model **out);
/* A whole text file, NUL-terminated; free() it. */
dsc_status dsc_load_read_text(const char *path, char **out);

#endif
