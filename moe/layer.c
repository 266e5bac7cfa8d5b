/* The MoE feed-forward layer: router, gate, dispatch, all-to-all, experts,
 * all-to-all back, combine (DeepSpeed's MOELayer), with its backward, the
 * optional residual MLP of PR-MoE, and per-expert load statistics.
 *
 * Layout across the expert-parallel group (ep ranks, E_loc = E / ep experts
 * each; rank r holds global experts r*E_loc .. r*E_loc + E_loc - 1): the
 * (E, Cap, M) dispatch buffer is cut into ep pieces of E_loc experts, piece j
 * goes to rank j; what arrives is (ep, E_loc, Cap, M), and each source
 * rank's piece runs through the local experts as a bank slot of its own (see
 * "the experts between the two exchanges"). The way back is the mirror image,
 * and backward repeats both exchanges in reverse. With ep = 1 no
 * communication happens.
 *
 * Gradient scaling: a local expert's gradient sums the objectives of all ep
 * ranks whose tokens it served, while a dense gradient is that of this
 * rank's objective only. The layer multiplies expert gradients by 1/ep, so
 * the optimizer's average over the expert-data-parallel group (the same rule
 * as the data-parallel average of dense gradients) yields the gradient of the
 * mean objective over all data-parallel ranks (DeepSpeed divides by the
 * data-parallel size in its optimizer instead).
 *
 * The layer lives inside a block, which keeps the input unchanged until the
 * slot's backward and consumes the output and input gradient at once: the
 * layer keeps a view of its input and shares one output and one input
 * gradient buffer among slots. The gate, dispatch and combine run on the CPU.
 *
 * Expert tensor parallelism (o.expert_tp, DeepSpeed's
 * enable_expert_tensor_parallelism): the ranks of the tensor group gate the
 * same tokens alike, and each holds a width piece of every local expert, so
 * the expert output and, in backward, the expert input gradient are
 * all-reduced over that group right at the bank (Megatron's MLP per expert).
 *
 * Not here: the routing rules (moe/gate*.c), the row movement loops
 * (moe/dispatch.c), the expert FFNs (moe/experts.c), the block around it. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/kernels.h"
#include "dsc/moe.h"
#include "moe/moe_internal.h"

typedef struct moe_slot {
    dsc_tensor in;              /* view of the block's (b, t, M) input; ndim 0 when no forward is pending */
    int64_t S;                  /* tokens (b*t) */
    dsc_moe_gate_result routes; /* (S, K) routes, counts, losses */
    dsc_tensor gate_in;         /* (S, M) x * jitter noise (jitter only; else the router reads `in`) */
    dsc_tensor noise;           /* (S, M) jitter factors */
    bool jittered;              /* this forward applied jitter */
    dsc_tensor logits;          /* (S, E) */
    dsc_tensor xin;             /* (ep, E_loc, Cap, M) expert input, piece j from rank j */
    dsc_tensor y;               /* (E, Cap, M) expert outputs, back on the tokens' rank */
    dsc_tensor moe_out;         /* (S, M) combined expert output (residual only) */
    dsc_tensor mlp_out;         /* (1, S, M) residual MLP output (residual only) */
    dsc_tensor coef;            /* (S, 2) mixing coefficients (residual only) */
} moe_slot;

typedef struct moe_layer {
    dsc_layer base;
    dsc_moe_options o;
    int64_t M, E, E_loc, ep_size, ep_rank;
    int64_t F; /* d_ff */
    dsc_comm *ep;
    dsc_device device;
    dsc_param *wg; /* (E, M) router */
    dsc_moe_experts *experts;
    dsc_moe_experts *mlp; /* residual MLP: a bank of one dense FFN */
    dsc_param *wc, *bc;   /* (2, M), (2): residual mixing coefficients */
    int nslots;
    int64_t max_S, max_cap;
    moe_slot *slots;
    dsc_tensor buf[4];      /* (E, max_cap, M) each, shared by slots: what is sent, received, computed, returned */
    dsc_comm_request **req; /* (ep, 4): an expert pass's messages in flight: receive / send there, back */
    int64_t *row0;          /* (E + 1) first row of each expert in the padded (E, Cap, M) buffers */
    dsc_tensor out, din;    /* (B, T, M) shared output and input gradient */
    dsc_tensor dlogits;     /* (S, max(E, 2)): router, or residual coefficient, logit gradients */
    dsc_tensor dweight;     /* (S, K) */
    dsc_tensor dsmall;      /* (S, M) gate / residual input-gradient scratch */
    int64_t agree_S;        /* S of the forward being gated, for the capacity agreement */
    /* statistics since the last reset */
    int64_t st_forwards, st_tokens, st_dropped_tokens, st_capacity;
    int64_t *st_routed, *st_kept, *st_dropped; /* (E) */
    double st_l_aux, st_z_loss;
    double st_seconds[DSC_MOE_PHASE_COUNT];
} moe_layer;

