/* pipe/simulate.c — event simulation of a whole pipeline's instruction
 * streams under a cost model, and the closed forms it is checked against.
 *
 * Each stage runs its stream until it reaches a send or recv; a message
 * completes when both ends have posted it (rendezvous), at
 * max(post times) + p2p on both clocks. A stage is resumed only when its
 * peer completes the message it waits on, so every instruction is handled
 * once: O(total instructions). Drawing lives in simulate_render.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dsc/memory.h"
#include "dsc/pipe_sim.h"
#include "pipe/schedule_internal.h"

typedef struct runner {
    const dsc_schedule *sched;
    int pc;      /* next instruction (index into sched->instrs) */
    int blocked; /* waiting at instrs[pc], a send or recv */
    double clock;
    int live;
} runner;

static int is_comm(dsc_instr_type t) {
    return t == DSC_INSTR_SEND_ACTIVATION || t == DSC_INSTR_RECV_ACTIVATION || t == DSC_INSTR_SEND_GRAD ||
           t == DSC_INSTR_RECV_GRAD;
}

static dsc_instr_type counterpart(dsc_instr_type t) {
    switch (t) {
    case DSC_INSTR_SEND_ACTIVATION:
        return DSC_INSTR_RECV_ACTIVATION;
    case DSC_INSTR_RECV_ACTIVATION:
        return DSC_INSTR_SEND_ACTIVATION;
    case DSC_INSTR_SEND_GRAD:
        return DSC_INSTR_RECV_GRAD;
    default:
        return DSC_INSTR_SEND_GRAD;
    }
}

