/* pipe/schedule_internal.h — the layout of a dsc_schedule and the helpers the
 * schedule builders share (private to pipe/schedule*.c and pipe/simulate*.c).
 * It does not decide any instruction: the builders in schedule_deepspeed.c
 * and schedule_timeline.c do. */
#ifndef DSC_PIPE_SCHEDULE_INTERNAL_H
#define DSC_PIPE_SCHEDULE_INTERNAL_H

#include <stddef.h>

#include "dsc/schedule.h"

struct dsc_schedule {
    dsc_schedule_kind kind;
    int micro_batches; /* M */
    int stages;        /* P */
    int stage_id;      /* S */
    int chunks;        /* v */
    int num_steps;
    int num_buffers;
    int *step_start;   /* (num_steps + 1): step t is instrs[step_start[t] .. step_start[t+1]) */
    dsc_instr *instrs; /* (capacity) */
    int count;         /* instructions written so far */
    int capacity;
    int steps_closed; /* steps finished by dsc_sched_end_step */
};

/* Sizes the step table for `num_steps` steps and room for `capacity` instructions. */
dsc_status dsc_sched_reserve(dsc_schedule *s, int num_steps, int capacity);
/* Appends one instruction to the step being written. */
void dsc_sched_push(dsc_schedule *s, dsc_instr_type type, int buffer, int micro_batch, int chunk, int peer_stage,
                    int peer_chunk);
/* Appends the batch-end instructions: ReduceTiedGrads (when `tied`), ReduceGrads, OptimizerStep. */
void dsc_sched_push_batch_end(dsc_schedule *s, int tied);
/* Closes the step being written; the next push starts the following step. */
void dsc_sched_end_step(dsc_schedule *s);

/* DeepSpeed's TrainSchedule, InferenceSchedule and DataParallelSchedule. */
dsc_status dsc_sched_build_deepspeed(dsc_schedule *s);
/* GPipe and interleaved 1F1B from a whole-pipeline timeline. */
dsc_status dsc_sched_build_timeline(dsc_schedule *s);

#endif
