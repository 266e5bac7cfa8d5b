/* The pipeline executor: a batch runner that walks one stage's instruction
 * stream and hands each instruction to its handler (a table indexed by
 * instruction type, so a new schedule never touches this file).
 *
 *   LoadMicroBatch   the batch source fills the slot's tokens and targets
 *                    (first virtual stage: inputs; last: labels)
 *   ForwardPass      the chunk's layers on the slot (pipe/engine_chunk.c)
 *   BackwardPass     the same in reverse; the loss layer seeds it with
 *                    loss_scale s/M (s: fp16's loss scale, else 1), so the
 *                    division by M happens exactly once
 *   Send/Recv*       pipe/p2p.c; received gradients land in one shared
 *                    buffer (DeepSpeed's grad_layer): RecvGrad always shares
 *                    its step with the BackwardPass that consumes it
 *   ReduceTiedGrads  sums tied gradients over the stages holding them
 *   ReduceGrads, OptimizerStep   batch-end markers: the engine calls the
 *                    optimizer's reduce_grads and step after train_batch
 *
 * At the end of a batch the micro-batch losses (last stage) and auxiliary
 * losses (every stage) are summed over the pipe group, so every rank returns
 * the batch loss, as DeepSpeed's train_batch does. Instrumentation: wall
 * time of each batch and the time spent computing; the rest is the bubble
 * plus p2p waits.
 *
 * Not here: which instruction comes when (dsc/schedule.h), how a chunk runs
 * its layers and checkpoints them (pipe/engine_chunk.c), moving bytes
 * (pipe/p2p.c). */
#include <stdlib.h>
#include <string.h>

#include "dsc/precision.h"
#include "pipe/engine_internal.h"

static dsc_micro_ctx micro_ctx(pipe_runner *r, pipe_slot *slot, const pipe_chunk *c) {
    return (dsc_micro_ctx){
        .tokens = c->first_virtual ? &slot->tokens : NULL,
        .targets = c->last_virtual ? &slot->targets : NULL,
        .loss_scale = dsc_precision_micro_loss_scale(r->o.optimizer, r->M),
        .training = r->training,
        .rng = r->o.rng,
    };
}

/* ---- handlers -------------------------------------------------------------------------- */

typedef dsc_status (*handler)(pipe_runner *r, const dsc_instr *in);

static dsc_status exec_load(pipe_runner *r, const dsc_instr *in) {
    pipe_slot *slot = &r->slots[in->buffer];
    dsc_batch_source *src = r->data;
    DSC_CHECK(in->micro_batch == src->consumed, DSC_ERR_INTERNAL,
              "LoadMicroBatch of micro-batch %d, but the source is at micro-batch %d", in->micro_batch,
              src->consumed);
    DSC_TRY(src->next(src, &slot->tokens, &slot->targets));
    if (r->chunks[in->chunk].first_virtual) r->tokens += dsc_tensor_numel(&slot->tokens);
    return NULL;
}

static dsc_status exec_forward(pipe_runner *r, const dsc_instr *in) {
    DSC_TRY(pipe_p2p_wait_sends(r->p2p));
    double t0 = dsc_time_now();
    pipe_chunk *c = &r->chunks[in->chunk];
    pipe_slot *slot = &r->slots[in->buffer];
    dsc_micro_ctx ctx = micro_ctx(r, slot, c);
    DSC_TRY(pipe_chunk_forward(r, c, in->buffer, &ctx));
    if (c->last_virtual) r->loss_sum += ctx.loss;
    r->aux_sum += ctx.aux_loss;
    r->stats.compute_s += dsc_time_now() - t0;
    return NULL;
}

static dsc_status exec_backward(pipe_runner *r, const dsc_instr *in) {
    DSC_TRY(pipe_p2p_wait_sends(r->p2p));
    double t0 = dsc_time_now();
    pipe_chunk *c = &r->chunks[in->chunk];
    pipe_slot *slot = &r->slots[in->buffer];
    dsc_micro_ctx ctx = micro_ctx(r, slot, c);
    /* The last backward of a chunk in this batch finalises its gradients. */
    bool last = ++c->backwards == r->M;
    DSC_TRY(pipe_chunk_backward(r, c, in->buffer, c->last_virtual ? NULL : &r->grad_in, last, &ctx));
    r->stats.compute_s += dsc_time_now() - t0;
    return NULL;
}

/* Under mixed precision (r->stash bf16 / fp16) what crosses stages is exact in the 2-byte type:
 * the runner rounds activations, and activation gradients (already times the loss scale). So both
 * travel in it, half of f32's bytes, as DeepSpeed's bf16 / fp16 tensors do: packed into the upper
 * half of r->scratch, received into its lower half and widened into place. */
