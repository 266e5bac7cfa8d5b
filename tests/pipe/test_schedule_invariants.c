/* Whole-pipeline invariants of every stream with M <= 12, P <= 8 for train,
 * inference, GPipe and interleaved (v = 2, 3; M a multiple of P):
 *  - step count and buffer count per the closed forms;
 *  - each (micro-batch, chunk) runs exactly its instructions once per stage,
 *    in causal order, and every send/recv names the right peer and chunk;
 *  - same-step pairing: in every step each neighbouring pair lists the same
 *    messages in the same order;
 *  - a rendezvous (blocking) simulation written here, independent of
 *    pipe/simulate.c, finishes without deadlock;
 *  - liveness: a buffer is not reused while it still holds a micro-batch
 *    that a later instruction reads (inputs until SendGrad, outputs until
 *    BackwardPass).
 * Deliberately broken copies of real streams prove each checker can fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/schedule.h"
#include "test_mpi.h"

enum { MAX_P = 8, MAX_INSTR = 2048 };

/* A stage's stream copied out of the library, so that tests can break it. */
typedef struct stream {
    int num_steps, num_buffers, n;
    dsc_instr in[MAX_INSTR];
    int step[MAX_INSTR];
} stream;

typedef struct pipeline {
    dsc_schedule_kind kind;
    int M, P, v;
    stream st[MAX_P];
} pipeline;

static pipeline pipe_buf, broken_buf;

static void load_pipeline(pipeline *p, dsc_schedule_kind kind, int M, int P, int v) {
    *p = (pipeline){kind, M, P, v, {{0}}};
    for (int s = 0; s < P; s++) {
        dsc_schedule *sched;
        assert_ok(dsc_schedule_create(kind, M, P, s, v, &sched));
        stream *st = &p->st[s];
        st->num_steps = dsc_schedule_num_steps(sched);
        st->num_buffers = dsc_schedule_num_buffers(sched);
        for (int t = 0; t < st->num_steps; t++) {
            int n;
            const dsc_instr *in = dsc_schedule_step(sched, t, &n);
            for (int i = 0; i < n; i++) {
                assert_true(st->n < MAX_INSTR);
                st->step[st->n] = t;
                st->in[st->n++] = in[i];
            }
        }
        dsc_schedule_destroy(sched);
    }
}

static int training(const pipeline *p) {
    return p->kind != DSC_SCHEDULE_INFERENCE;
}

static int is_comm(dsc_instr_type t) {
    return t == DSC_INSTR_SEND_ACTIVATION || t == DSC_INSTR_RECV_ACTIVATION || t == DSC_INSTR_SEND_GRAD ||
           t == DSC_INSTR_RECV_GRAD;
}

static int is_batch_end(dsc_instr_type t) {
    return t >= DSC_INSTR_REDUCE_TIED_GRADS;
}

#define FAIL(...) return snprintf(why, len, __VA_ARGS__), 0

/* Step and buffer counts from the closed forms in docs/schedules.md. */
static int check_counts(const pipeline *p, char *why, size_t len) {
    const int M = p->M, P = p->P, v = p->v;
    for (int s = 0; s < P; s++) {
        const stream *st = &p->st[s];
        int steps = 0, buffers = -1;
        switch (p->kind) {
        case DSC_SCHEDULE_TRAIN_1F1B:
            steps = 2 * (M + P - 1), buffers = P - s < M ? P - s : M, buffers = buffers > 2 ? buffers : 2;
            break;
        case DSC_SCHEDULE_INFERENCE:
            steps = M + P - 1, buffers = 2;
            break;
        case DSC_SCHEDULE_GPIPE:
            steps = 2 * (M + P - 1), buffers = M;
            break;
        default:
            steps = v * M + (v + 1) * P - 2;
            break; /* interleaved buffers: checked tight by liveness */
        }
        if (st->num_steps != steps) FAIL("stage %d: %d steps, expected %d", s, st->num_steps, steps);
        if (buffers >= 0 && st->num_buffers != buffers)
            FAIL("stage %d: %d buffers, expected %d", s, st->num_buffers, buffers);
    }
    return 1;
}

/* Positions of each instruction of one (micro-batch, chunk) on one stage. */
typedef struct unit_trace {
    int pos[DSC_INSTR_TYPE_COUNT];
    int count[DSC_INSTR_TYPE_COUNT];
} unit_trace;

