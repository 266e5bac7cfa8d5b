/* dsc/rng.h — reproducible random streams, one per (seed, rank, purpose).
 *
 * xoshiro256** seeded through splitmix64, so streams for different ranks and
 * purposes are independent and a run is reproducible from its seed alone.
 * The state is a plain struct so checkpoints can save and restore it.
 *
 * Thread-safety: there is no global state; a stream must not be shared
 * between threads without the caller's lock (give each thread its own). */
#ifndef DSC_RNG_H
#define DSC_RNG_H

#include "dsc/api.h"
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_rng_purpose {
    DSC_RNG_INIT = 0, /* parameter initialisation (same on every rank) */
    DSC_RNG_DATA,     /* data order */
    DSC_RNG_DROPOUT,
    DSC_RNG_GATE,  /* MoE gate noise and random token selection */
    DSC_RNG_SAMPLE /* decoding */
} dsc_rng_purpose;

typedef struct dsc_rng {
    uint64_t s[4];
} dsc_rng;

DSC_API void dsc_rng_init(dsc_rng *rng, uint64_t seed, int rank, dsc_rng_purpose purpose);
DSC_API uint64_t dsc_rng_u64(dsc_rng *rng);
/* Uniform in [0, 1). */
DSC_API double dsc_rng_uniform(dsc_rng *rng);
/* Uniform integer in [0, n); n > 0. */
DSC_API uint64_t dsc_rng_below(dsc_rng *rng, uint64_t n);
/* Standard normal (Box-Muller): exactly two draws of the stream each (the parameter
 * initialisation steps a stream ahead by that count to split it over threads). */
DSC_API double dsc_rng_normal(dsc_rng *rng);

#ifdef __cplusplus
}
#endif
#endif
