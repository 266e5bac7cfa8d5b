/* zero/zero_internal.h — the sharded optimizer's state, shared by its files:
 * partition.c (ranges, pieces, collectives over flat ranges), gather.c
 * (stage 3's pool of gathered parameters) and zero_optimizer.c (the ops).
 *
 * Dimension letters: N ranks of a group, Ψ elements of a group's flat buffer. */
#ifndef DSC_ZERO_INTERNAL_H
#define DSC_ZERO_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/zero.h"

/* Parameters start at multiples of this many elements in the store (dsc/nn.h). */
#define ZERO_ALIGN_ELEMS 64

/* Most elements a stage 1/2 all-gather in gather_dtype moves in one call: the size of its 2-byte receive
 * buffer (16 MiB). */
#define ZERO_NARROW_GATHER_MAX ((int64_t)1 << 23)

/* One parameter's share of a rank's range. */
typedef struct zero_piece {
    dsc_param *param;
    int64_t param_offset; /* element offset inside the parameter */
    int64_t pos;          /* element offset inside the rank's range */
    int64_t numel;
    int64_t pos2; /* element offset inside the rank's second state (exp_avg_sq); -1: the piece has none (Muon) */
} zero_piece;

/* A parameter group (dense or expert) partitioned over its communicator. */
typedef struct zero_group {
    dsc_param_group id;
    dsc_comm *comm; /* NULL: one rank */
    int size, rank;
    int64_t numel;   /* Ψ: flat length, gaps included */
    int64_t *bounds; /* [size + 1]: rank r owns [bounds[r], bounds[r + 1]) (flat layout) */
    int64_t begin, end;
    bool split;  /* stage 3: every parameter split over the ranks (dsc_zero_param_piece) instead of the flat cut */
    int64_t len; /* elements this rank owns: end - begin, or the sum of its pieces when split */
    int *piece_of; /* [n_params] split: index of each parameter's piece in `pieces`, -1 when empty or elsewhere */
    dsc_tensor values;   /* (len): own buffer in stage 3, else a view of the store's flat values */
    dsc_tensor grads;    /* (len): own buffer in stages 2 and 3, else a view of the store's flat grads */
    dsc_tensor state[2]; /* (len), (len2): exp_avg, exp_avg_sq (momentum_buffer alone for SGD) */
    int64_t len2;        /* elements of state[1]: len, or for Muon those of the pieces outside its matrices */
    int n_second;        /* pieces with a second state */
    zero_piece *pieces;
    int n_pieces;
} zero_group;

/* A contiguous flat range of one group that a layer reads. */
typedef struct zero_run {
    dsc_param_group group;
    int64_t begin, end; /* in the group's flat buffer */
    int64_t at;         /* where the run starts in the layer's staging / gathered layout */
} zero_run;

/* A layer's parameters as runs, and where each parameter sits in the layer's
 * contiguous layout (staging gradients in stages 2/3, gathered values in 3). */
typedef struct zero_layer {
    dsc_layer *layer;
    zero_run *runs;
    int n_runs;
    int64_t numel;              /* layout length: the runs back to back */
    int64_t *param_at;          /* [layer->n_params] position of each parameter in the layout */
    int *param_index;           /* [layer->n_params] index in the store */
    bool live;                  /* stage 3: gathered into the pool */
    int64_t pool_at;            /* stage 3: where in the pool, when live */
    int64_t pool_numel;         /* stage 3: pool elements it needs (its parameters that are not persistent) */
    int64_t *pool_param_at;     /* [layer->n_params] stage 3: position in its pool segment; -1 when persistent */
    dsc_comm_request **gathers; /* [layer->n_params] stage 3: all-gathers of its prefetch still in flight */
    bool unwidened;             /* stage 3: a prefetch's values still packed in gather_dtype (until settled) */
} zero_layer;

typedef struct zero_bucket {
    dsc_param_group group;
    int64_t begin, end;
    int params;  /* parameters overlapping the range */
    int pending; /* of those, not yet final in this batch; -1 once reduced or posted */
    bool packed; /* reduced packed in reduce_dtype and in flight: its share is unpacked after the wait */
} zero_bucket;

/* A staged reduce-scatter posted: where this rank's share arrives and where it is added. */
typedef struct zero_staged_op {
    float *recv, *dst;
    int64_t n;
} zero_staged_op;

/* A staging slot (staged.c): one layer's gradients during its backward and its reductions in flight. */
typedef struct zero_slot {
    dsc_tensor staging;      /* (largest layer layout) */
    dsc_tensor recv;         /* (largest layer share of this rank) */
    zero_staged_op *ops;     /* [most reductions of a layer] posted, in order */
    dsc_comm_request **reqs; /* [same] their requests */
    int n_ops;
} zero_slot;

typedef struct zero_optimizer {
    dsc_optimizer base;
    dsc_optimizer_options o;
    dsc_zero_options z;
    bool full_grads; /* stage 1, or stage 2 under a pipeline: the store's gradient buffers stay */
    bool deferred;   /* under a pipeline: reduce only in reduce_grads, after tied reduction */
    dsc_device device;
    int n_params;
    int n_state_kinds;
    int64_t step;
    zero_group groups[DSC_PARAM_GROUP_COUNT];
    zero_layer *layers;
    int n_layers;
    /* full-gradient reduction (stage 1): buckets reduced once all their parameters are final */
    zero_bucket *buckets;
    dsc_comm_request **reqs; /* [n_buckets] overlap_comm: each bucket's reduce-scatter in flight */
    int n_buckets;
    int *uses, *uses_left;           /* [n_params] layers reading each parameter; not yet reported */
    int *first_bucket, *last_bucket; /* [n_params] */
    zero_slot slots[2];              /* stages 2/3: staged gradients (two with overlap_comm, used in turn) */
    int n_slots, next_slot;
    dsc_tensor pool; /* (pool capacity) stage 3: gathered parameters of live layers */
    /* stage 3 persistence: parameters of at most stage3_param_persistence_threshold elements stay whole */
    bool *persistent;    /* [n_params] */
    int64_t *persist_at; /* [n_params] where a persistent parameter's value sits in `persist` */
    dsc_tensor persist;  /* (their aligned sizes back to back) the whole values of persistent parameters */
    bool persist_stale;  /* their pieces may have been written (a checkpoint restore): gather before use */
    dsc_tensor gather16; /* (largest stage 1/2 gather chunk) in gather_dtype: the shares all-gathered there */
} zero_optimizer;