static moe_layer *self_of(dsc_layer *l) {
    return (moe_layer *)l;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds the time since *t0 to `phase` and restarts the clock. */
static void lap(moe_layer *m, dsc_moe_phase phase, double *t0) {
    double t = now_s();
    m->st_seconds[phase] += t - *t0;
    *t0 = t;
}

static dsc_tensor view(const dsc_tensor *buf, int ndim, const int64_t *shape) {
    return dsc_tensor_view(buf->data, DSC_DTYPE_F32, ndim, shape, buf->device);
}

/* Sums the experts' partial output (or input gradient) over the expert
 * tensor-parallel group; a no-op with whole experts. */
static dsc_status tp_sum(moe_layer *m, dsc_tensor *t) {
    if (!m->o.expert_tp || dsc_comm_size(m->o.expert_tp) == 1) return NULL;
    dsc_status s = dsc_comm_allreduce(m->o.expert_tp, t, DSC_REDUCE_OP_SUM);
    return s ? dsc_error_wrap(s, "%s: summing the expert pieces over the tensor group", m->base.name) : NULL;
}

/* ---- capacity agreement ---------------------------------------------------------------- */

/* One all-reduce (MAX) over the expert-parallel group of (value, S, -S):
 * returns the group's largest value, and fails on every rank alike when the
 * ranks gate different token counts (their all-to-alls could not match). */
static dsc_status agree(moe_layer *m, int64_t *value) {
    if (!m->ep || m->ep_size == 1) return NULL;
    int64_t v[3] = {*value, m->agree_S, -m->agree_S}, three = 3;
    dsc_tensor t = dsc_tensor_view(v, DSC_DTYPE_I64, 1, &three, DSC_CPU);
    dsc_status s = dsc_comm_allreduce(m->ep, &t, DSC_REDUCE_OP_MAX);
    if (s) return dsc_error_wrap(s, "%s: agreeing the expert capacity", m->base.name);
    DSC_CHECK(v[1] == -v[2], DSC_ERR_INVALID,
              "%s: the ranks of expert-parallel group \"%s\" gate different token counts (between %lld and %lld); "
              "every rank of the group must run each MoE forward with the same S = b*t",
              m->base.name, dsc_comm_name(m->ep), (long long)-v[2], (long long)v[1]);
    *value = v[0];
    return NULL;
}

static dsc_status agree_hook(void *user, int64_t *capacity) {
    return agree(user, capacity);
}

/* ---- reserve ----------------------------------------------------------------------------- */

static void release(moe_layer *m) {
    for (int i = 0; i < m->nslots; i++) {
        moe_slot *s = &m->slots[i];
        dsc_moe_gate_result_free(&s->routes);
        dsc_tensor *t[] = {&s->gate_in, &s->noise, &s->logits, &s->xin, &s->y, &s->moe_out, &s->mlp_out, &s->coef};
        for (size_t j = 0; j < sizeof t / sizeof t[0]; j++)
            dsc_tensor_free(t[j]);
    }
    free(m->slots);
    m->slots = NULL;
    m->nslots = 0;
    dsc_tensor *t[] = {&m->buf[0], &m->buf[1],  &m->buf[2],  &m->buf[3], &m->out,
                       &m->din,    &m->dlogits, &m->dweight, &m->dsmall};
    for (size_t j = 0; j < sizeof t / sizeof t[0]; j++)
        dsc_tensor_free(t[j]);
}

static dsc_status alloc(dsc_tensor *t, int ndim, const int64_t *shape, dsc_device device) {
    return dsc_tensor_alloc(t, DSC_DTYPE_F32, ndim, shape, device, DSC_MEM_ACTIVATIONS);
}

/* The largest capacity a forward of at most S tokens can produce: the
 * configured one in either mode (C may exceed S) or, without dropping, the
 * largest expert load, which is at most S. */
static int64_t capacity_bound(const moe_layer *m, int64_t S) {
    int64_t train = dsc_moe_gate_capacity(&m->o.gate, S, m->E, true);
    int64_t eval = dsc_moe_gate_capacity(&m->o.gate, S, m->E, false);
    int64_t c = train > eval ? train : eval;
    return c > S ? c : S;
}

static dsc_status reserve_slot(moe_layer *m, moe_slot *s) {
    const int64_t S = m->max_S, M = m->M, E = m->E, Cap = m->max_cap;
    DSC_TRY(dsc_moe_gate_result_alloc(&s->routes, S, E, m->o.gate.k));
    DSC_TRY(alloc(&s->logits, 2, (int64_t[]){S, E}, DSC_CPU));
    if (m->o.gate.noisy_gate_policy == DSC_MOE_NOISY_GATE_JITTER) {
        DSC_TRY(alloc(&s->gate_in, 2, (int64_t[]){S, M}, DSC_CPU));
        DSC_TRY(alloc(&s->noise, 2, (int64_t[]){S, M}, DSC_CPU));
    }
    DSC_TRY(alloc(&s->xin, 3, (int64_t[]){m->ep_size, m->E_loc * Cap, M}, m->device));
    DSC_TRY(alloc(&s->y, 3, (int64_t[]){E, Cap, M}, m->device));
    if (!m->o.use_residual) return NULL;
    DSC_TRY(alloc(&s->moe_out, 2, (int64_t[]){S, M}, m->device));
    DSC_TRY(alloc(&s->mlp_out, 3, (int64_t[]){1, S, M}, m->device));
    return alloc(&s->coef, 2, (int64_t[]){S, 2}, m->device);
}

static dsc_status reserve(moe_layer *m, int slots, int64_t B, int64_t T) {
    const int64_t S = B * T, M = m->M;
    m->max_S = S;
    m->max_cap = capacity_bound(m, S);
    m->slots = calloc((size_t)slots, sizeof *m->slots);
    DSC_CHECK(m->slots, DSC_ERR_NOMEM, "%s: %d slots", m->base.name, slots);
    m->nslots = slots;
    for (int i = 0; i < slots; i++)
        DSC_TRY(reserve_slot(m, &m->slots[i]));
    for (int i = 0; i < 4; i++)
        DSC_TRY(alloc(&m->buf[i], 3, (int64_t[]){m->E, m->max_cap, M}, m->device));
    DSC_TRY(alloc(&m->out, 3, (int64_t[]){B, T, M}, m->device));
    DSC_TRY(alloc(&m->din, 3, (int64_t[]){B, T, M}, m->device));
    DSC_TRY(
        alloc(&m->dlogits, 2, (int64_t[]){S, m->E > 2 ? m->E : 2}, DSC_CPU)); /* also (S, 2) for the residual */
    DSC_TRY(alloc(&m->dweight, 2, (int64_t[]){S, m->o.gate.k}, DSC_CPU));
    DSC_TRY(alloc(&m->dsmall, 2, (int64_t[]){S, M}, m->device));
    DSC_TRY(
        dsc_moe_experts_reserve(m->experts, (int)(slots * m->ep_size), m->max_cap)); /* a slot per source rank */
    return m->mlp ? dsc_moe_experts_reserve(m->mlp, slots, S) : NULL;
}

static dsc_status moe_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    moe_layer *m = self_of(self);
    release(m);
    dsc_status s = reserve(m, slots, B, T);
    if (s) release(m);
    return s;
}

