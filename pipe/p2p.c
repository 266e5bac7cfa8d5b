/* Point-to-point transfers between virtual stages over the comm layer (MPI
 * for CPU tensors, NCCL for CUDA ones), each bounded by the p2p timeout, so
 * a silent peer is a DSC_ERR_TIMEOUT naming its stage rather than a hang.
 *
 * Sends are posted non-blocking and completed by pipe_p2p_wait_sends (the
 * executor calls it before compute reuses memory); receives complete before
 * they return, since the next instruction computes on them. Within a step
 * both ends handle their messages in the schedule's global order, so
 * posting sends early cannot deadlock where blocking sends would not.
 *
 * The meta handshake: the first activation on each edge in a batch is
 * preceded by a small int32 header (magic, sender stage and chunk, dtype,
 * rank, dims). The receiver checks it against what it accepts and caches it
 * for the rest of the batch; a mismatch is an error naming both stages,
 * never a silent reinterpretation. Gradients need no header: the receiver
 * sizes them from its own outputs, and the comm layer rejects a message of
 * another size.
 *
 * Not here: which transfer happens when (the schedule), what the tensors
 * mean (the executor). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipe/p2p.h"

enum { META_LEN = 16, META_MAGIC = 0x44534350 /* "DSCP" */ };
enum { TAG_META = 0, TAG_ACTIVATION = 1, TAG_GRAD = 2, TAG_STREAM = 3 };
enum { TAG_KINDS = TAG_STREAM + PIPE_P2P_STREAMS, TAG_EPOCHS = 30000 / TAG_KINDS };

/* p2p sets this process has created: each set's tags are offset by its
 * epoch, agreed over the pipe, so a message left unreceived by a failed
 * pipeline never matches a receive of a later one on the same communicator.
 * (The transfers use the pipe communicator itself: freeing a private one
 * with unreceived messages lets MPI hand its context to the next one.) */
static int32_t p2p_epochs;

typedef struct edge {
    int32_t meta_out[META_LEN]; /* header being sent to this peer virtual stage */
    bool sent;                  /* header sent in this batch */
    bool seen;                  /* header received in this batch */
    int ndim;
    int64_t shape[DSC_MAX_DIMS]; /* received shape */
} edge;

struct pipe_p2p {
    dsc_comm *comm;
    int stage, stages, chunks;
    bool tags;    /* distinct tags per message kind and epoch (MPI); NCCL takes only tag 0 */
    int tag_base; /* 1 + TAG_KINDS * epoch */
    edge *edges;  /* [stages * chunks] by peer virtual stage */
    dsc_comm_request **pending;
    int n_pending, cap_pending;
};

dsc_status pipe_p2p_create(dsc_comm *pipe, int chunks, pipe_p2p **out) {
    *out = NULL;
    pipe_p2p *p = calloc(1, sizeof *p);
    DSC_CHECK(p, DSC_ERR_NOMEM, "pipeline p2p: out of memory");
    p->comm = pipe;
    p->stage = dsc_comm_rank(pipe);
    p->stages = dsc_comm_size(pipe);
    p->chunks = chunks;
    p->tags = strcmp(dsc_comm_backend_name(pipe), "nccl") != 0;
    p->edges = calloc((size_t)(p->stages * chunks), sizeof *p->edges);
    p->cap_pending = 8;
    p->pending = calloc((size_t)p->cap_pending, sizeof *p->pending);
    dsc_status s = p->edges && p->pending ? NULL : dsc_error(DSC_ERR_NOMEM, "pipeline p2p: tables");
    int32_t epoch = p2p_epochs;
    dsc_tensor e = dsc_tensor_view(&epoch, DSC_DTYPE_I32, 1, (int64_t[]){1}, DSC_CPU);
    if (!s) s = dsc_comm_allreduce(pipe, &e, DSC_REDUCE_OP_MAX);
    if (s) {
        pipe_p2p_destroy(p);
        return dsc_error_wrap(s, "pipeline p2p: agreeing on the message tags");
    }
    p2p_epochs = epoch + 1;
    p->tag_base = 1 + TAG_KINDS * (epoch % TAG_EPOCHS);
    *out = p;
    return NULL;
}

