/* Test-only: small Hugging Face checkpoints with random weights (Llama
 * and Qwen2 shapes, config.json + model.safetensors), for the parallel
 * inference tests that compare a layout against one process over shapes
 * the committed fixtures do not have (uneven splits, more layers). The
 * weights are random: these models check equivalence, not fidelity.
 * Not here: the comparisons (each test). */
#ifndef DSC_TESTS_INFERENCE_SYNTH_MODEL_H
#define DSC_TESTS_INFERENCE_SYNTH_MODEL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct synth {
    const char *arch;
    int C, NH, NKV, HS, F, V, L;
    bool qkv_bias, tied;
} synth;

/* Writes DIR/config.json and DIR/model.safetensors for s. */
void write_synth(const char *dir, const synth *s);
/* Rank 0 writes DSC_BINARY_DIR/tests/inference/synth_NAME_npW (W the world
 * size, so tests running side by side do not share one), the others wait. */
void synth_dir(char *dir, size_t len, const char *name, const synth *s);

#endif
