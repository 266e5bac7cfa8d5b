/* How the executor runs one model chunk on one pipeline buffer: its layers
 * in order (forward) or reverse (backward), each call wrapped in the
 * optimizer's layer hooks, grads_ready during the chunk's last backward of
 * the batch (with the optimizer's progress run before every kernel of it),
 * and activation checkpointing by layer interval as DeepSpeed's
 * PipelineModule does it: the chunk's layers are cut into runs of k
 * (activation_checkpoint_interval), and a run is checkpointed when every
 * layer in it has parameters and none reads the tokens or computes the loss
 * (DeepSpeed's default rule with its GPT special case). A checkpointed run
 * keeps only its input per buffer; its layers hold one activation slot,
 * which backward refills by running the run's forward again. Kernels are
 * deterministic, so the recomputed activations are bitwise the originals.
 *
 * Also the buffers themselves: per-buffer inputs, outputs, gradients,
 * checkpoint inputs, and the layers' reservations.
 *
 * Not here: when a chunk runs (pipe/engine.c). */
#include <stdlib.h>
#include <string.h>

#include "dsc/precision.h"
#include "pipe/engine_internal.h"

static bool checkpointable(const pipe_chunk *c, int first, int end) {
    for (int l = first; l < end; l++) {
        if (c->layers[l]->n_params == 0) return false;
        if (c->first_virtual && l == 0) return false;       /* reads the tokens */
        if (c->last_virtual && l == c->n - 1) return false; /* computes the loss */
    }
    return true;
}

static dsc_status alloc_act(dsc_tensor *t, int ndim, const int64_t *shape, dsc_dtype dtype, dsc_device dev) {
    return dsc_tensor_alloc(t, dtype, ndim, shape, dev, DSC_MEM_ACTIVATIONS);
}

static dsc_status setup_chunk(pipe_runner *r, int index, dsc_device dev, bool *out_copy, bool *din_copy) {
    pipe_chunk *c = &r->chunks[index];
    int j = index * r->P + r->stage, k = r->o.activation_checkpoint_interval;
    c->layers = dsc_pipe_stage_chunk(r->o.stage, index, &c->n);
    c->first_virtual = j == 0;
    c->last_virtual = j == r->P * r->v - 1;
    int per = k > 0 ? k : (c->n > 0 ? c->n : 1);
    c->segs = calloc((size_t)(c->n / per + 1), sizeof *c->segs);
    DSC_CHECK(c->segs, DSC_ERR_NOMEM, "pipeline: runs of chunk %d", index);
    const int64_t act[3] = {r->o.B, r->o.T, dsc_pipe_module_width(r->o.module)};
    for (int first = 0; first < c->n; first += per) {
        pipe_segment *seg = &c->segs[c->n_segs++];
        seg->first = first;
        seg->end = first + per < c->n ? first + per : c->n;
        seg->checkpoint = k > 0 && checkpointable(c, seg->first, seg->end);
        if (seg->checkpoint) {
            seg->saved = calloc((size_t)r->n_slots, sizeof *seg->saved);
            seg->input = calloc((size_t)r->n_slots, sizeof *seg->input);
            DSC_CHECK(seg->saved && seg->input, DSC_ERR_NOMEM, "pipeline: checkpoint inputs");
            for (int b = 0; b < r->n_slots; b++)
                DSC_TRY(alloc_act(&seg->saved[b], 3, act, r->stash, dev));
        }
        for (int l = seg->first; l < seg->end; l++) {
            dsc_layer_set_saved_dtype(c->layers[l], r->stash); /* mixed precision: 2-byte product operands */
            DSC_TRY(dsc_layer_reserve(c->layers[l], seg->checkpoint ? 1 : r->n_slots, r->o.B, r->o.T));
        }
    }
    *out_copy |= c->n_segs > 0 && c->segs[c->n_segs - 1].checkpoint;
    *din_copy |= c->n_segs > 0 && c->segs[0].checkpoint;
    return NULL;
}