/* ---- forward ----------------------------------------------------------------------------- */

/* Router logits (S, E) = gate input @ Wg^T, with jitter in training when configured. */
static dsc_status route(moe_layer *m, moe_slot *s, const dsc_tensor *x2, dsc_micro_ctx *ctx) {
    const int64_t S = x2->shape[0], M = m->M;
    dsc_tensor logits = view(&s->logits, 2, (int64_t[]){S, m->E});
    const dsc_tensor *gin = x2;
    dsc_tensor jittered;
    s->jittered = ctx->training && m->o.gate.noisy_gate_policy == DSC_MOE_NOISY_GATE_JITTER;
    if (s->jittered) {
        DSC_CHECK(ctx->rng, DSC_ERR_INVALID, "%s: jitter needs a random stream (ctx->rng)", m->base.name);
        dsc_tensor noise = view(&s->noise, 2, x2->shape);
        jittered = view(&s->gate_in, 2, x2->shape);
        DSC_TRY(dsc_moe_gate_jitter(ctx->rng, &noise));
        const float *xv = x2->data, *nv = noise.data;
        float *gv = jittered.data;
        for (int64_t i = 0; i < S * M; i++)
            gv[i] = xv[i] * nv[i];
        gin = &jittered;
    }
    /* the router in f32 under bf16 products too: DeepSpeed's TopKGate casts the gate and its input to fp32 */
    dsc_dtype products = dsc_kernels_set_matmul_dtype(DSC_DTYPE_F32);
    dsc_status st = dsc_kernel_linear_forward(&logits, gin, &m->wg->value, NULL);
    dsc_kernels_set_matmul_dtype(products);
    DSC_TRY(st);
    m->agree_S = S;
    const dsc_moe_gate_capacity_hook hook = {agree_hook, m};
    DSC_TRY(dsc_moe_gate_forward(&m->o.gate, &logits, ctx->training, ctx->rng, &hook, &s->routes));
    if (!m->o.gate.drop_tokens) return NULL; /* the hook agreed already */
    int64_t cap = s->routes.capacity;
    return agree(m, &cap);
}

/* ---- the experts between the two exchanges ----------------------------------------------
 * Piece j of the (E, Cap, M) rows this rank sends is for rank j's experts;
 * what arrives is (ep, E_loc, Cap, M), piece j from rank j, which the bank
 * computes as its own slot (slot * ep + j, Cap rows per FFN), so no axis swap
 * is needed; piece j of the results goes back to rank j. The local piece
 * needs no exchange: it is computed in two halves, the first while the
 * pieces of the other ranks are in flight, the second while their results
 * travel back (o.overlap_alltoall: point-to-point messages, moved on by a
 * kernel progress hook during the expert GEMMs). Without overlap the same
 * pieces run in the same order between two blocking all-to-alls, so both
 * ways give bitwise the same results. */

enum { TAG_TO_EXPERTS = 1, TAG_BACK = 2 };

typedef struct expert_pass {
    moe_layer *m;
    int slot;
    bool backward;
    int64_t Cap;
    dsc_status error; /* the first failure of the progress hook */
    dsc_kernels_progress_fn prev_fn;
    void *prev_arg;
} expert_pass;

static void pass_progress(void *arg) {
    expert_pass *p = arg;
    dsc_comm_request **req = p->m->req;
    for (int64_t i = 0; i < 4 * p->m->ep_size && !p->error; i++) {
        bool done;
        if (req[i]) p->error = dsc_comm_test(&req[i], &done);
    }
    if (p->prev_fn) p->prev_fn(p->prev_arg);
}

static dsc_tensor piece(const moe_layer *m, float *buf, int64_t j, int64_t Cap) {
    return dsc_tensor_view(buf + j * m->E_loc * Cap * m->M, DSC_DTYPE_F32, 3, (int64_t[]){m->E_loc, Cap, m->M},
                           m->device);
}