static dsc_tensor wire(const pipe_runner *r, bool sending, const dsc_tensor *like) {
    char *at = (char *)r->scratch.data + (sending ? dsc_tensor_nbytes(&r->scratch) / 2 : 0);
    return dsc_tensor_view(at, r->stash, like->ndim, like->shape, like->device);
}

/* `t` as sent: itself in f32, else its 2-byte form (after the send before it completed). */
static dsc_status to_wire(pipe_runner *r, const dsc_tensor *t, dsc_tensor *out) {
    if (r->stash == DSC_DTYPE_F32) {
        *out = *t;
        return NULL;
    }
    DSC_TRY(pipe_p2p_wait_sends(r->p2p));
    *out = wire(r, true, t);
    dsc_precision_pack_to(out->data, t->data, dsc_tensor_numel(t), r->stash);
    return NULL;
}

static void from_wire(const pipe_runner *r, dsc_tensor *dst, const dsc_tensor *w) {
    dsc_precision_unpack(dst->data, w->data, dsc_tensor_numel(w), r->stash);
}

static dsc_status send_activation(pipe_runner *r, pipe_slot *slot, int chunk, int peer_stage, int peer_chunk) {
    dsc_tensor t;
    DSC_TRY(to_wire(r, &slot->output, &t));
    return pipe_p2p_send_activation(r->p2p, &t, chunk, peer_stage, peer_chunk);
}

static dsc_status recv_activation(pipe_runner *r, pipe_slot *slot, int chunk, int peer_stage, int peer_chunk) {
    if (r->stash == DSC_DTYPE_F32)
        return pipe_p2p_recv_activation(r->p2p, &slot->input_buf, chunk, peer_stage, peer_chunk, &slot->input);
    dsc_tensor lower = wire(r, false, &slot->input_buf), w;
    DSC_TRY(pipe_p2p_recv_activation(r->p2p, &lower, chunk, peer_stage, peer_chunk, &w));
    slot->input = dsc_tensor_view(slot->input_buf.data, DSC_DTYPE_F32, w.ndim, w.shape, w.device);
    from_wire(r, &slot->input, &w);
    return NULL;
}

static dsc_status exec_send_activation(pipe_runner *r, const dsc_instr *in) {
    return send_activation(r, &r->slots[in->buffer], in->chunk, in->peer_stage, in->peer_chunk);
}

static dsc_status exec_recv_activation(pipe_runner *r, const dsc_instr *in) {
    return recv_activation(r, &r->slots[in->buffer], in->chunk, in->peer_stage, in->peer_chunk);
}

static dsc_status exec_send_grad(pipe_runner *r, const dsc_instr *in) {
    dsc_tensor t;
    DSC_TRY(to_wire(r, &r->slots[in->buffer].din, &t));
    return pipe_p2p_send_grad(r->p2p, &t, in->chunk, in->peer_stage, in->peer_chunk);
}

/* The gradient of this slot's outputs, shaped like them (no header needed). */
static dsc_status exec_recv_grad(pipe_runner *r, const dsc_instr *in) {
    const dsc_tensor *out = &r->slots[in->buffer].output;
    r->grad_in = dsc_tensor_view(r->grad_buf.data, out->dtype, out->ndim, out->shape, out->device);
    if (r->stash == DSC_DTYPE_F32)
        return pipe_p2p_recv_grad(r->p2p, &r->grad_in, in->chunk, in->peer_stage, in->peer_chunk);
    dsc_tensor w = wire(r, false, out);
    DSC_TRY(pipe_p2p_recv_grad(r->p2p, &w, in->chunk, in->peer_stage, in->peer_chunk));
    from_wire(r, &r->grad_in, &w);
    return NULL;
}

static dsc_status exec_reduce_tied(pipe_runner *r, const dsc_instr *in) {
    (void)in;
    return r->o.tied ? dsc_pipe_tied_reduce_grads(r->o.tied) : NULL;
}

/* ReduceGrads and OptimizerStep: the engine runs them once train_batch has
 * returned (dsc/optimizer.h's rule for every runner). */
static dsc_status exec_batch_end(pipe_runner *r, const dsc_instr *in) {
    (void)in;
    r->batch_ended = true;
    return NULL;
}

/* Each instruction's handler, and the phase of the step's time it counts
 * toward (wall_clock_breakdown; -1: not a phase of its own). */