static unit_trace traces[12 * 4];

/* Every (micro-batch, chunk) gets exactly the instructions of its virtual
 * stage j, once, in causal order; peers are virtual stages j-1 and j+1. */
static int check_instructions(const pipeline *p, char *why, size_t len) {
    const int P = p->P, v = p->v, J = P * v;
    for (int s = 0; s < P; s++) {
        const stream *st = &p->st[s];
        memset(traces, 0, sizeof traces);
        int batch_end = 0;
        for (int i = 0; i < st->n; i++) {
            const dsc_instr *in = &st->in[i];
            if (is_batch_end(in->type)) {
                const dsc_instr_type want =
                    training(p) ? (dsc_instr_type)(DSC_INSTR_REDUCE_TIED_GRADS + batch_end) : DSC_INSTR_TYPE_COUNT;
                if (in->type != want || st->step[i] != st->num_steps - 1 || i != st->n - 3 + batch_end)
                    FAIL("stage %d: misplaced %s at step %d", s, dsc_instr_name(in->type), st->step[i]);
                batch_end++;
                continue;
            }
            if (in->micro_batch < 0 || in->micro_batch >= p->M || in->chunk < 0 || in->chunk >= v)
                FAIL("stage %d step %d: micro-batch %d chunk %d out of range", s, st->step[i], in->micro_batch,
                     in->chunk);
            const int j = in->chunk * P + s;
            int peer = -1;
            if (in->type == DSC_INSTR_SEND_ACTIVATION || in->type == DSC_INSTR_RECV_GRAD) peer = j + 1;
            if (in->type == DSC_INSTR_RECV_ACTIVATION || in->type == DSC_INSTR_SEND_GRAD) peer = j - 1;
            const int want_stage = peer < 0 ? -1 : peer % P, want_chunk = peer < 0 ? -1 : peer / P;
            if (peer >= J || in->peer_stage != want_stage || in->peer_chunk != want_chunk)
                FAIL("stage %d step %d: %s of virtual stage %d names peer %d chunk %d", s, st->step[i],
                     dsc_instr_name(in->type), j, in->peer_stage, in->peer_chunk);
            unit_trace *u = &traces[in->micro_batch * v + in->chunk];
            u->pos[in->type] = i;
            u->count[in->type]++;
        }
        if (training(p) && batch_end != 3) FAIL("stage %d: %d batch-end instructions", s, batch_end);
        /* At most one forward and one backward per step, forward first. */
        for (int i = 1; i < st->n; i++) {
            const dsc_instr_type b = st->in[i].type;
            if (b != DSC_INSTR_FORWARD_PASS && b != DSC_INSTR_BACKWARD_PASS) continue;
            for (int k = i - 1; k >= 0 && st->step[k] == st->step[i]; k--) {
                const dsc_instr_type earlier = st->in[k].type;
                if (earlier == b || (earlier == DSC_INSTR_BACKWARD_PASS && b == DSC_INSTR_FORWARD_PASS))
                    FAIL("stage %d step %d: %s after %s", s, st->step[i], dsc_instr_name(b),
                         dsc_instr_name(earlier));
            }
        }
        for (int m = 0; m < p->M; m++)
            for (int c = 0; c < v; c++) {
                const unit_trace *u = &traces[m * v + c];
                const int j = c * P + s, first = j == 0, last = j == J - 1, tr = training(p);
                const int want[DSC_INSTR_TYPE_COUNT] = {
                    [DSC_INSTR_LOAD_MICRO_BATCH] = first || last,
                    [DSC_INSTR_FORWARD_PASS] = 1,
                    [DSC_INSTR_BACKWARD_PASS] = tr,
                    [DSC_INSTR_SEND_ACTIVATION] = !last,
                    [DSC_INSTR_RECV_ACTIVATION] = !first,
                    [DSC_INSTR_SEND_GRAD] = tr && !first,
                    [DSC_INSTR_RECV_GRAD] = tr && !last,
                };
                for (int k = 0; k < DSC_INSTR_REDUCE_TIED_GRADS; k++)
                    if (u->count[k] != want[k])
                        FAIL("stage %d micro-batch %d chunk %d: %d x %s, expected %d", s, m, c, u->count[k],
                             dsc_instr_name((dsc_instr_type)k), want[k]);
                /* (earlier, later) pairs that must hold when both exist */
                static const int order[][2] = {
                    {DSC_INSTR_RECV_ACTIVATION, DSC_INSTR_FORWARD_PASS},
                    {DSC_INSTR_LOAD_MICRO_BATCH, DSC_INSTR_FORWARD_PASS},
                    {DSC_INSTR_FORWARD_PASS, DSC_INSTR_SEND_ACTIVATION},
                    {DSC_INSTR_SEND_ACTIVATION, DSC_INSTR_RECV_GRAD},
                    {DSC_INSTR_FORWARD_PASS, DSC_INSTR_BACKWARD_PASS},
                    {DSC_INSTR_RECV_GRAD, DSC_INSTR_BACKWARD_PASS},
                    {DSC_INSTR_BACKWARD_PASS, DSC_INSTR_SEND_GRAD},
                };
                for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
                    const int a = order[k][0], b = order[k][1];
                    if (u->count[a] && u->count[b] && u->pos[a] > u->pos[b])
                        FAIL("stage %d micro-batch %d chunk %d: %s after %s", s, m, c,
                             dsc_instr_name((dsc_instr_type)a), dsc_instr_name((dsc_instr_type)b));
                }
            }
    }
    return 1;
}

