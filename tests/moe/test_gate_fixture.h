/* Loading the PyTorch gate fixtures (tests/ref/moe_gate_ref.py writes them
 * to tests/moe/fixtures/) for the gate tests. Test-only helper. */
#ifndef DSC_TEST_GATE_FIXTURE_H
#define DSC_TEST_GATE_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/moe_gate.h"

#define GATE_FIXTURE_DIR DSC_SOURCE_DIR "/tests/moe/fixtures"

typedef struct gate_fixture {
    char name[96];
    char path[512];
    dsc_moe_gate_config cfg; /* random elements off */
    bool training;
    int64_t S, E;
    int k;
    dsc_tensor logits; /* (S, E) f32 */
    int64_t capacity;
    int32_t *expert;      /* (S, K) */
    int32_t *slot;        /* (S, K) -1 when dropped */
    double *weight;       /* (S, K) */
    int64_t *exp_counts;  /* (E) */
    int64_t *kept_counts; /* (E) */
    double l_aux, z_loss;
    dsc_tensor d_weight; /* (S, K) f32 */
    double *d_logits;    /* (S, E) autograd gradient */
} gate_fixture;

/* Paths of every fixture, sorted; *count set. Free with gate_fixture_free_paths. */
char **gate_fixture_paths(int *count);
void gate_fixture_free_paths(char **paths, int count);

dsc_status gate_fixture_load(const char *path, gate_fixture *fx);
void gate_fixture_free(gate_fixture *fx);

#endif
