/* dsc/schedule.h — pipeline schedules as pure instruction streams.
 *
 * A schedule belongs to one pipeline stage: for (micro_batches M, stages P,
 * stage_id S[, chunks v]) it is a list of steps, each an ordered, possibly
 * empty list of instructions. An executor runs the steps in order and each
 * instruction in order; send/recv block. Every send meets its matching recv
 * on the peer in the same step index, and within a step all ranks handle
 * their messages in one global order, so the streams cannot deadlock even
 * though no barrier separates steps.
 *
 * Train (synchronous 1F1B), inference and data-parallel streams are
 * DeepSpeed's exactly (steps, instruction order, buffer ids, buffer counts);
 * GPipe and interleaved 1F1B are dsc's own, built on the same step rules.
 * docs/schedules.md gives every rule. This header knows nothing of tensors,
 * ranks or MPI. */
#ifndef DSC_SCHEDULE_H
#define DSC_SCHEDULE_H

#include "dsc/api.h"
#include <stdio.h>

#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_instr_type {
    DSC_INSTR_LOAD_MICRO_BATCH = 0, /* first stage: inputs; last stage: labels */
    DSC_INSTR_FORWARD_PASS,
    DSC_INSTR_BACKWARD_PASS,
    DSC_INSTR_SEND_ACTIVATION,   /* outputs of (micro_batch, chunk) to the next virtual stage */
    DSC_INSTR_RECV_ACTIVATION,   /* inputs of (micro_batch, chunk) from the previous one */
    DSC_INSTR_SEND_GRAD,         /* gradient of the inputs to the previous virtual stage */
    DSC_INSTR_RECV_GRAD,         /* gradient of the outputs from the next virtual stage */
    DSC_INSTR_REDUCE_TIED_GRADS, /* batch end, no buffer */
    DSC_INSTR_REDUCE_GRADS,      /* batch end, no buffer */
    DSC_INSTR_OPTIMIZER_STEP,    /* batch end, no buffer */
    DSC_INSTR_TYPE_COUNT
} dsc_instr_type;

/* One instruction. Batch-end instructions have buffer, micro_batch, chunk,
 * peer_stage and peer_chunk all -1. Instructions that do not communicate
 * have peer_stage = peer_chunk = -1. */
typedef struct dsc_instr {
    dsc_instr_type type;
    int buffer;      /* pipeline buffer slot, 0..num_buffers-1 */
    int micro_batch; /* 0..M-1 */
    int chunk;       /* local model chunk 0..v-1 (virtual stage chunk*P + S); 0 unless interleaved */
    int peer_stage;  /* send/recv: the stage on the other end */
    int peer_chunk;  /* send/recv: the model chunk on the other end */
} dsc_instr;

typedef enum dsc_schedule_kind {
    DSC_SCHEDULE_TRAIN_1F1B = 0, /* DeepSpeed TrainSchedule (PipeDream-Flush) */
    DSC_SCHEDULE_INFERENCE,      /* DeepSpeed InferenceSchedule */
    DSC_SCHEDULE_DATA_PARALLEL,  /* DeepSpeed DataParallelSchedule (one stage, gradient accumulation) */
    DSC_SCHEDULE_GPIPE,          /* all forwards, then all backwards */
    DSC_SCHEDULE_INTERLEAVED,    /* Megatron interleaved 1F1B, v chunks per stage */
    DSC_SCHEDULE_KIND_COUNT
} dsc_schedule_kind;

typedef struct dsc_schedule dsc_schedule;

/* Builds the stream of stage `stage_id`. `chunks` (v) must be 1 except for
 * DSC_SCHEDULE_INTERLEAVED, which needs v >= 2, stages >= 2 and
 * micro_batches a multiple of stages. Bad arguments give DSC_ERR_INVALID
 * naming the numbers. */
DSC_API dsc_status dsc_schedule_create(dsc_schedule_kind kind, int micro_batches, int stages, int stage_id,
                                       int chunks, dsc_schedule **out);
DSC_API void dsc_schedule_destroy(dsc_schedule *sched);

DSC_API dsc_schedule_kind dsc_schedule_get_kind(const dsc_schedule *sched);
DSC_API int dsc_schedule_micro_batches(const dsc_schedule *sched);
DSC_API int dsc_schedule_stages(const dsc_schedule *sched);
DSC_API int dsc_schedule_stage_id(const dsc_schedule *sched);
DSC_API int dsc_schedule_chunks(const dsc_schedule *sched);

/* Number of steps; the same on every stage of one pipeline. */
DSC_API int dsc_schedule_num_steps(const dsc_schedule *sched);
/* The instructions of step `t` and their count; NULL and 0 when t is not in [0, num_steps). */
DSC_API const dsc_instr *dsc_schedule_step(const dsc_schedule *sched, int t, int *count);
/* Buffer slots the executor must provide (DeepSpeed's num_pipe_buffers). */
DSC_API int dsc_schedule_num_buffers(const dsc_schedule *sched);

/* Writes the canonical text form: "step <t>:" then " Name(buf=<b>)" per
 * buffer instruction and " Name()" per batch-end instruction, one line per step. */
DSC_API dsc_status dsc_schedule_print(const dsc_schedule *sched, FILE *out);

DSC_API const char *dsc_instr_name(dsc_instr_type type); /* "ForwardPass" */
DSC_API const char *
dsc_schedule_kind_name(dsc_schedule_kind kind); /* "train", "infer", "dp", "gpipe", "interleaved" */
DSC_API dsc_status dsc_schedule_kind_from_name(const char *name, dsc_schedule_kind *out);

#ifdef __cplusplus
}
#endif
#endif