void pipe_p2p_destroy(pipe_p2p *p) {
    if (!p) return;
    dsc_status_free(pipe_p2p_wait_sends(p));
    free(p->edges);
    free(p->pending);
    free(p);
}

void pipe_p2p_begin_batch(pipe_p2p *p) {
    for (int i = 0; i < p->stages * p->chunks; i++)
        p->edges[i].sent = p->edges[i].seen = false;
}

static edge *edge_of(pipe_p2p *p, int peer_stage, int peer_chunk) {
    return &p->edges[peer_chunk * p->stages + peer_stage];
}
static int tag(const pipe_p2p *p, int kind) {
    return p->tags ? p->tag_base + kind : 0;
}

static dsc_status post_send(pipe_p2p *p, const dsc_tensor *t, int peer, int kind) {
    if (p->n_pending == p->cap_pending) {
        dsc_comm_request **grown = realloc(p->pending, (size_t)p->cap_pending * 2 * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "pipeline p2p: %d pending sends", p->n_pending);
        p->pending = grown;
        p->cap_pending *= 2;
    }
    DSC_TRY(dsc_comm_isend(p->comm, t, peer, tag(p, kind), &p->pending[p->n_pending]));
    p->n_pending++;
    return NULL;
}

dsc_status pipe_p2p_wait_sends(pipe_p2p *p) {
    dsc_status first = NULL;
    for (int i = 0; i < p->n_pending; i++) {
        dsc_status s = dsc_comm_wait(&p->pending[i]);
        if (s && !first)
            first = s;
        else
            dsc_status_free(s);
    }
    p->n_pending = 0;
    return first;
}

static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < len) snprintf(buf + k, len - k, ")");
    return buf;
}

dsc_status pipe_p2p_send_activation(pipe_p2p *p, const dsc_tensor *t, int chunk, int peer_stage, int peer_chunk) {
    edge *e = edge_of(p, peer_stage, peer_chunk);
    dsc_status s = NULL;
    if (!e->sent) {
        int32_t *h = e->meta_out;
        memset(h, 0, sizeof e->meta_out);
        h[0] = META_MAGIC, h[1] = p->stage, h[2] = chunk, h[3] = (int32_t)t->dtype, h[4] = t->ndim;
        for (int i = 0; i < t->ndim; i++)
            h[5 + i] = (int32_t)t->shape[i];
        dsc_tensor meta = dsc_tensor_view(h, DSC_DTYPE_I32, 1, (int64_t[]){META_LEN}, DSC_CPU);
        s = post_send(p, &meta, peer_stage, TAG_META);
        e->sent = !s;
    }
    if (!s) s = post_send(p, t, peer_stage, TAG_ACTIVATION);
    if (s)
        return dsc_error_wrap(s, "pipeline stage %d chunk %d: sending activations to stage %d chunk %d", p->stage,
                              chunk, peer_stage, peer_chunk);
    return NULL;
}

/* Checks a received header against what `buf` accepts; records the shape. */
static dsc_status check_meta(pipe_p2p *p, const int32_t *h, const dsc_tensor *buf, int chunk, int peer_stage,
                             int peer_chunk, edge *e) {
    DSC_CHECK(
        h[0] == META_MAGIC && h[1] == peer_stage && h[2] == peer_chunk, DSC_ERR_INVALID,
        "pipeline stage %d chunk %d: the activation header from stage %d chunk %d is garbled or from another "
        "sender (magic %#x, stage %d, chunk %d): the stages disagree about the schedule",
        p->stage, chunk, peer_stage, peer_chunk, (unsigned)h[0], h[1], h[2]);
    int ndim = h[4];
    bool ok = h[3] == (int32_t)buf->dtype && ndim == buf->ndim;
    int64_t shape[DSC_MAX_DIMS] = {0};
    for (int i = 0; i < ndim && i < DSC_MAX_DIMS; i++) {
        shape[i] = h[5 + i];
        bool last = i == ndim - 1;
        ok = ok && shape[i] >= 1 && (last ? shape[i] == buf->shape[i] : shape[i] <= buf->shape[i]);
    }
    if (!ok) {
        char got[96], want[96];
        const char *dtype = (unsigned)h[3] < DSC_DTYPE_COUNT ? dsc_dtype_name((dsc_dtype)h[3]) : "unknown-dtype";
        return dsc_error(
            DSC_ERR_INVALID,
            "pipeline stage %d chunk %d: stage %d chunk %d sends activations of shape %s %s, but stage %d "
            "accepts at most %s %s (the last dimension exactly): the stages' models disagree",
            p->stage, chunk, peer_stage, peer_chunk,
            shape_text(ndim > 0 && ndim <= DSC_MAX_DIMS ? ndim : 0, shape, got, sizeof got), dtype, p->stage,
            shape_text(buf->ndim, buf->shape, want, sizeof want), dsc_dtype_name(buf->dtype));
    }
    e->ndim = ndim;
    memcpy(e->shape, shape, sizeof shape);
    e->seen = true;
    return NULL;
}

