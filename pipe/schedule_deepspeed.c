/* pipe/schedule_deepspeed.c — DeepSpeed's three schedules, instruction for
 * instruction: TrainSchedule (synchronous 1F1B), InferenceSchedule and
 * DataParallelSchedule.
 *
 * Written from the closed-form event times (docs/schedules.md), not from
 * DeepSpeed's parity cases; the streams are checked byte-for-byte against
 * goldens from an independent oracle (tests/ref/pipe_schedule_ref.py).
 * GPipe and interleaved live in schedule_timeline.c. */
#include "pipe/schedule_internal.h"

static int valid(const dsc_schedule *s, int m) {
    return m >= 0 && m < s->micro_batches;
}

/* Stage S works forwards on steps of its own parity and backwards on the
 * others: forward of m at step 2m+S, backward of m at 2m+2P-1-S. */
static int train_is_forward_step(int t, int stage) {
    return (t + stage) % 2 == 0;
}

static int train_micro_batch(int t, int stage, int stages) {
    return train_is_forward_step(t, stage) ? (t - stage) / 2 : (t + stage + 1 - 2 * stages) / 2;
}

static void push_comm(dsc_schedule *s, dsc_instr_type type, int buffer, int m, int peer) {
    dsc_sched_push(s, type, buffer, m, 0, peer, 0);
}

static dsc_status build_train(dsc_schedule *s) {
    const int M = s->micro_batches, P = s->stages, S = s->stage_id;
    const int T = 2 * (M + P - 1);
    /* Warm-up depth min(P-S, M) is the most micro-batches a stage holds at
     * once; the floor of 2 keeps the last stage and P=1 double-buffered. */
    const int B = P - S < M ? P - S : M;
    s->num_buffers = B > 2 ? B : 2;
    DSC_TRY(dsc_sched_reserve(s, T, 4 * T + 3));
    const int first = S == 0, last = S == P - 1;
    for (int t = 0; t < T; t++) {
        const int fwd = train_is_forward_step(t, S);
        const int cur = train_micro_batch(t, S, P);
        /* Step t-1 is on the other side: its micro-batch's result leaves now. */
        const int prev = t > 0 ? train_micro_batch(t - 1, S, P) : -1;
        if (fwd) {
            /* SendGrad before RecvActivation: the received inputs may land in
             * the very slot whose input gradient is being sent. */
            if (valid(s, prev) && !first) push_comm(s, DSC_INSTR_SEND_GRAD, prev % s->num_buffers, prev, S - 1);
            if (valid(s, cur) && !first) push_comm(s, DSC_INSTR_RECV_ACTIVATION, cur % s->num_buffers, cur, S - 1);
        } else {
            if (valid(s, cur) && !last) push_comm(s, DSC_INSTR_RECV_GRAD, cur % s->num_buffers, cur, S + 1);
            if (valid(s, prev) && !last)
                push_comm(s, DSC_INSTR_SEND_ACTIVATION, prev % s->num_buffers, prev, S + 1);
        }
        if (valid(s, cur)) {
            if (fwd && (first || last))
                dsc_sched_push(s, DSC_INSTR_LOAD_MICRO_BATCH, cur % s->num_buffers, cur, 0, -1, -1);
            dsc_sched_push(s, fwd ? DSC_INSTR_FORWARD_PASS : DSC_INSTR_BACKWARD_PASS, cur % s->num_buffers, cur, 0,
                           -1, -1);
        }
        if (t == T - 1) dsc_sched_push_batch_end(s, 1);
        dsc_sched_end_step(s);
    }
    return NULL;
}

static dsc_status build_inference(dsc_schedule *s) {
    const int M = s->micro_batches, P = s->stages, S = s->stage_id;
    const int T = M + P - 1;
    s->num_buffers = 2;
    DSC_TRY(dsc_sched_reserve(s, T, 4 * T));
    for (int t = 0; t < T; t++) {
        const int m = t - S;
        if (valid(s, m) && (S == 0 || S == P - 1))
            dsc_sched_push(s, DSC_INSTR_LOAD_MICRO_BATCH, m % 2, m, 0, -1, -1);
        const int send = S < P - 1 && valid(s, m - 1), recv = S > 0 && valid(s, m);
        /* Even stages send first and odd stages receive first, so every
         * neighbouring pair meets in the same order. */
        if (S % 2 == 0 && send) push_comm(s, DSC_INSTR_SEND_ACTIVATION, (m - 1) % 2, m - 1, S + 1);
        if (recv) push_comm(s, DSC_INSTR_RECV_ACTIVATION, m % 2, m, S - 1);
        if (S % 2 == 1 && send) push_comm(s, DSC_INSTR_SEND_ACTIVATION, (m - 1) % 2, m - 1, S + 1);
        if (valid(s, m)) dsc_sched_push(s, DSC_INSTR_FORWARD_PASS, m % 2, m, 0, -1, -1);
        dsc_sched_end_step(s);
    }
    return NULL;
}

static dsc_status build_data_parallel(dsc_schedule *s) {
    const int M = s->micro_batches;
    s->num_buffers = 1;
    DSC_TRY(dsc_sched_reserve(s, M, 3 * M + 2));
    for (int t = 0; t < M; t++) {
        dsc_sched_push(s, DSC_INSTR_LOAD_MICRO_BATCH, 0, t, 0, -1, -1);
        dsc_sched_push(s, DSC_INSTR_FORWARD_PASS, 0, t, 0, -1, -1);
        dsc_sched_push(s, DSC_INSTR_BACKWARD_PASS, 0, t, 0, -1, -1);
        if (t == M - 1) dsc_sched_push_batch_end(s, 0);
        dsc_sched_end_step(s);
    }
    return NULL;
}

dsc_status dsc_sched_build_deepspeed(dsc_schedule *s) {
    switch (s->kind) {
    case DSC_SCHEDULE_TRAIN_1F1B:
        return build_train(s);
    case DSC_SCHEDULE_INFERENCE:
        return build_inference(s);
    case DSC_SCHEDULE_DATA_PARALLEL:
        return build_data_parallel(s);
    default:
        return dsc_error(DSC_ERR_INTERNAL, "%s is not a DeepSpeed schedule", dsc_schedule_kind_name(s->kind));
    }
}