/* A message as both ends must see it: sender, receiver, gradient or
 * activation, micro-batch, sender chunk, receiver chunk. */
typedef struct message {
    int from, to, grad, micro_batch, from_chunk, to_chunk;
} message;

static message describe(int stage, const dsc_instr *in) {
    const int send = in->type == DSC_INSTR_SEND_ACTIVATION || in->type == DSC_INSTR_SEND_GRAD;
    const int grad = in->type == DSC_INSTR_SEND_GRAD || in->type == DSC_INSTR_RECV_GRAD;
    return send ? (message){stage, in->peer_stage, grad, in->micro_batch, in->chunk, in->peer_chunk}
                : (message){in->peer_stage, stage, grad, in->micro_batch, in->peer_chunk, in->chunk};
}

/* Messages of `stage` with `peer` in step t, in stream order. */
static int step_messages(const pipeline *p, int stage, int peer, int t, message *out) {
    const stream *st = &p->st[stage];
    int n = 0;
    for (int i = 0; i < st->n; i++)
        if (st->step[i] == t && is_comm(st->in[i].type) && st->in[i].peer_stage == peer)
            out[n++] = describe(stage, &st->in[i]);
    return n;
}

static int check_same_step_pairing(const pipeline *p, char *why, size_t len) {
    message a[16], b[16];
    for (int t = 0; t < p->st[0].num_steps; t++)
        for (int x = 0; x < p->P; x++)
            for (int y = x + 1; y < p->P; y++) {
                const int na = step_messages(p, x, y, t, a), nb = step_messages(p, y, x, t, b);
                if (na != nb || memcmp(a, b, na * sizeof *a) != 0)
                    FAIL("step %d: stages %d and %d list different messages (%d vs %d)", t, x, y, na, nb);
            }
    return 1;
}

/* Blocking send/recv: a stage waits at a message until its peer waits at
 * the same message. Any state where nobody can move is a deadlock. */
static int check_rendezvous(const pipeline *p, char *why, size_t len) {
    int pc[MAX_P] = {0};
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < p->P; s++) {
            const stream *st = &p->st[s];
            while (pc[s] < st->n && !is_comm(st->in[pc[s]].type))
                pc[s]++, progress = 1;
            if (pc[s] == st->n) continue;
            const dsc_instr *in = &st->in[pc[s]];
            const int q = in->peer_stage;
            const stream *qt = &p->st[q];
            while (pc[q] < qt->n && !is_comm(qt->in[pc[q]].type))
                pc[q]++;
            if (pc[q] == qt->n || qt->in[pc[q]].peer_stage != s) continue;
            const message mine = describe(s, in), theirs = describe(q, &qt->in[pc[q]]);
            const int sends = in->type == DSC_INSTR_SEND_ACTIVATION || in->type == DSC_INSTR_SEND_GRAD;
            const int q_sends =
                qt->in[pc[q]].type == DSC_INSTR_SEND_ACTIVATION || qt->in[pc[q]].type == DSC_INSTR_SEND_GRAD;
            if (sends == q_sends || memcmp(&mine, &theirs, sizeof mine) != 0)
                FAIL("stage %d step %d %s meets stage %d step %d %s: mismatched", s, st->step[pc[s]],
                     dsc_instr_name(in->type), q, qt->step[pc[q]], dsc_instr_name(qt->in[pc[q]].type));
            pc[s]++, pc[q]++, progress = 1;
        }
    }
    for (int s = 0; s < p->P; s++)
        if (pc[s] < p->st[s].n)
            FAIL("deadlock: stage %d blocks at step %d %s(buf=%d)", s, p->st[s].step[pc[s]],
                 dsc_instr_name(p->st[s].in[pc[s]].type), p->st[s].in[pc[s]].buffer);
    return 1;
}

