/* signature.c — checked collectives (dsc_comm_options.check_collectives,
 * or DSC_COMM_CHECK=1 for a whole job): before a collective moves data, its
 * ranks agree that they entered the same operation with the same element
 * type, size, reduce op, root and counts. Without the check, ranks that
 * disagree on a size (a bug in the caller, or a config read differently on
 * one rank) make MPI write past a buffer or deliver a truncated piece;
 * with it, every rank returns the same error naming the first rank that
 * differs and both values, before any payload moves, so the communicator
 * stays usable. It costs one small all-gather per collective (two for
 * all-to-all-v, whose counts must also match pairwise: what rank i sends to
 * j is what j expects from i), which is why it is opt-in, like
 * TORCH_DISTRIBUTED_DEBUG=DETAIL.
 * Not here: the local argument checks every collective makes (collectives.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_internal.h"

enum { FIELDS = 6 };

/* What every rank must agree on, as int64s for one all-gather. */
static void encode(const dsc_comm_signature *sig, int64_t out[FIELDS]) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the counts, when the op has them */
    for (int i = 0; sig->counts && i < sig->n_counts; i++) {
        h ^= (uint64_t)sig->counts[i];
        h *= 1099511628211ull;
    }
    out[0] = sig->op;
    out[1] = sig->dtype;
    out[2] = sig->elements;
    out[3] = sig->reduce_op;
    out[4] = sig->root;
    out[5] = (int64_t)(h >> 1);
}

/* Rank `rank`'s signature differs from rank 0's (`base`): the same message on every rank. */
static dsc_status disagreement(const dsc_comm *c, dsc_comm_op op, int rank, const int64_t *base,
                               const int64_t *theirs) {
    const char *what = dsc_comm_op_name(op);
    if (base[0] != theirs[0])
        return dsc_error(DSC_ERR_INVALID,
                         "%s on communicator \"%s\": rank %d entered %s while rank 0 entered %s (checked "
                         "collectives)",
                         what, c->name, rank, dsc_comm_op_name((dsc_comm_op)theirs[0]),
                         dsc_comm_op_name((dsc_comm_op)base[0]));
    if (base[1] != theirs[1])
        return dsc_error(DSC_ERR_INVALID, "%s on communicator \"%s\": rank %d passes %s tensors, rank 0 %s", what,
                         c->name, rank, dsc_dtype_name((dsc_dtype)theirs[1]), dsc_dtype_name((dsc_dtype)base[1]));
    static const char *const field[] = {"", "", "elements", "reduce op", "root", "counts (hash)"};
    int f = 2;
    while (f < FIELDS - 1 && base[f] == theirs[f])
        f++;
    return dsc_error(DSC_ERR_INVALID,
                     "%s on communicator \"%s\": ranks disagree on %s: rank %d has %lld, rank 0 has %lld (checked "
                     "collectives)",
                     what, c->name, field[f], rank, (long long)theirs[f], (long long)base[f]);
}

/* One exchange's buffers. A wait that fails (a peer never came) leaves MPI
 * holding them, since MPI cannot cancel a collective: they are then left to
 * MPI, never freed, as mpi_backend.c does with its own. */
typedef struct exchange {
    MPI_Request req;
    int64_t out[FIELDS], *in;
} exchange;

static dsc_status finish_exchange(dsc_comm *c, const char *what, int rc, const char *call, exchange *x) {
    dsc_status s = dsc_comm_mpi_check(rc, call, c);
    if (!s) s = dsc_comm_mpi_wait(c, what, -1, &x->req, 1, MPI_STATUSES_IGNORE);
    return s;
}

static dsc_status new_exchange(const dsc_comm *c, const char *what, size_t in_elems, exchange **out) {
    exchange *x = calloc(1, sizeof *x);
    int64_t *in = calloc(in_elems, sizeof *in);
    if (!x || !in) {
        free(x);
        free(in);
        return dsc_error(DSC_ERR_NOMEM, "%s on communicator \"%s\": checking the signature", what, c->name);
    }
    x->in = in;
    *out = x;
    return NULL;
}

static void free_exchange(exchange *x, dsc_status s) {
    if (s && dsc_status_code(s) != DSC_ERR_INVALID) return; /* still MPI's */
    free(x->in);
    free(x);
}

/* All-to-all-v: rank i's send count to j must be j's receive count from i. */
static dsc_status check_pairs(dsc_comm *c, const dsc_comm_signature *sig) {
    const char *what = dsc_comm_op_name(sig->op);
    exchange *x;
    DSC_TRY(new_exchange(c, what, 2 * (size_t)c->size, &x));
    int64_t *send = x->in + c->size; /* a copy MPI may keep reading if a peer never comes */
    memcpy(send, sig->send_counts, (size_t)c->size * sizeof *send);
    dsc_status s = finish_exchange(
        c, what, MPI_Ialltoall(send, 1, MPI_INT64_T, x->in, 1, MPI_INT64_T, c->mpi, &x->req), "MPI_Ialltoall", x);
    if (s) {
        free_exchange(x, s);
        return s;
    }
    /* the first (receiver, sender) pair that disagrees, the same on every rank after a max */
    x->out[0] = x->out[1] = -1;
    for (int j = 0; j < c->size; j++)
        if (x->in[j] != sig->recv_counts[j]) {
            x->out[0] = c->rank;
            x->out[1] = j;
            break;
        }
    s = finish_exchange(c, what, MPI_Iallreduce(x->out, x->in, 2, MPI_INT64_T, MPI_MAX, c->mpi, &x->req),
                        "MPI_Iallreduce", x);
    if (!s && x->in[0] >= 0)
        s = dsc_error(DSC_ERR_INVALID,
                      "%s on communicator \"%s\": rank %lld expects a different number of elements from rank %lld "
                      "than rank %lld sends (checked collectives)",
                      what, c->name, (long long)x->in[0], (long long)x->in[1], (long long)x->in[1]);
    free_exchange(x, s);
    return s;
}

dsc_status dsc_comm_check_signature(dsc_comm *c, const dsc_comm_signature *sig) {
    if (!c->opts.check_collectives || c->size == 1) return NULL;
    const char *what = dsc_comm_op_name(sig->op);
    exchange *x;
    DSC_TRY(new_exchange(c, what, (size_t)c->size * FIELDS, &x));
    encode(sig, x->out);
    dsc_status s = finish_exchange(
        c, what, MPI_Iallgather(x->out, FIELDS, MPI_INT64_T, x->in, FIELDS, MPI_INT64_T, c->mpi, &x->req),
        "MPI_Iallgather", x);
    for (int r = 0; !s && r < c->size; r++) /* every rank finds the same first rank, so all fail alike */
        if (memcmp(x->in + (size_t)r * FIELDS, x->in, FIELDS * sizeof *x->in) != 0)
            s = disagreement(c, sig->op, r, x->in, x->in + (size_t)r * FIELDS);
    free_exchange(x, s);
    if (!s && sig->recv_counts) s = check_pairs(c, sig);
    if (s && dsc_status_code(s) != DSC_ERR_INVALID) /* an exchange left half done: the ranks are out of step */
        snprintf(c->broken, sizeof c->broken, "an earlier %s failed while checking its signature (%s)", what,
                 dsc_code_name(dsc_status_code(s)));
    return s;
}
