/* dsc/pipe_sim.h — a cost-model simulator for pipeline schedules.
 *
 * Runs the instruction streams of all P stages against each other with
 * per-instruction costs: ForwardPass costs forward/v, BackwardPass
 * backward/v (v = model chunks per stage, 1 except for interleaved), load
 * and batch-end instructions cost nothing, and a send/recv pair is a
 * rendezvous: both ends block until both have posted, then both are busy
 * for p2p time units. It reports makespan, bubble fraction and peak live
 * activations per stage, and draws ASCII and SVG timelines. Cost is
 * O(total instructions). It does not run any model, tensors or MPI. */
#ifndef DSC_PIPE_SIM_H
#define DSC_PIPE_SIM_H

#include "dsc/api.h"
#include <stddef.h>
#include <stdio.h>

#include "dsc/schedule.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_pipe_sim_costs {
    double forward;  /* F: forward of one micro-batch through a whole stage */
    double backward; /* B: its backward */
    double p2p;      /* C: one send/recv rendezvous */
} dsc_pipe_sim_costs;

/* One compute instruction as it ran. */
typedef struct dsc_pipe_sim_segment {
    double start, end;
    int backward; /* 0 forward, 1 backward */
    int micro_batch;
    int chunk;
} dsc_pipe_sim_segment;

typedef struct dsc_pipe_sim_stage {
    double busy;   /* time spent in ForwardPass / BackwardPass */
    double finish; /* when its last instruction completed */
    /* Most activations held at once: a (micro-batch, chunk) counts from its
     * ForwardPass until its BackwardPass; in streams without backward
     * (inference) until its SendActivation, or for the forward itself on
     * the last stage. Interleaved counts chunks (each 1/v of a stage). */
    int peak_live;
    int num_segments;
    dsc_pipe_sim_segment *segments; /* (num_segments), in time order */
} dsc_pipe_sim_stage;

typedef struct dsc_pipe_sim_result {
    int num_stages;
    double makespan;                    /* max over stages of finish */
    double bubble;                      /* mean over stages of 1 - busy/makespan */
    dsc_pipe_sim_stage *stages;         /* (num_stages) */
    dsc_pipe_sim_segment *segment_pool; /* (pool_len): owns every stage's segments */
    size_t pool_len;
} dsc_pipe_sim_result;

/* Simulates stage streams stages[0..num_stages-1], stage i being stage_id i
 * of one pipeline. A send whose peer is waiting on a different message, or
 * streams that block forever, give DSC_ERR_INVALID naming the stages, steps
 * and instructions. */
DSC_API dsc_status dsc_pipe_sim_run(dsc_schedule *const *stages, int num_stages, const dsc_pipe_sim_costs *costs,
                                    dsc_pipe_sim_result *out);
DSC_API void dsc_pipe_sim_free(dsc_pipe_sim_result *result);

/* Closed forms of the whole pipeline for kind/M/P/v under `costs`; exact
 * for the simulator when p2p == 0 (docs/schedules.md derives them). */
typedef struct dsc_pipe_sim_bounds {
    double makespan;
    double bubble;
} dsc_pipe_sim_bounds;
DSC_API dsc_status dsc_pipe_sim_closed_form(dsc_schedule_kind kind, int micro_batches, int stages, int chunks,
                                            const dsc_pipe_sim_costs *costs, dsc_pipe_sim_bounds *out);
/* Closed form of peak_live on stage `stage_id` (always exact). */
DSC_API int dsc_pipe_sim_peak_live_bound(dsc_schedule_kind kind, int micro_batches, int stages, int stage_id,
                                         int chunks);

/* One row per stage, at most max_width columns: 'F'/'B' forward/backward
 * ('f'/'b' on odd model chunks), '.' idle; time is scaled down to fit, and
 * each column shows what fills most of it ('.' when idle half or more). */
DSC_API dsc_status dsc_pipe_sim_print_timeline(const dsc_pipe_sim_result *result, int max_width, FILE *out);
/* The same timeline as an SVG drawing written to `path`. */
DSC_API dsc_status dsc_pipe_sim_write_svg(const dsc_pipe_sim_result *result, const char *title, const char *path);

#ifdef __cplusplus
}
#endif
#endif