/* FFNs [first, first + n) of source rank j's piece: in -> out. */
static dsc_status run_piece(expert_pass *p, int64_t j, int first, int n, dsc_tensor *in, dsc_tensor *out) {
    moe_layer *m = p->m;
    const int bank_slot = (int)(p->slot * m->ep_size + j);
    if (p->backward)
        DSC_TRY(dsc_moe_experts_backward_part(m->experts, bank_slot, first, n, in, out, 1.0f / (float)m->ep_size));
    else
        DSC_TRY(dsc_moe_experts_forward_part(m->experts, bank_slot, first, n, in, out));
    const int64_t rows = p->Cap * m->M;
    dsc_tensor part = dsc_tensor_view((float *)out->data + first * rows, DSC_DTYPE_F32, 3,
                                      (int64_t[]){n, p->Cap, m->M}, m->device);
    return tp_sum(m, &part);
}

static dsc_status post(expert_pass *p, const float *send, float *in, float *back) {
    moe_layer *m = p->m;
    for (int64_t j = 0; j < m->ep_size; j++) {
        if (j == m->ep_rank) continue;
        dsc_tensor to = piece(m, (float *)send, j, p->Cap), from = piece(m, in, j, p->Cap);
        dsc_tensor result = piece(m, back, j, p->Cap);
        DSC_TRY(dsc_comm_irecv(m->ep, &from, (int)j, TAG_TO_EXPERTS, &m->req[4 * j]));
        DSC_TRY(dsc_comm_isend(m->ep, &to, (int)j, TAG_TO_EXPERTS, &m->req[4 * j + 1]));
        DSC_TRY(dsc_comm_irecv(m->ep, &result, (int)j, TAG_BACK, &m->req[4 * j + 2]));
    }
    return NULL;
}

/* The pieces in order: the local one's first half, the other ranks' from the next one round, the local second
 * half. */
static dsc_status run_pieces(expert_pass *p, float *in, float *out, float *back, double *t0) {
    moe_layer *m = p->m;
    const bool overlap = m->o.overlap_alltoall;
    const int64_t me = m->ep_rank;
    const int half = (int)(m->E_loc / 2), whole = (int)m->E_loc;
    dsc_tensor own_in = piece(m, in, me, p->Cap), own_out = piece(m, overlap ? back : out, me, p->Cap);
    DSC_TRY(run_piece(p, me, 0, half, &own_in, &own_out));
    lap(m, DSC_MOE_PHASE_EXPERTS, t0);
    for (int64_t i = 1; i < m->ep_size; i++) {
        const int64_t j = (me + i) % m->ep_size;
        dsc_tensor pin = piece(m, in, j, p->Cap), pout = piece(m, out, j, p->Cap);
        if (overlap) {
            DSC_TRY(dsc_comm_wait(&m->req[4 * j]));
            lap(m, DSC_MOE_PHASE_ALLTOALL, t0);
        }
        DSC_TRY(run_piece(p, j, 0, whole, &pin, &pout));
        if (overlap) DSC_TRY(dsc_comm_isend(m->ep, &pout, (int)j, TAG_BACK, &m->req[4 * j + 3]));
        lap(m, DSC_MOE_PHASE_EXPERTS, t0);
    }
    DSC_TRY(run_piece(p, me, half, whole - half, &own_in, &own_out));
    lap(m, DSC_MOE_PHASE_EXPERTS, t0);
    return NULL;
}

/* Overlapped: posts the messages, runs the pieces with the progress hook
 * installed, and waits for what is still in flight (after a failure too,
 * since the buffers must not be reused under open requests). */
static dsc_status run_overlapped(expert_pass *p, const float *send, float *in, float *out, float *back,
                                 double *t0) {
    moe_layer *m = p->m;
    const int64_t n = 4 * m->ep_size;
    dsc_tensor own_to = piece(m, (float *)send, m->ep_rank, p->Cap), own_in = piece(m, in, m->ep_rank, p->Cap);
    DSC_TRY(dsc_tensor_copy(&own_in, &own_to));
    dsc_kernels_get_progress(&p->prev_fn, &p->prev_arg);
    dsc_status s = post(p, send, in, back);
    lap(m, DSC_MOE_PHASE_ALLTOALL, t0);
    if (!s) {
        dsc_kernels_set_progress(pass_progress, p);
        s = run_pieces(p, in, out, back, t0);
        dsc_kernels_set_progress(p->prev_fn, p->prev_arg);
    }
    dsc_status w = dsc_comm_waitall(m->req, (int)n);
    lap(m, DSC_MOE_PHASE_ALLTOALL, t0);
    if (!s)
        s = p->error ? p->error : w;
    else if (p->error)
        dsc_status_free(p->error);
    if (w && w != s) dsc_status_free(w);
    return s;
}

/* One direction's pass over the expert-parallel group: `send` (E, Cap, M)
 * goes to the experts' ranks, arriving in `in` (kept: in the forward the bank
 * reads it again in the backward), the experts write `out`, and the results
 * come back to `back` (E, Cap, M) in expert order. With ep = 1 only the
 * experts run, from `send` into `back`. */