dsc_status pipe_runner_alloc_buffers(pipe_runner *r) {
    int n_all;
    dsc_layer *const *all = dsc_pipe_stage_layers(r->o.stage, &n_all);
    dsc_device dev = n_all > 0 && all[0]->n_params > 0 ? all[0]->params[0]->value.device : DSC_CPU;
    /* Under mixed precision a checkpointed input is exact in the 2-byte type (the runner rounds
     * what passes between layers and stages): kept in it, half of f32's bytes, on the CPU. */
    dsc_dtype narrow = dsc_precision_dtype(r->o.optimizer);
    r->stash = dev.type == DSC_DEVICE_CPU && dsc_precision_is_narrow(narrow) ? narrow : DSC_DTYPE_F32;
    r->chunks = calloc((size_t)r->v, sizeof *r->chunks);
    r->slots = calloc((size_t)r->n_slots, sizeof *r->slots);
    DSC_CHECK(r->chunks && r->slots, DSC_ERR_NOMEM, "pipeline: %d buffers", r->n_slots);
    bool out_copy = false, din_copy = false;
    for (int c = 0; c < r->v; c++)
        DSC_TRY(setup_chunk(r, c, dev, &out_copy, &din_copy));
    const int64_t tok[2] = {r->o.B, r->o.T}, act[3] = {r->o.B, r->o.T, dsc_pipe_module_width(r->o.module)};
    if (r->stash != DSC_DTYPE_F32) DSC_TRY(alloc_act(&r->scratch, 3, act, DSC_DTYPE_F32, dev));
    for (int b = 0; b < r->n_slots; b++) {
        pipe_slot *s = &r->slots[b];
        DSC_TRY(alloc_act(&s->tokens, 2, tok, DSC_DTYPE_I32, DSC_CPU));
        DSC_TRY(alloc_act(&s->targets, 2, tok, DSC_DTYPE_I32, DSC_CPU));
        DSC_TRY(alloc_act(&s->input_buf, 3, act, DSC_DTYPE_F32, dev));
        if (out_copy) DSC_TRY(alloc_act(&s->output_copy, 3, act, DSC_DTYPE_F32, dev));
        if (din_copy) DSC_TRY(alloc_act(&s->din_copy, 3, act, DSC_DTYPE_F32, dev));
    }
    return alloc_act(&r->grad_buf, 3, act, DSC_DTYPE_F32, dev);
}

void pipe_runner_free_buffers(pipe_runner *r) {
    for (int c = 0; r->chunks && c < r->v; c++) {
        for (int i = 0; i < r->chunks[c].n_segs; i++) {
            pipe_segment *seg = &r->chunks[c].segs[i];
            for (int b = 0; seg->saved && b < r->n_slots; b++)
                dsc_tensor_free(&seg->saved[b]);
            free(seg->saved);
            free(seg->input);
        }
        free(r->chunks[c].segs);
    }
    for (int b = 0; r->slots && b < r->n_slots; b++) {
        pipe_slot *s = &r->slots[b];
        dsc_tensor_free(&s->tokens);
        dsc_tensor_free(&s->targets);
        dsc_tensor_free(&s->input_buf);
        dsc_tensor_free(&s->output_copy);
        dsc_tensor_free(&s->din_copy);
    }
    dsc_tensor_free(&r->grad_buf);
    dsc_tensor_free(&r->scratch);
    free(r->chunks);
    free(r->slots);
}

/* `src` copied into the front of `buf`, returned as a view of src's shape. */
static dsc_status keep(dsc_tensor *buf, const dsc_tensor *src, dsc_tensor *view) {
    *view = dsc_tensor_view(buf->data, src->dtype, src->ndim, src->shape, buf->device);
    return dsc_tensor_copy(view, src);
}

static dsc_status forward_layers(pipe_runner *r, const pipe_chunk *c, const pipe_segment *seg, int slot,
                                 dsc_tensor *x, dsc_micro_ctx *ctx) {
    for (int l = seg->first; l < seg->end; l++) {
        dsc_tensor y;
        DSC_TRY(dsc_optimizer_before_layer(r->o.optimizer, c->layers[l], false));
        DSC_TRY(dsc_layer_forward(c->layers[l], slot, x, &y, ctx));
        DSC_TRY(dsc_optimizer_after_layer(r->o.optimizer, c->layers[l], false));
        /* mixed precision: stored in bf16 / fp16 between layers (not the loss layer's per-token losses) */
        if (!(c->last_virtual && l == c->n - 1)) dsc_precision_store_between(r->o.optimizer, &y);
        *x = y;
    }
    return NULL;
}