static const struct {
    handler run;
    int phase;
} handlers[DSC_INSTR_TYPE_COUNT] = {
    [DSC_INSTR_LOAD_MICRO_BATCH] = {exec_load, -1},
    [DSC_INSTR_FORWARD_PASS] = {exec_forward, DSC_PHASE_FORWARD},
    [DSC_INSTR_BACKWARD_PASS] = {exec_backward, DSC_PHASE_BACKWARD},
    [DSC_INSTR_SEND_ACTIVATION] = {exec_send_activation, DSC_PHASE_P2P},
    [DSC_INSTR_RECV_ACTIVATION] = {exec_recv_activation, DSC_PHASE_P2P},
    [DSC_INSTR_SEND_GRAD] = {exec_send_grad, DSC_PHASE_P2P},
    [DSC_INSTR_RECV_GRAD] = {exec_recv_grad, DSC_PHASE_P2P},
    [DSC_INSTR_REDUCE_TIED_GRADS] = {exec_reduce_tied, DSC_PHASE_REDUCE},
    [DSC_INSTR_REDUCE_GRADS] = {exec_batch_end, -1},
    [DSC_INSTR_OPTIMIZER_STEP] = {exec_batch_end, -1},
};

static dsc_status run_step(pipe_runner *r, const dsc_instr *ins, int n, int step) {
    for (int i = 0; i < n; i++) {
        const dsc_instr *in = &ins[i];
        handler h = (unsigned)in->type < DSC_INSTR_TYPE_COUNT ? handlers[in->type].run : NULL;
        DSC_CHECK(h, DSC_ERR_INTERNAL,
                  "pipeline stage %d step %d: the executor does not understand instruction %d", r->stage, step,
                  (int)in->type);
        DSC_CHECK(in->buffer < r->n_slots, DSC_ERR_INTERNAL, "pipeline stage %d step %d: %s uses buffer %d of %d",
                  r->stage, step, dsc_instr_name(in->type), in->buffer, r->n_slots);
        double t0 = dsc_time_now();
        dsc_status s = h(r, in);
        if (handlers[in->type].phase >= 0) r->phase_s[handlers[in->type].phase] += dsc_time_now() - t0;
        if (s)
            return dsc_error_wrap(s, "pipeline stage %d step %d: %s(buf=%d, micro-batch %d, chunk %d)", r->stage,
                                  step, dsc_instr_name(in->type), in->buffer, in->micro_batch, in->chunk);
    }
    return NULL;
}

/* Eval with several chunks per stage: forwards in (micro-batch, chunk)
 * order, each one step: load, receive from the previous virtual stage,
 * forward, send to the next. Every rank walks the same global order and a
 * virtual stage only waits for earlier ones, so it cannot deadlock. */
static dsc_status run_chunk_ring(pipe_runner *r) {
    int P = r->P, V = r->P * r->v, step = 0;
    for (int m = 0; m < r->M; m++) {
        for (int c = 0; c < r->v; c++, step++) {
            int j = c * P + r->stage, buf = (m * r->v + c) % 2;
            dsc_instr ins[4];
            int n = 0;
            if (j == 0 || j == V - 1) ins[n++] = (dsc_instr){DSC_INSTR_LOAD_MICRO_BATCH, buf, m, c, -1, -1};
            if (j > 0) ins[n++] = (dsc_instr){DSC_INSTR_RECV_ACTIVATION, buf, m, c, (j - 1) % P, (j - 1) / P};
            ins[n++] = (dsc_instr){DSC_INSTR_FORWARD_PASS, buf, m, c, -1, -1};
            if (j < V - 1) ins[n++] = (dsc_instr){DSC_INSTR_SEND_ACTIVATION, buf, m, c, (j + 1) % P, (j + 1) / P};
            DSC_TRY(run_step(r, ins, n, step));
        }
    }
    return NULL;
}

static dsc_status run_schedule(pipe_runner *r, dsc_schedule_kind kind) {
    dsc_schedule *sched;
    DSC_TRY(dsc_schedule_create(kind, r->M, r->P, r->stage, kind == DSC_SCHEDULE_INFERENCE ? 1 : r->v, &sched));
    int need = dsc_schedule_num_buffers(sched);
    dsc_status s =
        need <= r->n_slots
            ? NULL
            : dsc_error(DSC_ERR_INVALID,
                        "pipeline stage %d: %d micro-batches need %d buffers, the runner was built with %d "
                        "(for %d micro-batches)",
                        r->stage, r->M, need, r->n_slots, r->o.micro_batches);
    for (int t = 0; t < dsc_schedule_num_steps(sched) && !s; t++) {
        int n;
        const dsc_instr *ins = dsc_schedule_step(sched, t, &n);
        s = run_step(r, ins, n, t);
    }
    dsc_schedule_destroy(sched);
    return s;
}