/* ---- partition.c ---- */
dsc_status zero_group_init(zero_optimizer *z, zero_group *g, dsc_param_group id, dsc_comm *comm, bool split);
void zero_group_free(zero_group *g);
/* Elements of [a, b) owned by `rank`. */
int64_t zero_owned(const zero_group *g, int rank, int64_t a, int64_t b);
/* The runs and layout of every layer. */
dsc_status zero_layers_init(zero_optimizer *z);
void zero_layers_free(zero_optimizer *z);
int zero_layer_find(const zero_optimizer *z, const dsc_layer *layer);
/* Full gradients: posts the in-place reduce-scatter (averaging over the
 * group) of flat range [a, b) (src: the store's buffer from a, which holds
 * g->grads) as one request; *req is NULL on one rank. */
/* After the wait of a packed (reduce_dtype bf16 / fp16) zero_ireduce_scatter_full: widens this rank's
 * share of [a, b) back to f32 in place. */
void zero_unpack_full_share(zero_optimizer *z, zero_group *g, float *src, int64_t a, int64_t b);
dsc_status zero_ireduce_scatter_full(zero_optimizer *z, zero_group *g, float *src, int64_t a, int64_t b,
                                     dsc_comm_request **req);
/* All-gathers flat range [a, b) of the group's values into dst (b - a
 * elements), each rank sending its share from g->values (in place when
 * g->values is a view of dst's buffer). */
dsc_status zero_all_gather(zero_optimizer *z, zero_group *g, float *dst, int64_t a, int64_t b);
/* Whether the group's parameters are all-gathered in the 2-byte gather_dtype (dsc/optimizer.h). */
bool zero_gathers_narrow(const zero_optimizer *z, const zero_group *g);
/* Elements of a group that stages 1 and 2 all-gather in one call: allgather_bucket_size, at most
 * ZERO_NARROW_GATHER_MAX in gather_dtype. */
int64_t zero_gather_chunk(const zero_optimizer *z, const zero_group *g);

/* Staged gradients: posts the reduce-scatters (averaging) of `src`, the
 * staged values of flat range [a, b), in chunks of at most `chunk` elements
 * (stage 2), or of one parameter's whole gradient (stage 3, store index
 * `index`), this rank's shares arriving at *recv (advanced past them) and
 * recorded in `slot` for adding to g->grads; on one rank the share is added
 * at once. */
dsc_status zero_post_staged_range(zero_optimizer *z, zero_group *g, float *src, int64_t a, int64_t b,
                                  int64_t chunk, float **recv, zero_slot *slot);
dsc_status zero_post_staged_param(zero_optimizer *z, zero_group *g, int index, float *src, float **recv,
                                  zero_slot *slot);
/* Split layout: all-gathers one parameter's value into dst from every rank's piece. */
dsc_status zero_all_gather_param(zero_optimizer *z, zero_group *g, int index, float *dst);
/* The same all-gather posted; *req is NULL when nothing is in flight (one rank). In gather_dtype the values
 * arrive packed in dst's upper half: zero_widen_gathered after the wait, once, makes them f32. */
dsc_status zero_iall_gather_param(zero_optimizer *z, zero_group *g, int index, float *dst, dsc_comm_request **req);
void zero_widen_gathered(zero_optimizer *z, zero_group *g, int index, float *dst);

/* ---- staged.c (stages 2, 3 without a pipeline) ---- */
dsc_status zero_staged_init(zero_optimizer *z);
void zero_staged_free(zero_optimizer *z);
/* Before a layer's backward: settles the slot it will use, zeroes it, points the gradient views into it. */
dsc_status zero_staged_begin(zero_optimizer *z, int layer);
/* After it: posts the layer's reduce-scatters (settled at once without overlap_comm). */
dsc_status zero_staged_post(zero_optimizer *z, int layer);
/* Tests the reductions in flight. */
dsc_status zero_staged_progress(zero_optimizer *z);
/* Settles every slot, oldest first (reduce_grads). */
dsc_status zero_staged_finish(zero_optimizer *z);

/* ---- gather.c (stage 3) ---- */
dsc_status zero_pool_init(zero_optimizer *z);
/* Marks the parameters at or below the persistence threshold and gives them
 * their whole values (copied from the store: call before it is released). */
dsc_status zero_persist_init(zero_optimizer *z);
/* All-gathers every persistent parameter's value from the ranks' pieces. */
dsc_status zero_persist_refresh(zero_optimizer *z);
dsc_status zero_gather_before(zero_optimizer *z, int layer, bool backward);
dsc_status zero_gather_release(zero_optimizer *z, int layer);
/* Tests the prefetches in flight (they move on only while tested); every layer hook calls it. */
dsc_status zero_gather_progress(zero_optimizer *z);

#endif
