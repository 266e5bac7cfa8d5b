/* pipe/schedule_timeline.c — GPipe and interleaved 1F1B as instruction
 * streams, built from a whole-pipeline timeline.
 *
 * Each rank has a fixed order of compute operations (GPipe: all forwards,
 * then all backwards; interleaved: Megatron's warm-up / 1F1B / cool-down over
 * v model chunks). Every operation is placed in the earliest step after its
 * producer's step and after the rank's previous operation. A message travels
 * in the step of the operation that consumes it, as in DeepSpeed's
 * TrainSchedule, so RecvGrad and BackwardPass share a step and the executor
 * needs one shared gradient buffer. Within a step, messages run in one global
 * order (edge colour, edge, gradient before activation), which makes
 * blocking send/recv deadlock-free. Buffers are assigned by walking the
 * stream: lowest free slot at the first use of a (micro-batch, chunk), freed
 * after its last use (SendGrad, or BackwardPass on virtual stage 0).
 *
 * Dimension letters: M micro-batches, P stages (ranks), v chunks per rank,
 * J = P*v virtual stages; virtual stage j = chunk*P + rank. */
#include <stdlib.h>

#include "dsc/memory.h"
#include "pipe/schedule_internal.h"

typedef struct timeline {
    int M, P, v, J;
    int ops;     /* compute operations per rank: 2*M*v */
    int *slot_f; /* (M, J): step of the forward of micro-batch m on virtual stage j */
    int *slot_b; /* (M, J): step of its backward */
    int num_steps;
} timeline;

typedef struct op {
    int backward;
    int micro_batch;
    int chunk;
} op;

/* Megatron's forward/backward sequence on one rank: micro-batches go in
 * groups of P, each group through chunk 0, then chunk 1, ... (backwards
 * through the chunks in reverse). Warm-up (P-r-1)*2 + (v-1)*P forwards, then
 * one forward and one backward alternately, then the remaining backwards. */
static op interleaved_op(const timeline *tl, int rank, int idx) {
    const int n = tl->M * tl->v, group = tl->P * tl->v;
    int warmup = (tl->P - rank - 1) * 2 + (tl->v - 1) * tl->P;
    if (warmup > n) warmup = n;
    int backward, k;
    if (idx < warmup) {
        backward = 0, k = idx;
    } else if (idx < 2 * n - warmup) {
        backward = (idx - warmup) % 2, k = backward ? (idx - warmup) / 2 : warmup + (idx - warmup) / 2;
    } else {
        backward = 1, k = idx - n;
    }
    const int c = (k % group) / tl->P;
    return (op){backward, (k / group) * tl->P + k % tl->P, backward ? tl->v - 1 - c : c};
}

static op rank_op(const timeline *tl, dsc_schedule_kind kind, int rank, int idx) {
    if (kind == DSC_SCHEDULE_INTERLEAVED) return interleaved_op(tl, rank, idx);
    return idx < tl->M ? (op){0, idx, 0} : (op){1, idx - tl->M, 0};
}

/* Places every operation at its earliest step. A queue of ranks to advance
 * keeps this O(total operations): a rank is queued again only when one of
 * its inputs has just been placed. */
static dsc_status place_operations(timeline *tl, dsc_schedule_kind kind) {
    const int P = tl->P, J = tl->J;
    dsc_status st = NULL;
    int *cursor = NULL, *free_at = NULL, *queue = NULL;
    const size_t queue_len = (size_t)P + (size_t)P * tl->ops;
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&cursor, P * sizeof *cursor, DSC_MEM_OTHER, DSC_CPU), done);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&free_at, P * sizeof *free_at, DSC_MEM_OTHER, DSC_CPU), done);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&queue, queue_len * sizeof *queue, DSC_MEM_OTHER, DSC_CPU), done);
    size_t head = 0, tail = 0;
    for (int r = 0; r < P; r++) queue[tail++] = r;
    while (head < tail) {
        const int r = queue[head++];
        while (cursor[r] < tl->ops) {
            const op o = rank_op(tl, kind, r, cursor[r]);
            const int j = o.chunk * P + r, at = o.micro_batch * J + j;
            int dep;
            if (!o.backward)
                dep = j > 0 ? tl->slot_f[at - 1] : -2;
            else
                dep = j < J - 1 ? tl->slot_b[at + 1] : tl->slot_f[at];
            if (dep == -1) break; /* the input is not produced yet; -2 means no input */
            const int t = free_at[r] > dep + 1 ? free_at[r] : dep + 1;
            (o.backward ? tl->slot_b : tl->slot_f)[at] = t;
            free_at[r] = t + 1;
            if (t + 1 > tl->num_steps) tl->num_steps = t + 1;
            cursor[r]++;
            if (!o.backward && j < J - 1) queue[tail++] = (j + 1) % P;
            if (o.backward && j > 0) queue[tail++] = (j - 1) % P;
        }
    }
    for (int r = 0; r < P; r++)
        if (cursor[r] < tl->ops) {
            st = dsc_error(DSC_ERR_INTERNAL, "operation order stalls on stage %d at operation %d", r, cursor[r]);
            break;
        }