/* A (micro-batch, chunk) occupies its buffer from its first instruction to
 * its last one; check_instructions makes that last one SendGrad (inputs
 * read for their gradient) or BackwardPass (first virtual stage), and in
 * inference SendActivation or ForwardPass (last stage). Two occupants of
 * one buffer must not overlap. For timeline schedules the buffer count must
 * also be tight: some moment holds num_buffers occupants. */
static int check_liveness(const pipeline *p, char *why, size_t len) {
    const int v = p->v;
    for (int s = 0; s < p->P; s++) {
        const stream *st = &p->st[s];
        int first[12 * 4], last[12 * 4], buf[12 * 4];
        for (int u = 0; u < p->M * v; u++)
            first[u] = -1;
        for (int i = 0; i < st->n; i++) {
            const dsc_instr *in = &st->in[i];
            if (in->buffer < 0) continue;
            if (in->buffer >= st->num_buffers)
                FAIL("stage %d step %d: buffer %d of %d", s, st->step[i], in->buffer, st->num_buffers);
            const int u = in->micro_batch * v + in->chunk;
            if (first[u] < 0) first[u] = i, buf[u] = in->buffer;
            if (buf[u] != in->buffer)
                FAIL("stage %d micro-batch %d: moved from buffer %d to %d", s, in->micro_batch, buf[u],
                     in->buffer);
            last[u] = i;
        }
        int peak = 0;
        for (int i = 0; i < st->n; i++) {
            int live = 0;
            for (int u = 0; u < p->M * v; u++) {
                if (first[u] > i || last[u] < i) continue;
                live++;
                for (int w = u + 1; w < p->M * v; w++)
                    if (buf[w] == buf[u] && first[w] <= i && last[w] >= i)
                        FAIL("stage %d step %d: buffer %d holds micro-batch %d chunk %d and micro-batch %d chunk "
                             "%d",
                             s, st->step[i], buf[u], u / v, u % v, w / v, w % v);
            }
            peak = live > peak ? live : peak;
        }
        const int timeline = p->kind == DSC_SCHEDULE_GPIPE || p->kind == DSC_SCHEDULE_INTERLEAVED;
        if (timeline && peak != st->num_buffers)
            FAIL("stage %d: %d buffers but at most %d live", s, st->num_buffers, peak);
    }
    return 1;
}

typedef int (*checker)(const pipeline *, char *, size_t);

static const struct {
    const char *name;
    checker fn;
} checks[] = {
    {"counts", check_counts},         {"instructions", check_instructions}, {"pairing", check_same_step_pairing},
    {"rendezvous", check_rendezvous}, {"liveness", check_liveness},
};

static void check_all(const pipeline *p) {
    char why[256];
    for (size_t k = 0; k < sizeof checks / sizeof checks[0]; k++)
        if (!checks[k].fn(p, why, sizeof why))
            fail_msg("%s M=%d P=%d v=%d, %s: %s", dsc_schedule_kind_name(p->kind), p->M, p->P, p->v,
                     checks[k].name, why);
}

static void sweep(dsc_schedule_kind kind, int v) {
    int cases = 0;
    for (int P = 1; P <= MAX_P; P++)
        for (int M = 1; M <= 12; M++) {
            if (kind == DSC_SCHEDULE_INTERLEAVED && (P < 2 || M % P != 0)) continue;
            load_pipeline(&pipe_buf, kind, M, P, v);
            check_all(&pipe_buf);
            cases++;
        }
    printf("%s v=%d: %d pipelines pass counts, instructions, pairing, rendezvous and liveness\n",
           dsc_schedule_kind_name(kind), v, cases);
}

