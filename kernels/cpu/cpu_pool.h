/* A small thread pool for the short, frequent parallel loops of decode
 * (the GEMVs over a token's weights, attention over heads): dozens per
 * token, each tens of microseconds. Unlike an OpenMP region, a job is over
 * when its chunks are done, not when every thread has reached a barrier:
 * the calling thread claims chunks itself, a worker that is late (asleep,
 * or descheduled on a machine with more runnable threads than cores) finds
 * nothing left to claim, and nobody waits for it. The caller waits only for
 * chunks another thread has claimed and not finished. Idle workers spin
 * briefly, then yield, then sleep. */
#ifndef DSC_KERNELS_CPU_POOL_H
#define DSC_KERNELS_CPU_POOL_H

#include <stdint.h>

/* Runs fn(arg, i) for every i in [0, chunks) on up to
 * dsc_kernels_get_num_threads() threads (the caller among them) and returns
 * when all have returned. Chunks run in any order, each exactly once, and
 * must not depend on each other. Called from inside a pool chunk, an
 * OpenMP parallel region, or while another thread's job runs, it runs the
 * chunks on the calling thread. */
void dsc_cpu_pool_run(void (*fn)(void *arg, int64_t chunk), void *arg, int64_t chunks);

#endif