/* Every rank learns the batch loss: the last stage's micro-batch losses and
 * every stage's auxiliary losses are summed over the pipe group. */
static dsc_status share_loss(pipe_runner *r, dsc_batch_result *res) {
    float v[2] = {(float)r->loss_sum, (float)r->aux_sum};
    double loss = r->loss_sum, aux = r->aux_sum;
    if (r->P > 1) {
        dsc_tensor t = dsc_tensor_view(v, DSC_DTYPE_F32, 1, (int64_t[]){2}, DSC_CPU);
        dsc_status s = dsc_comm_allreduce(r->o.pipe, &t, DSC_REDUCE_OP_SUM);
        if (s) return dsc_error_wrap(s, "pipeline stage %d: sharing the batch loss over the pipe group", r->stage);
        loss = v[0], aux = v[1];
    }
    *res = (dsc_batch_result){.has_loss = true, .loss = loss / r->M, .aux_loss = aux / r->M, .tokens = r->tokens};
    return NULL;
}

static dsc_status run_batch(pipe_runner *r, dsc_batch_source *data, dsc_batch_result *res, bool training) {
    DSC_CHECK(data->micro_batches >= 1, DSC_ERR_INVALID,
              "pipeline: a batch needs at least one micro-batch, got %d", data->micro_batches);
    double t0 = dsc_time_now();
    r->data = data;
    r->training = training;
    r->M = data->micro_batches;
    r->loss_sum = r->aux_sum = 0;
    r->tokens = 0;
    r->batch_ended = false;
    memset(r->phase_s, 0, sizeof r->phase_s);
    for (int c = 0; c < r->v; c++)
        r->chunks[c].backwards = 0;
    pipe_p2p_begin_batch(r->p2p);
    dsc_status s;
    if (training)
        s = run_schedule(r, r->o.schedule);
    else
        s = r->v > 1 ? run_chunk_ring(r) : run_schedule(r, DSC_SCHEDULE_INFERENCE);
    dsc_status sent = pipe_p2p_wait_sends(r->p2p);
    if (!s)
        s = sent;
    else
        dsc_status_free(sent);
    if (!s && training && !r->batch_ended)
        s = dsc_error(DSC_ERR_INTERNAL, "pipeline stage %d: the schedule ended without its batch-end instructions",
                      r->stage);
    if (!s) s = share_loss(r, res);
    if (!s) memcpy(res->phase_s, r->phase_s, sizeof res->phase_s);
    r->stats.wall_s += dsc_time_now() - t0;
    r->stats.batches++;
    return s;
}

static dsc_status pipe_train(dsc_batch_runner *base, dsc_batch_source *data, dsc_batch_result *res) {
    return run_batch((pipe_runner *)base, data, res, true);
}

static dsc_status pipe_eval(dsc_batch_runner *base, dsc_batch_source *data, dsc_batch_result *res) {
    return run_batch((pipe_runner *)base, data, res, false);
}

static void pipe_destroy(dsc_batch_runner *base) {
    pipe_runner *r = (pipe_runner *)base;
    pipe_p2p_destroy(r->p2p);
    pipe_runner_free_buffers(r);
    free(r);
}

static const dsc_batch_runner_ops pipe_ops = {
    .name = "pipeline",
    .train_batch = pipe_train,
    .eval_batch = pipe_eval,
    .destroy = pipe_destroy,
};

/* Buffers of the train schedule (the largest stream this runner runs: the
 * inference stream and the chunk ring use 2). */
static dsc_status count_slots(const dsc_pipe_runner_options *o, int P, int stage, int v, int *slots) {
    dsc_schedule *sched;
    DSC_TRY(dsc_schedule_create(o->schedule, o->micro_batches, P, stage, v, &sched));
    int n = dsc_schedule_num_buffers(sched);
    dsc_schedule_destroy(sched);
    *slots = n > 2 ? n : 2;
    return NULL;
}