static dsc_status recv_activation(pipe_p2p *p, dsc_tensor *buf, int chunk, int peer_stage, int peer_chunk,
                                  dsc_tensor *out) {
    edge *e = edge_of(p, peer_stage, peer_chunk);
    if (!e->seen) {
        int32_t h[META_LEN];
        dsc_tensor meta = dsc_tensor_view(h, DSC_DTYPE_I32, 1, (int64_t[]){META_LEN}, DSC_CPU);
        DSC_TRY(dsc_comm_recv(p->comm, &meta, peer_stage, tag(p, TAG_META)));
        DSC_TRY(check_meta(p, h, buf, chunk, peer_stage, peer_chunk, e));
    }
    *out = dsc_tensor_view(buf->data, buf->dtype, e->ndim, e->shape, buf->device);
    return dsc_comm_recv(p->comm, out, peer_stage, tag(p, TAG_ACTIVATION));
}

dsc_status pipe_p2p_recv_activation(pipe_p2p *p, dsc_tensor *buf, int chunk, int peer_stage, int peer_chunk,
                                    dsc_tensor *out) {
    dsc_status s = recv_activation(p, buf, chunk, peer_stage, peer_chunk, out);
    if (s)
        return dsc_error_wrap(s, "pipeline stage %d chunk %d: receiving activations from stage %d chunk %d",
                              p->stage, chunk, peer_stage, peer_chunk);
    return NULL;
}

dsc_status pipe_p2p_send_grad(pipe_p2p *p, const dsc_tensor *t, int chunk, int peer_stage, int peer_chunk) {
    dsc_status s = post_send(p, t, peer_stage, TAG_GRAD);
    if (s)
        return dsc_error_wrap(s, "pipeline stage %d chunk %d: sending gradients to stage %d chunk %d", p->stage,
                              chunk, peer_stage, peer_chunk);
    return NULL;
}

dsc_status pipe_p2p_recv_grad(pipe_p2p *p, dsc_tensor *t, int chunk, int peer_stage, int peer_chunk) {
    dsc_status s = dsc_comm_recv(p->comm, t, peer_stage, tag(p, TAG_GRAD));
    if (s)
        return dsc_error_wrap(s, "pipeline stage %d chunk %d: receiving gradients from stage %d chunk %d",
                              p->stage, chunk, peer_stage, peer_chunk);
    return NULL;
}

dsc_status pipe_p2p_isend_stream(pipe_p2p *p, const dsc_tensor *t, int peer_stage, int stream,
                                 dsc_comm_request **req) {
    dsc_status s = dsc_comm_isend(p->comm, t, peer_stage, tag(p, TAG_STREAM + stream), req);
    if (s)
        return dsc_error_wrap(s, "pipeline stage %d: sending stream %d to stage %d", p->stage, stream, peer_stage);
    return NULL;
}

dsc_status pipe_p2p_recv_stream(pipe_p2p *p, dsc_tensor *t, int peer_stage, int stream) {
    dsc_status s = dsc_comm_recv(p->comm, t, peer_stage, tag(p, TAG_STREAM + stream));
    if (s)
        return dsc_error_wrap(s, "pipeline stage %d: receiving stream %d from stage %d", p->stage, stream,
                              peer_stage);
    return NULL;
}
