/* pipe/schedule_timeline.c — GPipe and interleaved 1F1B as instruction
 * streams, built from closed-form step grids.
 *
 * Every compute operation of the whole pipeline has a step given by a
 * formula (docs/schedules.md):
 *  - GPipe: the forward of m on stage s at step m+s, its backward at
 *    (M+P-1) + m + (P-1-s): all forwards, then all backwards.
 *  - Interleaved: Megatron's per-rank order in lock-step. Rank r runs its
 *    k-th forward at step k+r and its i-th backward at step W_r+i+r, with
 *    W_r = 2(P-r-1) + (v-1)P its warm-up depth, so a steady step holds one
 *    forward and one backward on every rank. Neighbours exchange once per
 *    step with the same work on both sides, which keeps the makespan at the
 *    closed form for any ratio of forward to backward cost.
 * A message travels in the step of the operation that consumes it, as in
 * DeepSpeed's TrainSchedule, so RecvGrad and BackwardPass share a step and
 * the executor needs one shared gradient buffer. Within a step, messages run
 * in one global order (edge colour, edge, gradient before activation), which
 * makes blocking send/recv deadlock-free. Buffers are assigned by walking
 * the stream: lowest free slot at the first use of a (micro-batch, chunk),
 * freed after its last use (SendGrad, or BackwardPass on virtual stage 0).
 *
 * Dimension letters: M micro-batches, P stages (ranks), v chunks per rank,
 * J = P*v virtual stages; virtual stage j = chunk*P + rank. */
#include <stdlib.h>

#include "dsc/memory.h"
#include "pipe/schedule_internal.h"

typedef struct timeline {
    dsc_schedule_kind kind;
    int M, P, v, J;
    int num_steps;
} timeline;

/* Megatron's order on every rank: micro-batches in groups of P, each group
 * through chunk 0, then chunk 1, ...; backwards through the chunks in
 * reverse. These give the position of (m, chunk) in that order. */
static int forward_index(const timeline *tl, int m, int chunk) {
    return (m / tl->P) * tl->P * tl->v + chunk * tl->P + m % tl->P;
}

static int backward_index(const timeline *tl, int m, int chunk) {
    return forward_index(tl, m, tl->v - 1 - chunk);
}

/* Step of the forward of micro-batch m on virtual stage j. */
static int forward_step(const timeline *tl, int m, int j) {
    const int r = j % tl->P;
    if (tl->kind == DSC_SCHEDULE_GPIPE) return m + r;
    return forward_index(tl, m, j / tl->P) + r;
}

/* Step of its backward. B(m, j-1) on rank r-1 must run one step after
 * B(m, j) on rank r while the rank offset drops by one, hence a warm-up two
 * steps deeper per lower rank: Megatron's 2(P-r-1). */
static int backward_step(const timeline *tl, int m, int j) {
    const int r = j % tl->P;
    if (tl->kind == DSC_SCHEDULE_GPIPE) return (tl->M + tl->P - 1) + m + (tl->P - 1 - r);
    const int warmup = 2 * (tl->P - r - 1) + (tl->v - 1) * tl->P;
    return warmup + backward_index(tl, m, j / tl->P) + r;
}

/* One instruction of this stage with its place in the stream. */
typedef struct event {
    int step;
    int key; /* order inside the step */
    dsc_instr in;
} event;

static int event_cmp(const void *a, const void *b) {
    const event *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
}

/* Messages of a step run in one global order, so a blocking exchange always
 * has a smallest unfinished message whose two ends are both waiting on it.
 * Edge e joins rank e and rank e+1 (mod P). Even edges go before odd ones so
 * that disjoint pairs exchange at once; with odd P the wrap edge P-1 would
 * touch rank 0 twice in colour 0, so it gets a colour of its own. On one edge
 * the gradient (e+1 -> e) goes before the activation (e -> e+1), which also
 * frees a slot by SendGrad before RecvActivation may reuse it. */
static int message_key(int P, int edge, int activation) {
    const int colour = (P % 2 == 1 && edge == P - 1) ? 2 : edge % 2;
    return (colour * P + edge) * 2 + activation;
}

typedef struct emitter {
    const timeline *tl;
    int S;
    event *ev;
    int n;
} emitter;

static void emit(emitter *e, int step, int key, dsc_instr_type type, int m, int chunk, int peer_j) {
    const int peer_stage = peer_j < 0 ? -1 : peer_j % e->tl->P, peer_chunk = peer_j < 0 ? -1 : peer_j / e->tl->P;
    e->ev[e->n++] = (event){step, key, {type, -1, m, chunk, peer_stage, peer_chunk}};
}