static void test_train_invariants(void **state) {
    (void)state;
    sweep(DSC_SCHEDULE_TRAIN_1F1B, 1);
}
static void test_inference_invariants(void **state) {
    (void)state;
    sweep(DSC_SCHEDULE_INFERENCE, 1);
}
static void test_gpipe_invariants(void **state) {
    (void)state;
    sweep(DSC_SCHEDULE_GPIPE, 1);
}
static void test_interleaved_invariants(void **state) {
    (void)state;
    sweep(DSC_SCHEDULE_INTERLEAVED, 2);
    sweep(DSC_SCHEDULE_INTERLEAVED, 3);
}

static void expect_failure(const pipeline *p, checker fn, const char *needle) {
    char why[256];
    assert_false(fn(p, why, sizeof why));
    printf("caught: %s\n", why);
    assert_non_null(strstr(why, needle));
}

/* Swaps instructions i and i+1 of one stage (same step). */
static void swap_next(stream *st, int i) {
    assert_int_equal(st->step[i], st->step[i + 1]);
    const dsc_instr tmp = st->in[i];
    st->in[i] = st->in[i + 1];
    st->in[i + 1] = tmp;
}

static int find(const stream *st, int step, dsc_instr_type type) {
    for (int i = 0; i < st->n; i++)
        if (st->step[i] == step && st->in[i].type == type) return i;
    fail_msg("no %s in step %d", dsc_instr_name(type), step);
    return -1;
}

/* The checkers reject the streams DeepSpeed's history warns about. */
static void test_checkers_catch_broken_streams(void **state) {
    (void)state;
    load_pipeline(&pipe_buf, DSC_SCHEDULE_TRAIN_1F1B, 4, 3, 1);
    check_all(&pipe_buf);

    /* RecvActivation before SendGrad (pre-v0.8.3 order) with the new buffer
     * count: the received inputs overwrite the slot whose gradient is sent. */
    broken_buf = pipe_buf;
    swap_next(&broken_buf.st[1], find(&broken_buf.st[1], 5, DSC_INSTR_SEND_GRAD));
    expect_failure(&broken_buf, check_liveness, "buffer 0 holds");

    /* One buffer fewer on stage 0 (3 instead of min(P-S, M) = 3 -> 2). */
    broken_buf = pipe_buf;
    for (int i = 0; i < broken_buf.st[0].n; i++)
        if (broken_buf.st[0].in[i].buffer >= 0)
            broken_buf.st[0].in[i].buffer = broken_buf.st[0].in[i].micro_batch % 2;
    expect_failure(&broken_buf, check_liveness, "stage 0");

    /* Stage 0 receives its gradient after sending the activation while
     * stage 1 keeps grad-first: both sides send first and block. */
    broken_buf = pipe_buf;
    swap_next(&broken_buf.st[0], find(&broken_buf.st[0], 5, DSC_INSTR_RECV_GRAD));
    expect_failure(&broken_buf, check_rendezvous, "mismatched");
    expect_failure(&broken_buf, check_same_step_pairing, "step 5");

    /* A send moved one step later breaks the same-step promise. */
    broken_buf = pipe_buf;
    broken_buf.st[0].step[find(&broken_buf.st[0], 1, DSC_INSTR_SEND_ACTIVATION)] = 2;
    expect_failure(&broken_buf, check_same_step_pairing, "step 1");

    /* A backward turned into a second forward. */
    broken_buf = pipe_buf;
    broken_buf.st[2].in[find(&broken_buf.st[2], 3, DSC_INSTR_BACKWARD_PASS)].type = DSC_INSTR_FORWARD_PASS;
    expect_failure(&broken_buf, check_instructions, "2 x ForwardPass, expected 1");

    /* An interleaved send aimed at the wrong chunk of the right stage. */
    load_pipeline(&pipe_buf, DSC_SCHEDULE_INTERLEAVED, 4, 2, 2);
    check_all(&pipe_buf);
    broken_buf = pipe_buf;
    broken_buf.st[1].in[find(&broken_buf.st[1], 2, DSC_INSTR_SEND_ACTIVATION)].peer_chunk = 0;
    expect_failure(&broken_buf, check_instructions, "names peer 0 chunk 0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_invariants),
        cmocka_unit_test(test_inference_invariants),
        cmocka_unit_test(test_gpipe_invariants),
        cmocka_unit_test(test_interleaved_invariants),
        cmocka_unit_test(test_checkers_catch_broken_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