static int step_of(const dsc_schedule *s, int pc) {
    int lo = 0, hi = s->num_steps - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (s->step_start[mid] <= pc)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void describe(const runner *r, char *buf, size_t len) {
    const dsc_instr *in = &r->sched->instrs[r->pc];
    snprintf(buf, len, "stage %d step %d %s(buf=%d, micro_batch=%d, chunk=%d, peer %d)", r->sched->stage_id,
             step_of(r->sched, r->pc), dsc_instr_name(in->type), in->buffer, in->micro_batch, in->chunk,
             in->peer_stage);
}

static int matches(const dsc_instr *a, int a_stage, const dsc_instr *b, int b_stage) {
    return b->type == counterpart(a->type) && a->micro_batch == b->micro_batch && a->peer_stage == b_stage &&
           b->peer_stage == a_stage && a->peer_chunk == b->chunk && b->peer_chunk == a->chunk;
}

/* Releases an activation that is no longer held (see peak_live in pipe_sim.h). */
static void track_live(runner *r, dsc_pipe_sim_stage *st, const dsc_instr *in) {
    const int inference = r->sched->kind == DSC_SCHEDULE_INFERENCE;
    if (in->type == DSC_INSTR_FORWARD_PASS) {
        if (++r->live > st->peak_live) st->peak_live = r->live;
        if (inference && r->sched->stage_id == r->sched->stages - 1) r->live--;
    } else if (in->type == DSC_INSTR_BACKWARD_PASS || (inference && in->type == DSC_INSTR_SEND_ACTIVATION)) {
        r->live--;
    }
}

/* Advances stage `i` until it blocks or ends; pushes the peer it unblocks. */
static dsc_status advance(runner *rs, int i, const dsc_pipe_sim_costs *costs, dsc_pipe_sim_result *res, int *queue,
                          int *tail) {
    runner *r = &rs[i];
    dsc_pipe_sim_stage *st = &res->stages[i];
    const double scale = 1.0 / r->sched->chunks;
    while (r->pc < r->sched->count) {
        const dsc_instr *in = &r->sched->instrs[r->pc];
        if (in->type == DSC_INSTR_FORWARD_PASS || in->type == DSC_INSTR_BACKWARD_PASS) {
            const int backward = in->type == DSC_INSTR_BACKWARD_PASS;
            const double cost = (backward ? costs->backward : costs->forward) * scale;
            st->segments[st->num_segments++] =
                (dsc_pipe_sim_segment){r->clock, r->clock + cost, backward, in->micro_batch, in->chunk};
            r->clock += cost;
            st->busy += cost;
        } else if (is_comm(in->type)) {
            const int p = in->peer_stage;
            char a[160], b[160];
            if (p < 0 || p >= res->num_stages || p == i) {
                describe(r, a, sizeof a);
                return dsc_error(DSC_ERR_INVALID, "%s: peer stage is not another stage of %d", a, res->num_stages);
            }
            runner *q = &rs[p];
            const dsc_instr *other = q->blocked ? &q->sched->instrs[q->pc] : NULL;
            if (!other || other->peer_stage != i) {
                r->blocked = 1;
                return NULL;
            }
            if (!matches(in, i, other, p)) {
                describe(r, a, sizeof a);
                describe(q, b, sizeof b);
                return dsc_error(DSC_ERR_INVALID, "mismatched message: %s meets %s", a, b);
            }
            const double done = fmax(r->clock, q->clock) + costs->p2p;
            r->clock = q->clock = done;
            track_live(q, &res->stages[p], other);
            q->pc++;
            q->blocked = 0;
            queue[(*tail)++] = p;
        }
        track_live(r, st, in);
        r->pc++;
    }
    return NULL;
}

static dsc_status deadlock_error(const runner *rs, int n) {
    char msg[640] = "", one[160];
    int shown = 0;
    for (int i = 0; i < n && shown < 3; i++) {
        if (!rs[i].blocked) continue;
        describe(&rs[i], one, sizeof one);
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%s%s", shown++ ? "; " : "", one);
    }
    return dsc_error(DSC_ERR_INVALID, "deadlock: every unfinished stage waits on a message (%s)", msg);
}

static dsc_status check_inputs(dsc_schedule *const *stages, int n, const dsc_pipe_sim_costs *c) {
    DSC_CHECK(n >= 1, DSC_ERR_INVALID, "simulation needs at least one stage, got %d", n);
    DSC_CHECK(isfinite(c->forward) && isfinite(c->backward) && isfinite(c->p2p) && c->forward >= 0 &&
                  c->backward >= 0 && c->p2p >= 0,
              DSC_ERR_INVALID, "costs must be finite and >= 0 (forward %g, backward %g, p2p %g)", c->forward,
              c->backward, c->p2p);
    for (int i = 0; i < n; i++)
        DSC_CHECK(stages[i]->stage_id == i && stages[i]->stages == n, DSC_ERR_INVALID,
                  "simulation slot %d holds stage %d of %d, expected stage %d of %d", i, stages[i]->stage_id,
                  stages[i]->stages, i, n);
    return NULL;
}

dsc_status dsc_pipe_sim_run(dsc_schedule *const *stages, int n, const dsc_pipe_sim_costs *costs,
                            dsc_pipe_sim_result *out) {
    *out = (dsc_pipe_sim_result){0};
    DSC_TRY(check_inputs(stages, n, costs));
    runner *rs = NULL;
    int *queue = NULL; /* each stage once at start, then once per completed message */
    size_t queue_len = n;
    for (int i = 0; i < n; i++)
        queue_len += stages[i]->count;
    dsc_status st = NULL;
    out->num_stages = n;
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&out->stages, n * sizeof *out->stages, DSC_MEM_OTHER, DSC_CPU), fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&rs, n * sizeof *rs, DSC_MEM_OTHER, DSC_CPU), fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&queue, queue_len * sizeof *queue, DSC_MEM_OTHER, DSC_CPU), fail);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < stages[i]->count; k++)
            out->pool_len += stages[i]->instrs[k].type == DSC_INSTR_FORWARD_PASS ||
                             stages[i]->instrs[k].type == DSC_INSTR_BACKWARD_PASS;
    DSC_TRY_GOTO(st,
                 dsc_mem_alloc((void **)&out->segment_pool, out->pool_len * sizeof *out->segment_pool,
                               DSC_MEM_OTHER, DSC_CPU),
                 fail);
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        out->stages[i].segments = out->segment_pool + used;
        for (int k = 0; k < stages[i]->count; k++)
            used += stages[i]->instrs[k].type == DSC_INSTR_FORWARD_PASS ||
                    stages[i]->instrs[k].type == DSC_INSTR_BACKWARD_PASS;
        rs[i].sched = stages[i];
        queue[i] = i;
    }
    int head = 0, tail = n;
    while (head < tail)
        DSC_TRY_GOTO(st, advance(rs, queue[head++], costs, out, queue, &tail), fail);
    for (int i = 0; i < n; i++)
        if (rs[i].pc < stages[i]->count) DSC_TRY_GOTO(st, deadlock_error(rs, n), fail);
    for (int i = 0; i < n; i++) {
        out->stages[i].finish = rs[i].clock;
        out->makespan = fmax(out->makespan, rs[i].clock);
    }
    for (int i = 0; i < n; i++)
        out->bubble += out->makespan > 0 ? (1.0 - out->stages[i].busy / out->makespan) / n : 0.0;
    goto done;
