/* xoshiro256** streams seeded by splitmix64 over (seed, rank, purpose). */
#include "dsc/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void dsc_rng_init(dsc_rng *rng, uint64_t seed, int rank, dsc_rng_purpose purpose) {
    uint64_t x = seed;
    uint64_t mix = splitmix64(&x) ^ ((uint64_t)(uint32_t)rank << 20) ^ ((uint64_t)purpose << 52);
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&mix);
}

uint64_t dsc_rng_u64(dsc_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double dsc_rng_uniform(dsc_rng *rng) {
    return (double)(dsc_rng_u64(rng) >> 11) * 0x1.0p-53;
}

uint64_t dsc_rng_below(dsc_rng *rng, uint64_t n) {
    /* Rejection sampling keeps the result unbiased for any n. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do
        r = dsc_rng_u64(rng);
    while (r >= limit);
    return r % n;
}

double dsc_rng_normal(dsc_rng *rng) {
    double u1 = dsc_rng_uniform(rng);
    double u2 = dsc_rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