static dsc_status expert_pass_run(moe_layer *m, int slot, bool backward, int64_t Cap, const float *send, float *in,
                                  float *out, float *back, double *t0) {
    expert_pass p = {.m = m, .slot = slot, .backward = backward, .Cap = Cap};
    if (m->ep_size == 1) {
        dsc_tensor x = piece(m, (float *)send, 0, Cap), y = piece(m, back, 0, Cap);
        DSC_TRY(run_piece(&p, 0, 0, (int)m->E_loc, &x, &y));
        lap(m, DSC_MOE_PHASE_EXPERTS, t0);
        return NULL;
    }
    const char *what = backward ? "the gradients' exchange" : "the tokens' exchange";
    dsc_status s;
    if (m->o.overlap_alltoall) {
        s = run_overlapped(&p, send, in, out, back, t0);
    } else {
        const int64_t shape[3] = {m->E, Cap, m->M};
        dsc_tensor a = dsc_tensor_view((void *)send, DSC_DTYPE_F32, 3, shape, m->device);
        dsc_tensor b = dsc_tensor_view(in, DSC_DTYPE_F32, 3, shape, m->device);
        dsc_tensor c = dsc_tensor_view(out, DSC_DTYPE_F32, 3, shape, m->device);
        dsc_tensor d = dsc_tensor_view(back, DSC_DTYPE_F32, 3, shape, m->device);
        s = dsc_comm_alltoall(m->ep, &a, &b);
        lap(m, DSC_MOE_PHASE_ALLTOALL, t0);
        if (!s) s = run_pieces(&p, in, out, back, t0);
        if (!s) s = dsc_comm_alltoall(m->ep, &c, &d);
        lap(m, DSC_MOE_PHASE_ALLTOALL, t0);
    }
    return s ? dsc_error_wrap(s, "%s: %s over expert-parallel group \"%s\"", m->base.name, what,
                              dsc_comm_name(m->ep))
             : NULL;
}

/* PR-MoE: out = c0 * moe + c1 * mlp with (c0, c1) = softmax(x @ Wc^T + bc). */
static dsc_status residual_forward(moe_layer *m, int slot, moe_slot *s, const dsc_tensor *x2, dsc_tensor *out2) {
    const int64_t S = x2->shape[0], M = m->M;
    dsc_tensor x3 = view(x2, 3, (int64_t[]){1, S, M}), mlp = view(&s->mlp_out, 3, (int64_t[]){1, S, M});
    dsc_tensor coef = view(&s->coef, 2, (int64_t[]){S, 2});
    DSC_TRY(dsc_moe_experts_forward(m->mlp, slot, &x3, &mlp));
    DSC_TRY(dsc_kernel_linear_forward(&coef, x2, &m->wc->value, &m->bc->value));
    DSC_TRY(dsc_kernel_softmax(&coef, &coef));
    const float *c = coef.data, *a = s->moe_out.data, *b = mlp.data;
    float *o = out2->data;
    for (int64_t t = 0; t < S; t++)
        for (int64_t j = 0; j < M; j++)
            o[t * M + j] = c[2 * t] * a[t * M + j] + c[2 * t + 1] * b[t * M + j];
    return NULL;
}

static void count_stats(moe_layer *m, const dsc_moe_gate_result *r) {
    m->st_forwards++;
    m->st_tokens += r->num_tokens;
    m->st_dropped_tokens += r->dropped_tokens;
    m->st_capacity = r->capacity;
    m->st_l_aux += r->l_aux;
    m->st_z_loss += r->z_loss;
    for (int64_t e = 0; e < m->E; e++) {
        m->st_routed[e] += r->exp_counts[e];
        m->st_kept[e] += r->kept_counts[e];
        m->st_dropped[e] += r->dropped_counts[e];
    }
}

static dsc_status moe_forward(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out,
                              dsc_micro_ctx *ctx) {
    moe_layer *m = self_of(self);
    DSC_CHECK(slot >= 0 && slot < m->nslots, DSC_ERR_INVALID, "%s: slot %d outside the %d reserved", self->name,
              slot, m->nslots);
    DSC_TRY(dsc_tensor_expect(in, "input", DSC_DTYPE_F32, 3, (const int64_t[]){-1, -1, m->M}));
    const int64_t S = in->shape[0] * in->shape[1], M = m->M;
    DSC_CHECK(in->shape[0] <= self->max_B && in->shape[1] <= self->max_T, DSC_ERR_INVALID,
              "%s: input (%lld, %lld, %lld) exceeds the reserved micro-batch (%lld, %lld)", self->name,
              (long long)in->shape[0], (long long)in->shape[1], (long long)M, (long long)self->max_B,
              (long long)self->max_T);
    moe_slot *s = &m->slots[slot];
    s->in = *in;
    s->S = S;
    dsc_tensor x2 = view(in, 2, (int64_t[]){S, M});
    double t0 = now_s();
    DSC_TRY(route(m, s, &x2, ctx));
    lap(m, DSC_MOE_PHASE_GATE, &t0);
    const int64_t Cap = s->routes.capacity;
    DSC_CHECK(Cap <= m->max_cap, DSC_ERR_INTERNAL, "%s: capacity %lld exceeds the reserved %lld", self->name,
              (long long)Cap, (long long)m->max_cap);
    DSC_TRY(moe_rows_padded(&s->routes, m->row0));
    float *dispatched = m->ep_size == 1 ? s->xin.data : m->buf[0].data; /* the bank keeps its input */
    DSC_TRY(moe_dispatch(&s->routes, m->row0, x2.data, M, dispatched));
    lap(m, DSC_MOE_PHASE_DISPATCH, &t0);
    DSC_TRY(expert_pass_run(m, slot, false, Cap, dispatched, s->xin.data, m->buf[2].data, s->y.data, &t0));
    *out = view(&m->out, 3, in->shape);
    dsc_tensor out2 = view(out, 2, (int64_t[]){S, M});
    DSC_TRY(moe_combine(&s->routes, m->row0, s->y.data, M, m->o.use_residual ? s->moe_out.data : out2.data));
    if (m->o.use_residual) DSC_TRY(residual_forward(m, slot, s, &x2, &out2));
    lap(m, DSC_MOE_PHASE_COMBINE, &t0);
    ctx->aux_loss += s->routes.loss;
    count_stats(m, &s->routes);
    return NULL;
}

