/* Private to pipe/: the executor's state, shared by pipe/engine.c (the
 * instruction handlers) and pipe/engine_chunk.c (running a chunk's layers). */
#ifndef DSC_PIPE_ENGINE_INTERNAL_H
#define DSC_PIPE_ENGINE_INTERNAL_H

#include "dsc/pipe.h"
#include "pipe/p2p.h"

/* A run of a chunk's layers; a checkpointed run keeps only its input per
 * slot and recomputes its layers (reserved with one slot) in backward. */
typedef struct pipe_segment {
    int first, end; /* layers [first, end) of the chunk */
    bool checkpoint;
    dsc_tensor *saved; /* [n_slots] (B, T, C) input storage, checkpointed runs only: f32, or under
                          mixed precision on the CPU its 2-byte type (the values are exact in it) */
    dsc_tensor *input; /* [n_slots] views of saved with the input's shape */
} pipe_segment;

typedef struct pipe_chunk {
    dsc_layer *const *layers; /* [n] forward order */
    int n;
    pipe_segment *segs;
    int n_segs;
    bool first_virtual; /* virtual stage 0: the embedding reads tokens */
    bool last_virtual;  /* the last virtual stage: the loss layer reads targets */
    int backwards;      /* backward passes run in this batch */
} pipe_chunk;

/* One pipeline buffer: the (micro-batch, chunk) occupying it. */
typedef struct pipe_slot {
    dsc_tensor tokens, targets; /* (B, T) i32, from LoadMicroBatch */
    dsc_tensor input_buf;       /* (B, T, C) receive buffer */
    dsc_tensor input;           /* view of input_buf with the received shape */
    dsc_tensor output;          /* the chunk's output (a layer's view, or output_copy) */
    dsc_tensor output_copy;     /* (B, T, C) when the chunk ends in a checkpointed run */
    dsc_tensor din;             /* gradient of the input (a layer's view, or din_copy) */
    dsc_tensor din_copy;        /* (B, T, C) when the chunk starts with a checkpointed run */
} pipe_slot;

typedef struct pipe_runner {
    dsc_batch_runner base;
    dsc_pipe_runner_options o;
    int P, v, stage;
    pipe_chunk *chunks; /* [v] */
    pipe_slot *slots;   /* [n_slots] */
    int n_slots;
    dsc_tensor grad_buf; /* (B, T, C) DeepSpeed's grad_layer */
    dsc_dtype stash;     /* what checkpointed inputs are kept and stages exchange (f32, or mixed
                            precision's bf16 / fp16 on the CPU) */
    /* (B, T, C) f32 where stash is 2-byte: inside a backward, a checkpointed input widened for its
     * run's recompute; between compute instructions, its lower half receives and its upper half
     * sends in the 2-byte type (one send in flight: the next waits for it) */
    dsc_tensor scratch;
    dsc_tensor grad_in; /* view of grad_buf: the gradient received for this step's backward */
    pipe_p2p *p2p;
    /* the batch being run */
    dsc_batch_source *data;
    bool training, batch_ended;
    int M;
    double loss_sum, aux_sum;
    int64_t tokens;
    dsc_pipe_runner_stats stats;
    double phase_s[DSC_PHASE_COUNT]; /* this batch's seconds per phase, by instruction type */
} pipe_runner;

/* Chunks, segments, slots and receive buffers; reserves the layers. */
dsc_status pipe_runner_alloc_buffers(pipe_runner *r);
void pipe_runner_free_buffers(pipe_runner *r);

/* Forward of the micro-batch in `slot` through chunk c; sets the slot's output. */
dsc_status pipe_chunk_forward(pipe_runner *r, pipe_chunk *c, int slot, dsc_micro_ctx *ctx);
/* Backward from dout (NULL on the last virtual stage, whose loss layer seeds
 * itself); sets the slot's din; `last` reports the layers' gradients final. */
dsc_status pipe_chunk_backward(pipe_runner *r, pipe_chunk *c, int slot, const dsc_tensor *dout, bool last,
                               dsc_micro_ctx *ctx);

#endif