dsc_status pipe_chunk_forward(pipe_runner *r, pipe_chunk *c, int slot, dsc_micro_ctx *ctx) {
    pipe_slot *s = &r->slots[slot];
    dsc_tensor x = c->first_virtual ? (dsc_tensor){0} : s->input;
    for (int i = 0; i < c->n_segs; i++) {
        pipe_segment *seg = &c->segs[i];
        if (seg->checkpoint && r->stash != DSC_DTYPE_F32) {
            /* x stays as it is until the run's forward is over: it is read from there */
            seg->input[slot] = dsc_tensor_view(seg->saved[slot].data, r->stash, x.ndim, x.shape, x.device);
            dsc_precision_pack_to(seg->input[slot].data, x.data, dsc_tensor_numel(&x), r->stash);
        } else if (seg->checkpoint) {
            DSC_TRY(keep(&seg->saved[slot], &x, &seg->input[slot]));
            x = seg->input[slot];
        }
        DSC_TRY(forward_layers(r, c, seg, seg->checkpoint ? 0 : slot, &x, ctx));
    }
    /* A checkpointed run's output lives in its one shared slot: keep a copy to send. */
    if (c->n_segs > 0 && c->segs[c->n_segs - 1].checkpoint) return keep(&s->output_copy, &x, &s->output);
    s->output = x;
    return NULL;
}

/* `progress` set: the chunk's last backward of the batch, whose layers' gradients are final. */
static dsc_status backward_segments(pipe_runner *r, pipe_chunk *c, int slot, const dsc_tensor *dout,
                                    dsc_micro_ctx *ctx, dsc_optimizer_progress_scope *progress) {
    pipe_slot *s = &r->slots[slot];
    dsc_tensor dy = dout ? *dout : (dsc_tensor){0};
    for (int i = c->n_segs - 1; i >= 0; i--) {
        const pipe_segment *seg = &c->segs[i];
        int at = seg->checkpoint ? 0 : slot;
        if (seg->checkpoint) {
            /* Recompute into the run's slot; its losses were counted in the first forward. */
            dsc_micro_ctx again = *ctx;
            dsc_tensor x = seg->input[slot];
            if (r->stash != DSC_DTYPE_F32) { /* widened exactly; the run's layers read it until their backward */
                const dsc_tensor *in = &seg->input[slot];
                x = dsc_tensor_view(r->scratch.data, DSC_DTYPE_F32, in->ndim, in->shape, in->device);
                dsc_precision_unpack(x.data, in->data, dsc_tensor_numel(in), r->stash);
            }
            DSC_TRY(forward_layers(r, c, seg, 0, &x, &again));
        }
        for (int l = seg->end - 1; l >= seg->first; l--) {
            dsc_tensor dx;
            DSC_TRY(dsc_optimizer_before_layer(r->o.optimizer, c->layers[l], true));
            DSC_TRY(dsc_layer_backward(c->layers[l], at, &dy, &dx, ctx));
            DSC_TRY(dsc_optimizer_after_layer(r->o.optimizer, c->layers[l], true));
            DSC_TRY(dsc_optimizer_progress_take(progress, c->layers[l]->name));
            if (progress) DSC_TRY(dsc_optimizer_grads_ready(r->o.optimizer, c->layers[l]));
            if (!(c->first_virtual && l == 0)) dsc_precision_store_between(r->o.optimizer, &dx);
            dy = dx;
        }
    }
    /* A checkpointed first run's input gradient is in its shared slot: keep a copy to send. */
    if (c->n_segs > 0 && c->segs[0].checkpoint && !c->first_virtual) return keep(&s->din_copy, &dy, &s->din);
    s->din = dy;
    return NULL;
}

/* In the chunk's last backward of the batch the reductions grads_ready posts move on between
 * kernels too (as in the default runner), not only at each layer's grads_ready. */
dsc_status pipe_chunk_backward(pipe_runner *r, pipe_chunk *c, int slot, const dsc_tensor *dout, bool last,
                               dsc_micro_ctx *ctx) {
    if (!last) return backward_segments(r, c, slot, dout, ctx, NULL);
    dsc_optimizer_progress_scope progress;
    dsc_optimizer_progress_begin(&progress, r->o.optimizer);
    return dsc_optimizer_progress_end(&progress, backward_segments(r, c, slot, dout, ctx, &progress));
}