done:
    dsc_mem_free(cursor, P * sizeof *cursor, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(free_at, P * sizeof *free_at, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(queue, queue_len * sizeof *queue, DSC_MEM_OTHER, DSC_CPU);
    return st;
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
    const int P = tl->P, J = tl->J, j = c * P + e->S, at = m * J + j;
    const int load_key = 6 * P + 1, compute_key = 6 * P + 2;
    const int left_edge = (e->S + P - 1) % P, right_edge = e->S;
    const int tf = tl->slot_f[at], tb = tl->slot_b[at];
    if (j > 0) emit(e, tf, message_key(P, left_edge, 1), DSC_INSTR_RECV_ACTIVATION, m, c, j - 1);
    if (j == 0 || j == J - 1) emit(e, tf, load_key, DSC_INSTR_LOAD_MICRO_BATCH, m, c, -1);
    emit(e, tf, compute_key, DSC_INSTR_FORWARD_PASS, m, c, -1);
    if (j < J - 1) {
        emit(e, tl->slot_f[at + 1], message_key(P, right_edge, 1), DSC_INSTR_SEND_ACTIVATION, m, c, j + 1);
        emit(e, tb, message_key(P, right_edge, 0), DSC_INSTR_RECV_GRAD, m, c, j + 1);
    }
    emit(e, tb, compute_key, DSC_INSTR_BACKWARD_PASS, m, c, -1);
    if (j > 0) emit(e, tl->slot_b[at - 1], message_key(P, left_edge, 0), DSC_INSTR_SEND_GRAD, m, c, j - 1);
}

/* Lowest free slot at the first use of a (micro-batch, chunk); released
 * after its last use: SendGrad reads the inputs' gradient, so it outlives
 * BackwardPass except on virtual stage 0, which sends nothing back. */
static dsc_status assign_buffers(emitter *e, int *num_buffers) {
    const int v = e->tl->v, units = e->tl->M * v;
    int *slot_of = NULL; /* (M*v): buffer held by (m, c), -1 when none */
    unsigned char *used = NULL; /* (M*v) */
    dsc_status st = NULL;
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&slot_of, units * sizeof *slot_of, DSC_MEM_OTHER, DSC_CPU), done);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&used, units, DSC_MEM_OTHER, DSC_CPU), done);
    for (int u = 0; u < units; u++) slot_of[u] = -1;
    *num_buffers = 0;
    for (int i = 0; i < e->n; i++) {
        dsc_instr *in = &e->ev[i].in;
        const int u = in->micro_batch * v + in->chunk;
        if (slot_of[u] < 0) {
            int b = 0;
            while (used[b]) b++;
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
        for (int c = 0; c < tl->v; c++) emit_micro_batch(&e, m, c);
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
    timeline tl = {s->micro_batches, s->stages, s->chunks, s->stages * s->chunks, 2 * s->micro_batches * s->chunks,
                   NULL, NULL, 0};
    const size_t slots = (size_t)tl.M * tl.J, bytes = slots * sizeof(int);
    dsc_status st = NULL;
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&tl.slot_f, bytes, DSC_MEM_OTHER, DSC_CPU), done);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&tl.slot_b, bytes, DSC_MEM_OTHER, DSC_CPU), done);
    for (size_t i = 0; i < slots; i++) tl.slot_f[i] = tl.slot_b[i] = -1;
    DSC_TRY_GOTO(st, place_operations(&tl, s->kind), done);
    st = emit_stage(s, &tl);
done:
    dsc_mem_free(tl.slot_f, bytes, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(tl.slot_b, bytes, DSC_MEM_OTHER, DSC_CPU);
    return st;
}