/* ---- backward ---------------------------------------------------------------------------- */

/* Residual part: gradients of the coefficients and the MLP; returns in
 * `dmoe` (S, M) the gradient reaching the combined expert output, and
 * writes the residual's input gradient into din2 (overwritten). */
static dsc_status residual_backward(moe_layer *m, int slot, moe_slot *s, const dsc_tensor *x2,
                                    const dsc_tensor *dout2, dsc_tensor *dmoe, dsc_tensor *din2) {
    const int64_t S = x2->shape[0], M = m->M;
    const float *c = s->coef.data, *a = s->moe_out.data, *b = s->mlp_out.data, *g = dout2->data;
    float *dm = dmoe->data, *dmlp = m->dsmall.data;
    dsc_tensor dz = view(&m->dlogits, 2, (int64_t[]){S, 2}); /* dlogits is free until the gate backward */
    float *dzv = dz.data;
    for (int64_t t = 0; t < S; t++) {
        double d0 = 0, d1 = 0;
        for (int64_t j = 0; j < M; j++) {
            const int64_t i = t * M + j;
            d0 += (double)g[i] * a[i];
            d1 += (double)g[i] * b[i];
            dm[i] = c[2 * t] * g[i];
            dmlp[i] = c[2 * t + 1] * g[i];
        }
        const double mean = c[2 * t] * d0 + c[2 * t + 1] * d1; /* softmax backward */
        dzv[2 * t] = (float)(c[2 * t] * (d0 - mean));
        dzv[2 * t + 1] = (float)(c[2 * t + 1] * (d1 - mean));
    }
    const int64_t shape3[3] = {1, S, M};
    dsc_tensor dmlp3 = view(&m->dsmall, 3, shape3), din3 = view(din2, 3, shape3);
    DSC_TRY(dsc_moe_experts_backward(m->mlp, slot, &dmlp3, &din3, 1.0f));
    DSC_TRY(dsc_kernel_linear_backward(NULL, &m->wc->grad, &m->bc->grad, &dz, x2, &m->wc->value));
    return dsc_kernel_gemm(din2, &dz, &m->wc->value, NULL, false, false, 1.0f, 1.0f); /* din += dz @ Wc */
}

/* Router and gate: d_logits from the combine-weight gradients and the gate
 * loss, then Wg's gradient and the input gradient added to din2. */
static dsc_status gate_backward(moe_layer *m, moe_slot *s, const dsc_tensor *x2, dsc_tensor *din2,
                                const dsc_micro_ctx *ctx) {
    const int64_t S = s->S, M = m->M;
    dsc_tensor logits = view(&s->logits, 2, (int64_t[]){S, m->E}), dl = view(&m->dlogits, 2, logits.shape);
    dsc_tensor dw = view(&m->dweight, 2, (int64_t[]){S, m->o.gate.k});
    DSC_TRY(dsc_moe_gate_backward(&m->o.gate, &logits, &s->routes, &dw, ctx->loss_scale, &dl));
    dsc_tensor gin = s->jittered ? view(&s->gate_in, 2, x2->shape) : *x2, dg = view(&m->dsmall, 2, x2->shape);
    dsc_dtype products = dsc_kernels_set_matmul_dtype(DSC_DTYPE_F32); /* as the forward: the router in f32 */
    dsc_status st = dsc_kernel_linear_backward(&dg, &m->wg->grad, NULL, &dl, &gin, &m->wg->value);
    dsc_kernels_set_matmul_dtype(products);
    DSC_TRY(st);
    float *d = din2->data, *gv = dg.data;
    const float *noise = s->jittered ? s->noise.data : NULL;
    for (int64_t i = 0; i < S * M; i++)
        d[i] += noise ? gv[i] * noise[i] : gv[i];
    return NULL;
}

static dsc_status moe_backward(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din,
                               dsc_micro_ctx *ctx) {
    moe_layer *m = self_of(self);
    DSC_CHECK(slot >= 0 && slot < m->nslots && m->slots[slot].in.ndim == 3, DSC_ERR_INVALID,
              "%s: backward on slot %d without a pending forward", self->name, slot);
    moe_slot *s = &m->slots[slot];
    DSC_TRY(dsc_tensor_expect(dout, "output gradient", DSC_DTYPE_F32, 3, s->in.shape));
    const int64_t S = s->S, M = m->M, Cap = s->routes.capacity;
    dsc_tensor x2 = view(&s->in, 2, (int64_t[]){S, M}), dout2 = view(dout, 2, x2.shape);
    *din = view(&m->din, 3, s->in.shape);
    dsc_tensor din2 = view(din, 2, x2.shape);
    const float *dmoe = dout2.data;
    double t0 = now_s();
    if (m->o.use_residual) {
        /* The gradient overwrites moe_out row by row after reading it. */
        dsc_tensor dm = view(&s->moe_out, 2, x2.shape);
        DSC_TRY(residual_backward(m, slot, s, &x2, &dout2, &dm, &din2));
        dmoe = dm.data;
    } else {
        memset(din2.data, 0, (size_t)(S * M) * sizeof(float));
    }
    float *dy = m->buf[0].data, *ddisp = m->buf[3].data;
    DSC_TRY(moe_rows_padded(&s->routes, m->row0));
    DSC_TRY(moe_combine_backward(&s->routes, m->row0, dmoe, s->y.data, M, dy, m->dweight.data));
    lap(m, DSC_MOE_PHASE_COMBINE, &t0);
    DSC_TRY(expert_pass_run(m, slot, true, Cap, dy, m->buf[1].data, m->buf[2].data, ddisp, &t0));
    DSC_TRY(moe_dispatch_backward(&s->routes, m->row0, ddisp, M, din2.data, true));
    lap(m, DSC_MOE_PHASE_DISPATCH, &t0);
    DSC_TRY(gate_backward(m, s, &x2, &din2, ctx));
    lap(m, DSC_MOE_PHASE_GATE, &t0);
    s->in = (dsc_tensor){0};
    return NULL;
}