dsc_status dsc_pipe_runner_create(const dsc_pipe_runner_options *o, dsc_batch_runner **out) {
    *out = NULL;
    DSC_CHECK(o->module && o->stage && o->optimizer && o->B >= 1 && o->T >= 1 && o->micro_batches >= 1,
              DSC_ERR_INVALID, "pipeline runner: needs a module, a stage, an optimizer, B, T and M >= 1");
    int P = dsc_pipe_module_stages(o->module), v = dsc_pipe_module_chunks(o->module);
    DSC_CHECK(o->pipe && dsc_comm_size(o->pipe) == P, DSC_ERR_INVALID,
              "pipeline runner: %d stages need a pipe communicator of %d ranks", P, P);
    DSC_CHECK((o->schedule == DSC_SCHEDULE_INTERLEAVED) == (v > 1), DSC_ERR_CONFIG,
              "pipeline: schedule %s with %d model chunks per stage (only interleaved runs several)",
              dsc_schedule_kind_name(o->schedule), v);
    pipe_runner *r = calloc(1, sizeof *r);
    DSC_CHECK(r, DSC_ERR_NOMEM, "pipeline runner: out of memory");
    r->base.ops = &pipe_ops;
    r->o = *o;
    r->P = P;
    r->v = v;
    r->stage = dsc_pipe_stage_id(o->stage);
    dsc_status s = count_slots(o, P, r->stage, v, &r->n_slots);
    if (!s) s = pipe_runner_alloc_buffers(r);
    if (!s) s = pipe_p2p_create(o->pipe, v, &r->p2p);
    if (s) {
        pipe_destroy(&r->base);
        return s;
    }
    *out = &r->base;
    return NULL;
}

/* One sequence through every virtual stage in order, with one slot and the
 * loss layer in logits mode; the shape (1, t) differs from training's, which
 * the meta handshake announces. */
static dsc_status forward_logits(pipe_runner *r, const dsc_tensor *tokens, dsc_tensor *logits) {
    int V = r->P * r->v;
    pipe_slot *slot = &r->slots[0];
    for (int c = 0; c < r->v; c++) {
        pipe_chunk *ch = &r->chunks[c];
        int j = c * r->P + r->stage;
        if (j > 0) DSC_TRY(recv_activation(r, slot, c, (j - 1) % r->P, (j - 1) / r->P));
        dsc_micro_ctx ctx = {.tokens = ch->first_virtual ? tokens : NULL, .loss_scale = 1.0f, .rng = r->o.rng};
        DSC_TRY(pipe_p2p_wait_sends(r->p2p));
        DSC_TRY(pipe_chunk_forward(r, ch, 0, &ctx));
        if (j < V - 1) {
            DSC_TRY(send_activation(r, slot, c, (j + 1) % r->P, (j + 1) / r->P));
            continue;
        }
        const dsc_tensor *out = &slot->output; /* (1, t, V) */
        DSC_CHECK(out->ndim == 3 && out->shape[2] == dsc_tensor_numel(logits), DSC_ERR_INVALID,
                  "pipeline logits: the last layer gave no (1, t, %lld) logits",
                  (long long)dsc_tensor_numel(logits));
        DSC_TRY(dsc_logits_row(out, out->shape[1] - 1, logits->data)); /* f32, or 2-byte under mixed precision */
    }
    DSC_TRY(pipe_p2p_wait_sends(r->p2p));
    return dsc_comm_broadcast(r->o.pipe, logits, r->P - 1);
}

dsc_status dsc_pipe_runner_logits(dsc_batch_runner *base, const dsc_tensor *tokens, dsc_tensor *logits) {
    DSC_CHECK(base && base->ops == &pipe_ops, DSC_ERR_INVALID, "pipeline logits: not a pipeline runner");
    pipe_runner *r = (pipe_runner *)base;
    DSC_CHECK(tokens->ndim == 2 && tokens->shape[0] == 1 && tokens->shape[1] >= 1 && tokens->shape[1] <= r->o.T,
              DSC_ERR_INVALID, "pipeline logits: tokens must be (1, t) with 1 <= t <= %lld", (long long)r->o.T);
    r->training = false;
    r->M = 1;
    pipe_p2p_begin_batch(r->p2p);
    dsc_status s = forward_logits(r, tokens, logits);
    dsc_status sent = pipe_p2p_wait_sends(r->p2p);
    if (!s) return sent;
    dsc_status_free(sent);
    return dsc_error_wrap(s, "pipeline stage %d: logits of a %lld-token sequence", r->stage,
                          (long long)tokens->shape[1]);
}

void dsc_pipe_runner_get_stats(const dsc_batch_runner *r, dsc_pipe_runner_stats *out) {
    *out = (dsc_pipe_runner_stats){0};
    if (!r || r->ops != &pipe_ops) return;
    *out = ((const pipe_runner *)r)->stats;
    out->idle_s = out->wall_s - out->compute_s;
}

void dsc_pipe_runner_reset_stats(dsc_batch_runner *r) {
    if (r && r->ops == &pipe_ops) ((pipe_runner *)r)->stats = (dsc_pipe_runner_stats){0};
}
