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

#include <stdbool.h>
#include <stdint.h>

/* Runs fn(arg, i) for every i in [0, chunks) on up to
 * dsc_kernels_get_num_threads() threads (the caller among them) and returns
 * when all have returned. Chunks run in any order, each exactly once, and
 * must not depend on each other. Called from inside a pool chunk, an
 * OpenMP parallel region, or while another thread's job runs, it runs the
 * chunks on the calling thread. */
void dsc_cpu_pool_run(void (*fn)(void *arg, int64_t chunk), void *arg, int64_t chunks);
/* The same on at most max_threads threads. */
void dsc_cpu_pool_run_upto(void (*fn)(void *arg, int64_t chunk), void *arg, int64_t chunks, int max_threads);
/* Inside a chunk: which of the job's threads runs it, in [0, threads) (0 is the caller). */
int dsc_cpu_pool_thread(void);
/* Whether the calling thread is running a pool chunk (a job it starts then runs inline). */
bool dsc_cpu_pool_inside(void);

/* The pool scope of the calling thread: while on (the inference forward turns it on for its
 * duration), the GEMM splits run on the pool too, and the elementwise kernels' OpenMP loops stay
 * on the calling thread, so no OpenMP worker spins on a core the pool's threads need. Returns
 * the previous setting. */
bool dsc_cpu_pool_set_scope(bool on);
bool dsc_cpu_pool_scope(void);

#endif