static void emit_micro_batch(emitter *e, int m, int c) {
    const timeline *tl = e->tl;
    const int P = tl->P, J = tl->J, j = c * P + e->S;
    /* After the messages: load, then forward, then backward (the last
     * virtual stage runs both on one micro-batch in one step). */
    const int load_key = 6 * P + 1, forward_key = 6 * P + 2, backward_key = 6 * P + 3;
    const int left_edge = (e->S + P - 1) % P, right_edge = e->S;
    const int tf = forward_step(tl, m, j), tb = backward_step(tl, m, j);
    if (j > 0) emit(e, tf, message_key(P, left_edge, 1), DSC_INSTR_RECV_ACTIVATION, m, c, j - 1);
    if (j == 0 || j == J - 1) emit(e, tf, load_key, DSC_INSTR_LOAD_MICRO_BATCH, m, c, -1);
    emit(e, tf, forward_key, DSC_INSTR_FORWARD_PASS, m, c, -1);
    if (j < J - 1) {
        emit(e, forward_step(tl, m, j + 1), message_key(P, right_edge, 1), DSC_INSTR_SEND_ACTIVATION, m, c, j + 1);
        emit(e, tb, message_key(P, right_edge, 0), DSC_INSTR_RECV_GRAD, m, c, j + 1);
    }
    emit(e, tb, backward_key, DSC_INSTR_BACKWARD_PASS, m, c, -1);
    if (j > 0)
        emit(e, backward_step(tl, m, j - 1), message_key(P, left_edge, 0), DSC_INSTR_SEND_GRAD, m, c, j - 1);
}

/* Lowest free slot at the first use of a (micro-batch, chunk); released
 * after its last use: SendGrad reads the inputs' gradient, so it outlives
 * BackwardPass except on virtual stage 0, which sends nothing back. */
static dsc_status assign_buffers(emitter *e, int *num_buffers) {
    const int v = e->tl->v, units = e->tl->M * v;
    int *slot_of = NULL;        /* (M*v): buffer held by (m, c), -1 when none */
    unsigned char *used = NULL; /* (M*v) */
    dsc_status st = NULL;
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&slot_of, units * sizeof *slot_of, DSC_MEM_OTHER, DSC_CPU), done);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&used, units, DSC_MEM_OTHER, DSC_CPU), done);
    for (int u = 0; u < units; u++)
        slot_of[u] = -1;
    *num_buffers = 0;
    for (int i = 0; i < e->n; i++) {
        dsc_instr *in = &e->ev[i].in;
        const int u = in->micro_batch * v + in->chunk;
        if (slot_of[u] < 0) {
            int b = 0;
            while (used[b])
                b++;
            used[b] = 1;
            slot_of[u] = b;
            if (b + 1 > *num_buffers) *num_buffers = b + 1;
        }
        in->buffer = slot_of[u];
        const int first_virtual = in->chunk == 0 && e->S == 0;
        if (in->type == (first_virtual ? DSC_INSTR_BACKWARD_PASS : DSC_INSTR_SEND_GRAD)) used[slot_of[u]] = 0;
    }
done:
    dsc_mem_free(slot_of, units * sizeof *slot_of, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(used, units, DSC_MEM_OTHER, DSC_CPU);
    return st;
}

static dsc_status emit_stage(dsc_schedule *s, const timeline *tl) {
    const int units = tl->M * tl->v;
    const size_t ev_bytes = (size_t)7 * units * sizeof(event);
    emitter e = {tl, s->stage_id, NULL, 0};
    dsc_status st = NULL;
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&e.ev, ev_bytes, DSC_MEM_OTHER, DSC_CPU), done);
    for (int m = 0; m < tl->M; m++)
        for (int c = 0; c < tl->v; c++)
            emit_micro_batch(&e, m, c);
    qsort(e.ev, e.n, sizeof *e.ev, event_cmp);
    DSC_TRY_GOTO(st, assign_buffers(&e, &s->num_buffers), done);
    DSC_TRY_GOTO(st, dsc_sched_reserve(s, tl->num_steps, e.n + 3), done);
    int i = 0;
    for (int t = 0; t < tl->num_steps; t++) {
        for (; i < e.n && e.ev[i].step == t; i++) {
            const dsc_instr *in = &e.ev[i].in;
            dsc_sched_push(s, in->type, in->buffer, in->micro_batch, in->chunk, in->peer_stage, in->peer_chunk);
        }
        if (t == tl->num_steps - 1) dsc_sched_push_batch_end(s, 1);
        dsc_sched_end_step(s);
    }
done:
    dsc_mem_free(e.ev, ev_bytes, DSC_MEM_OTHER, DSC_CPU);
    return st;
}

dsc_status dsc_sched_build_timeline(dsc_schedule *s) {
    const int M = s->micro_batches, P = s->stages, v = s->chunks;
    timeline tl = {s->kind, M, P, v, P * v, 0};
    /* The last operation is stage 0's backward of micro-batch M-1 (for
     * interleaved, chunk 0 of the last group comes last in its order). */
    tl.num_steps = 1 + backward_step(&tl, M - 1, 0);
    return emit_stage(s, &tl);
}