/* ---- creation ---------------------------------------------------------------------------- */

static void moe_destroy(dsc_layer *self) {
    moe_layer *m = self_of(self);
    release(m);
    dsc_moe_experts_destroy(m->experts);
    dsc_moe_experts_destroy(m->mlp);
    free(m->st_routed);
    free(m->st_kept);
    free(m->st_dropped);
    free(m->row0);
    free(m->req);
    free(m);
}

/* Per token: the routes' rows in and out of the experts (K*cf of them, each M in, M out, F hidden
 * twice or, SwiGLU, 3 times, in the experts' kept type), logits, and the residual's share. */
static void activation_bytes(moe_layer *m, dsc_dtype kept) {
    const double rows = m->o.gate.k * m->o.gate.capacity_factor, f32 = sizeof(float),
                 hidden = (double)((m->o.expert_kind == DSC_MOE_EXPERT_KIND_SWIGLU ? 3 : 2) * m->F) *
                          (double)dsc_dtype_size(kept);
    m->base.activation_bytes_per_token =
        (int64_t)(rows * (f32 * 2.0 * (double)m->M + hidden) + f32 * (double)m->E +
                  (m->o.use_residual ? f32 * (3.0 * (double)m->M + 2.0) + hidden : 0.0));
}

/* Mixed precision: the experts' (and the residual MLP's) hidden activations in 2 bytes. */
static void moe_set_saved_dtype(dsc_layer *self, dsc_dtype dtype) {
    moe_layer *m = self_of(self);
    if (m->mlp) dsc_moe_experts_set_saved_dtype(m->mlp, dtype);
    activation_bytes(m, dsc_moe_experts_set_saved_dtype(m->experts, dtype));
}

static const dsc_layer_ops moe_ops = {.type = "moe",
                                      .reserve = moe_reserve,
                                      .forward = moe_forward,
                                      .backward = moe_backward,
                                      .destroy = moe_destroy,
                                      .set_saved_dtype = moe_set_saved_dtype};

dsc_status dsc_moe_check_parallel(int num_experts, int ep_size, int ranks) {
    DSC_CHECK(ep_size >= 1, DSC_ERR_INVALID, "moe.ep_size must be >= 1 (got %d)", ep_size);
    DSC_CHECK(num_experts >= 1 && num_experts % ep_size == 0, DSC_ERR_INVALID,
              "moe.ep_size %d does not divide moe.num_experts %d: each rank of an expert-parallel group holds "
              "num_experts / ep_size experts",
              ep_size, num_experts);
    DSC_CHECK(ranks >= 1 && ranks % ep_size == 0, DSC_ERR_INVALID,
              "moe.ep_size %d does not divide the %d ranks that share the experts (world size / pipeline stages)",
              ep_size, ranks);
    return NULL;
}

static dsc_status declare(moe_layer *m, const dsc_model_config *mc, dsc_param_store *store) {
    char prefix[sizeof m->base.name + 32];
    snprintf(prefix, sizeof prefix, "%s.gate.weight", m->base.name);
    DSC_TRY(
        dsc_params_declare(store, prefix, 2, (int64_t[]){m->E, m->M}, 0, DSC_INIT_NORMAL, mc->init_std, &m->wg));
    const float std_out = mc->init_std / sqrtf(2.0f * (float)mc->n_layer);
    dsc_moe_experts_options eo = {.kind = m->o.expert_kind,
                                  .d_model = m->M,
                                  .d_ff = mc->d_ff,
                                  .count = (int)m->E_loc,
                                  .first = (int)(m->ep_rank * m->E_loc),
                                  .flags = DSC_PARAM_EXPERT,
                                  .init_std = mc->init_std,
                                  .init_std_out = std_out};
    if (m->o.expert_tp) {
        eo.d_ff = m->o.tp_nf;
        eo.ff_global = mc->d_ff;
        eo.ff_start = m->o.tp_f0;
        eo.tp_rank = dsc_comm_rank(m->o.expert_tp);
    }
    snprintf(prefix, sizeof prefix, "%s.experts", m->base.name);
    DSC_TRY(dsc_moe_experts_create(&eo, prefix, store, m->device, &m->experts));
    if (!m->o.use_residual) return NULL;
    eo.d_ff = mc->d_ff; /* the residual MLP stays whole */
    eo.ff_global = eo.ff_start = 0;
    eo.count = 1;
    eo.first = -1;
    eo.flags = 0;
    snprintf(prefix, sizeof prefix, "%s.mlp", m->base.name);
    DSC_TRY(dsc_moe_experts_create(&eo, prefix, store, m->device, &m->mlp));
    snprintf(prefix, sizeof prefix, "%s.coefficient.weight", m->base.name);
    DSC_TRY(dsc_params_declare(store, prefix, 2, (int64_t[]){2, m->M}, 0, DSC_INIT_NORMAL, mc->init_std, &m->wc));
    snprintf(prefix, sizeof prefix, "%s.coefficient.bias", m->base.name);
    return dsc_params_declare(store, prefix, 1, (int64_t[]){2}, DSC_PARAM_NO_DECAY, DSC_INIT_ZEROS, 0, &m->bc);
}