fail:
    dsc_pipe_sim_free(out);
done:
    dsc_mem_free(rs, n * sizeof *rs, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(queue, queue_len * sizeof *queue, DSC_MEM_OTHER, DSC_CPU);
    return st;
}

void dsc_pipe_sim_free(dsc_pipe_sim_result *r) {
    dsc_mem_free(r->segment_pool, r->pool_len * sizeof *r->segment_pool, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(r->stages, r->num_stages * sizeof *r->stages, DSC_MEM_OTHER, DSC_CPU);
    *r = (dsc_pipe_sim_result){0};
}

/* Unit steps of the timelines in docs/schedules.md: every stage computes
 * 2*M*v chunk operations and idles 2*(P-1) (train, GPipe, interleaved), or
 * M forwards and P-1 idle steps (inference); with p2p = 0 the simulated
 * makespan is that many operations of cost (F+B)/(2v) each. */
dsc_status dsc_pipe_sim_closed_form(dsc_schedule_kind kind, int M, int P, int v, const dsc_pipe_sim_costs *c,
                                    dsc_pipe_sim_bounds *out) {
    DSC_CHECK(M >= 1 && P >= 1 && v >= 1, DSC_ERR_INVALID, "closed form needs M, P, v >= 1 (got %d, %d, %d)", M, P,
              v);
    switch (kind) {
    case DSC_SCHEDULE_TRAIN_1F1B:
    case DSC_SCHEDULE_GPIPE:
    case DSC_SCHEDULE_INTERLEAVED:
        out->makespan = ((double)v * M + P - 1) * (c->forward + c->backward) / v;
        out->bubble = (double)(P - 1) / ((double)v * M + P - 1);
        return NULL;
    case DSC_SCHEDULE_INFERENCE:
        out->makespan = ((double)M + P - 1) * c->forward;
        out->bubble = (double)(P - 1) / ((double)M + P - 1);
        return NULL;
    case DSC_SCHEDULE_DATA_PARALLEL:
        out->makespan = (double)M * (c->forward + c->backward);
        out->bubble = 0.0;
        return NULL;
    default:
        return dsc_error(DSC_ERR_INVALID, "schedule kind %d is unknown", (int)kind);
    }
}

int dsc_pipe_sim_peak_live_bound(dsc_schedule_kind kind, int M, int P, int S, int v) {
    int peak;
    switch (kind) {
    case DSC_SCHEDULE_TRAIN_1F1B:
        peak = P - S;
        break; /* warm-up depth */
    case DSC_SCHEDULE_GPIPE:
        peak = M;
        break; /* every forward before any backward */
    case DSC_SCHEDULE_INTERLEAVED:
        peak = 2 * (P - S - 1) + (v - 1) * P + 1;
        break; /* Megatron warm-up + 1 */
    default:
        peak = 1;
        break; /* inference, data parallel */
    }
    return peak < M * v ? peak : M * v;
}