/* The layer's parameter list: router, experts, then the residual's. */
static dsc_status collect_params(moe_layer *m) {
    const int ne = dsc_moe_experts_param_count(m->experts), nr = m->mlp ? dsc_moe_experts_param_count(m->mlp) : 0;
    const int n = 1 + ne + (m->mlp ? nr + 2 : 0);
    dsc_param **list = malloc((size_t)n * sizeof *list);
    DSC_CHECK(list, DSC_ERR_NOMEM, "%s: parameter list of %d", m->base.name, n);
    int i = 0;
    list[i++] = m->wg;
    for (int j = 0; j < ne; j++)
        list[i++] = dsc_moe_experts_params(m->experts)[j];
    for (int j = 0; j < nr; j++)
        list[i++] = dsc_moe_experts_params(m->mlp)[j];
    if (m->mlp) {
        list[i++] = m->wc;
        list[i++] = m->bc;
    }
    dsc_status s = dsc_layer_set_params(&m->base, list, NULL, n);
    free(list);
    return s;
}

dsc_status dsc_moe_layer_create(const dsc_moe_options *o, const dsc_model_config *mc, int block,
                                dsc_param_store *store, dsc_device device, dsc_comm *ep, dsc_layer **out) {
    *out = NULL;
    DSC_CHECK(device.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED,
              "MoE layer of block %d: only CPU devices are supported (the gate and dispatch run on the host)",
              block);
    const int ep_size = ep ? dsc_comm_size(ep) : 1;
    DSC_TRY(dsc_moe_check_parallel(o->num_experts, ep_size, ep_size));
    DSC_TRY(dsc_moe_gate_config_validate(&o->gate, o->num_experts));
    DSC_CHECK(mc->d_model >= 1 && mc->d_ff >= 1, DSC_ERR_INVALID,
              "MoE layer of block %d: d_model and d_ff must be >= 1", block);
    moe_layer *m = calloc(1, sizeof *m);
    DSC_CHECK(m, DSC_ERR_NOMEM, "MoE layer of block %d", block);
    m->base.ops = &moe_ops;
    snprintf(m->base.name, sizeof m->base.name, "layers.%d.moe", block);
    m->o = *o;
    m->M = mc->d_model;
    m->E = o->num_experts;
    m->ep = ep;
    m->ep_size = ep_size;
    m->ep_rank = ep ? dsc_comm_rank(ep) : 0;
    m->E_loc = m->E / ep_size;
    m->device = device;
    m->st_routed = calloc((size_t)m->E, sizeof *m->st_routed);
    m->st_kept = calloc((size_t)m->E, sizeof *m->st_kept);
    m->st_dropped = calloc((size_t)m->E, sizeof *m->st_dropped);
    m->row0 = calloc((size_t)m->E + 1, sizeof *m->row0);
    m->req = calloc((size_t)(4 * ep_size), sizeof *m->req);
    dsc_status s = m->st_routed && m->st_kept && m->st_dropped && m->row0 && m->req
                       ? NULL
                       : dsc_error(DSC_ERR_NOMEM, "%s: statistics", m->base.name);
    if (!s) s = declare(m, mc, store);
    if (!s) s = collect_params(m);
    if (s) {
        moe_destroy(&m->base);
        return s;
    }
    m->F = mc->d_ff;
    activation_bytes(m, DSC_DTYPE_F32);
    *out = &m->base;
    return NULL;
}

/* ---- statistics -------------------------------------------------------------------------- */

bool moe_layer_is(const dsc_layer *layer) {
    return layer && layer->ops == &moe_ops;
}

void moe_layer_stats(const dsc_layer *layer, dsc_moe_stats *out) {
    const moe_layer *m = (const moe_layer *)layer;
    *out = (dsc_moe_stats){(int)m->E,  m->st_forwards, m->st_tokens, m->st_dropped_tokens, m->st_routed,
                           m->st_kept, m->st_dropped,  m->st_l_aux,  m->st_z_loss,         m->st_capacity,
                           {0}};
    memcpy(out->seconds, m->st_seconds, sizeof out->seconds);
}

const char *dsc_moe_phase_name(dsc_moe_phase phase) {
    static const char *const names[DSC_MOE_PHASE_COUNT] = {"gate", "dispatch", "all-to-all", "experts", "combine"};
    return (unsigned)phase < DSC_MOE_PHASE_COUNT ? names[phase] : "unknown";
}

void moe_layer_stats_reset(dsc_layer *layer) {
    moe_layer *m = self_of(layer);
    m->st_forwards = m->st_tokens = m->st_dropped_tokens = m->st_capacity = 0;
    m->st_l_aux = m->st_z_loss = 0;
    memset(m->st_seconds, 0, sizeof m->st_seconds);
    memset(m->st_routed, 0, (size_t)m->E * sizeof *m->st_routed);
    memset(m->st_kept, 0, (size_t)m->E * sizeof *m->st_kept);
    memset(m->st_dropped, 0, (size_t)m->E * sizeof *m->st_dropped);
}
