/* watchdog.c — what a timed-out rank can say about its peers: which host
 * every rank runs on, and, when a wait passes its deadline, which peers had
 * not answered.
 *
 * Every rank keeps a side communicator (a duplicate of MPI_COMM_WORLD that
 * only this file uses), the host name of every world rank (gathered once when
 * the first world communicator is created), a registry of its live
 * communicators with a count of the collectives entered on each, and what it
 * is waiting for right now. A rank whose wait timed out sends a query to the
 * peers concerned (all other members for a collective, the peer for
 * point-to-point) and waits a short window for replies. A peer answers while
 * it waits for anything itself (dsc_comm_poll serves queries between tests)
 * or while it diagnoses its own timeout. The reply says how many collectives
 * the peer has entered on that communicator and what it is waiting for; a
 * peer that does not answer is gone, unreachable or busy outside dsc's
 * communication. Replies carry the query's nonce, so a late reply to an
 * earlier query is never taken for the current one.
 *
 * State is per process (ranks are single-threaded towards MPI), shared by
 * every communicator and freed with the last one; creating it is collective
 * over MPI_COMM_WORLD, which holds because every rank creates its first
 * world communicator together (and, should it free all of them, its next).
 * Not here: deadlines and polling (poll.c), stopping the job (the app and
 * the launcher decide). */
#define _POSIX_C_SOURCE 200809L /* fmemopen, nanosleep */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime/comm/comm_internal.h"

enum { TAG_QUERY = 1, TAG_REPLY = 2, HOST_CHARS = 64, LIST_MAX = 12 };

typedef struct query {
    int64_t nonce, comm_id;
} query;

typedef struct reply {
    int64_t nonce;
    int64_t seq;       /* collectives entered on the queried communicator; -1: no such communicator */
    int64_t wait_peer; /* world rank the peer waits on, -1: a collective or nothing */
    char waiting;      /* the peer is inside a dsc wait */
    char what[39];     /* what it waits for ("recv", "all-reduce", ...) */
    char comm[64];     /* on which communicator */
} reply;

typedef struct slot {
    query q_out;                      /* the query sent to this world rank */
    reply r_out, r_in;                /* the reply sent to it, and its reply to us */
    MPI_Request q_req, r_req, in_req; /* query sent to, reply sent to, reply expected from this world rank */
} slot;

/* What a diagnosis concluded about one peer. */
typedef enum verdict { VERDICT_SILENT, VERDICT_BEHIND, VERDICT_INSIDE, VERDICT_ASKED } verdict;

typedef struct watchdog {
    int refs;
    int size, rank; /* in MPI_COMM_WORLD */
    MPI_Comm side;
    char (*hosts)[HOST_CHARS]; /* (size) host of each world rank */
    slot *slots;               /* (size) */
    int *targets;              /* (size) scratch: the members a diagnosis asks */
    verdict *verdicts;         /* (size) scratch: what it concluded about each */
    query incoming;
    MPI_Request incoming_req; /* the posted receive for the next query */
    MPI_Status incoming_status;
    dsc_comm *comms; /* registry, linked through dsc_comm.watch_next */
    const dsc_comm *wait_comm;
    const char *wait_what;
    int wait_peer;
    int64_t nonce;
} watchdog;

static watchdog *wd;

static const char *host_of(int world_rank) {
    return wd && world_rank >= 0 && world_rank < wd->size ? wd->hosts[world_rank] : "?";
}

static void watchdog_free(void) {
    if (!wd) return;
    for (int i = 0; wd->slots && i < wd->size; i++) {
        slot *s = &wd->slots[i];
        MPI_Request *reqs[] = {&s->q_req, &s->r_req, &s->in_req};
        for (int k = 0; k < 3; k++) {
            if (*reqs[k] == MPI_REQUEST_NULL) continue;
            MPI_Cancel(reqs[k]);
            MPI_Request_free(reqs[k]);
        }
    }
    if (wd->incoming_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&wd->incoming_req);
        MPI_Wait(&wd->incoming_req, MPI_STATUS_IGNORE);
    }
    if (wd->side != MPI_COMM_NULL) MPI_Comm_free(&wd->side);
    dsc_mem_free(wd->hosts, (size_t)wd->size * HOST_CHARS, DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(wd->slots, (size_t)wd->size * sizeof(slot), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(wd->targets, (size_t)wd->size * sizeof(int), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(wd->verdicts, (size_t)wd->size * sizeof(verdict), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(wd, sizeof *wd, DSC_MEM_COMM, DSC_CPU);
    wd = NULL;
}

/* The side communicator and every rank's host name; bounded by world's deadline. */
static dsc_status watchdog_create(const dsc_comm *world) {
    DSC_TRY(dsc_mem_alloc((void **)&wd, sizeof *wd, DSC_MEM_COMM, DSC_CPU));
    memset(wd, 0, sizeof *wd);
    wd->side = MPI_COMM_NULL;
    wd->incoming_req = MPI_REQUEST_NULL;
    MPI_Comm_size(MPI_COMM_WORLD, &wd->size);
    MPI_Comm_rank(MPI_COMM_WORLD, &wd->rank);
    size_t n = (size_t)wd->size;
    DSC_TRY(dsc_mem_alloc((void **)&wd->hosts, n * HOST_CHARS, DSC_MEM_COMM, DSC_CPU));
    DSC_TRY(dsc_mem_alloc((void **)&wd->slots, n * sizeof(slot), DSC_MEM_COMM, DSC_CPU));
    memset(wd->slots, 0, n * sizeof(slot));
    DSC_TRY(dsc_mem_alloc((void **)&wd->targets, n * sizeof(int), DSC_MEM_COMM, DSC_CPU));
    DSC_TRY(dsc_mem_alloc((void **)&wd->verdicts, n * sizeof(verdict), DSC_MEM_COMM, DSC_CPU));
    for (size_t i = 0; i < n; i++)
        wd->slots[i].q_req = wd->slots[i].r_req = wd->slots[i].in_req = MPI_REQUEST_NULL;

    char name[MPI_MAX_PROCESSOR_NAME] = "", mine[HOST_CHARS] = "";
    int len = 0;
    DSC_TRY(dsc_comm_mpi_check(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name", world));
    snprintf(mine, sizeof mine, "%.*s", (int)sizeof mine - 1, name); /* a longer host name is cut */
    MPI_Request req;
    DSC_TRY(dsc_comm_mpi_check(MPI_Comm_idup(MPI_COMM_WORLD, &wd->side, &req), "MPI_Comm_idup", world));
    DSC_TRY(dsc_comm_mpi_wait(world, "creating the watchdog's communicator", -1, &req, 1, MPI_STATUSES_IGNORE));
    DSC_TRY(dsc_comm_mpi_check(MPI_Comm_set_errhandler(wd->side, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
                               world));
    DSC_TRY(dsc_comm_mpi_check(
        MPI_Iallgather(mine, HOST_CHARS, MPI_CHAR, wd->hosts, HOST_CHARS, MPI_CHAR, wd->side, &req),
        "MPI_Iallgather", world));
    DSC_TRY(dsc_comm_mpi_wait(world, "gathering host names", -1, &req, 1, MPI_STATUSES_IGNORE));
    return dsc_comm_mpi_check(
        MPI_Irecv(&wd->incoming, sizeof(query), MPI_BYTE, MPI_ANY_SOURCE, TAG_QUERY, wd->side, &wd->incoming_req),
        "MPI_Irecv", world);
}

/* FNV-1a over the name and the world ranks: the same on every member. */
static int64_t comm_id(const dsc_comm *c) {
    uint64_t h = 14695981039346656037ull;
    for (const char *p = c->name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    for (int i = 0; i < c->size; i++)
        h = (h ^ (uint32_t)c->world_ranks[i]) * 1099511628211ull;
    return (int64_t)(h >> 1);
}

dsc_status dsc_comm_watch_attach(dsc_comm *c) {
    if (!wd) {
        dsc_status s = watchdog_create(c);
        if (s) {
            watchdog_free();
            return s;
        }
    }
    wd->refs++;
    c->watched = true;
    c->watch_id = comm_id(c);
    c->watch_next = wd->comms;
    wd->comms = c;
    return NULL;
}

void dsc_comm_watch_detach(dsc_comm *c) {
    if (!wd || !c->watched) return;
    c->watched = false;
    for (dsc_comm **p = &wd->comms; *p; p = &(*p)->watch_next) {
        if (*p != c) continue;
        *p = c->watch_next;
        break;
    }
    if (wd->wait_comm == c) wd->wait_comm = NULL;
    if (--wd->refs == 0) watchdog_free();
}

const char *dsc_comm_watch_host(int world_rank) {
    return host_of(world_rank);
}

void dsc_comm_watch_waiting(const dsc_comm *c, const char *what, int peer) {
    if (!wd) return;
    wd->wait_comm = c;
    wd->wait_what = what;
    wd->wait_peer = c && peer >= 0 ? c->world_ranks[peer] : -1;
}

/* A finished or never-used request, or NULL-able: true when the slot is free. */
static bool request_idle(MPI_Request *req) {
    int done = 1;
    if (*req != MPI_REQUEST_NULL) MPI_Test(req, &done, MPI_STATUS_IGNORE);
    return done != 0;
}

static void answer(int from, int64_t nonce, int64_t id) {
    slot *s = &wd->slots[from];
    if (!request_idle(&s->r_req)) return; /* the previous reply is still on its way: that peer is not reading */
    reply *r = &s->r_out;
    memset(r, 0, sizeof *r);
    r->nonce = nonce;
    r->seq = -1;
    for (const dsc_comm *c = wd->comms; c; c = c->watch_next)
        if (c->watch_id == id) r->seq = c->seq;
    r->wait_peer = wd->wait_comm ? wd->wait_peer : -1;
    r->waiting = wd->wait_comm != NULL;
    if (wd->wait_comm) {
        snprintf(r->what, sizeof r->what, "%s", wd->wait_what);
        snprintf(r->comm, sizeof r->comm, "%s", wd->wait_comm->name);
    }
    if (MPI_Isend(r, sizeof *r, MPI_BYTE, from, TAG_REPLY, wd->side, &s->r_req) != MPI_SUCCESS)
        s->r_req = MPI_REQUEST_NULL; /* the asker will count this rank as silent */
}

void dsc_comm_watch_serve(void) {
    if (!wd) return;
    for (;;) {
        int arrived = 0;
        if (wd->incoming_req == MPI_REQUEST_NULL ||
            MPI_Test(&wd->incoming_req, &arrived, &wd->incoming_status) != MPI_SUCCESS || !arrived)
            return;
        answer(wd->incoming_status.MPI_SOURCE, wd->incoming.nonce, wd->incoming.comm_id);
        if (MPI_Irecv(&wd->incoming, sizeof(query), MPI_BYTE, MPI_ANY_SOURCE, TAG_QUERY, wd->side,
                      &wd->incoming_req) != MPI_SUCCESS)
            wd->incoming_req = MPI_REQUEST_NULL;
    }
}

/* ---- diagnosis ------------------------------------------------------------------ */

/* Sends the query to world rank w and expects its reply; false when the
 * previous query to w has not even left (then w counts as silent). */
static bool ask(int w, int64_t id) {
    slot *s = &wd->slots[w];
    if (!request_idle(&s->q_req)) return false;
    if (s->in_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&s->in_req);
        MPI_Wait(&s->in_req, MPI_STATUS_IGNORE);
    }
    s->q_out = (query){wd->nonce, id};
    if (MPI_Irecv(&s->r_in, sizeof(reply), MPI_BYTE, w, TAG_REPLY, wd->side, &s->in_req) != MPI_SUCCESS)
        return false;
    return MPI_Isend(&s->q_out, sizeof(query), MPI_BYTE, w, TAG_QUERY, wd->side, &s->q_req) == MPI_SUCCESS;
}

/* True once w's reply to the current query is in (stale replies are dropped). */
static bool answered(int w) {
    slot *s = &wd->slots[w];
    for (;;) {
        int done = 0;
        if (s->in_req == MPI_REQUEST_NULL || MPI_Test(&s->in_req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return false;
        if (!done) return false;
        if (s->r_in.nonce == wd->nonce) return true;
        if (MPI_Irecv(&s->r_in, sizeof(reply), MPI_BYTE, w, TAG_REPLY, wd->side, &s->in_req) != MPI_SUCCESS)
            return false;
    }
}

/* Appends "world ranks 2, 3 (host h1)" runs for the targets with verdict v;
 * returns how many there were. */
static int list_ranks(FILE *out, const dsc_comm *c, const int *targets, const verdict *v, int n, verdict want) {
    int total = 0;
    for (int i = 0; i < n; i++)
        total += v[i] == want;
    int count = 0;
    const char *run_host = NULL;
    for (int i = 0; i < n; i++) {
        if (v[i] != want) continue;
        int w = c->world_ranks[targets[i]];
        if (count == LIST_MAX) fprintf(out, " (host %s) and more", run_host);
        if (count >= LIST_MAX) {
            count++;
            continue;
        }
        if (run_host && strcmp(run_host, host_of(w)) != 0) fprintf(out, " (host %s)", run_host);
        fprintf(out, "%s%d", count > 0 ? ", " : total > 1 ? "world ranks " : "world rank ", w);
        run_host = host_of(w);
        count++;
    }
    if (count > 0 && count <= LIST_MAX) fprintf(out, " (host %s)", run_host);
    return count;
}

static void describe_wait(FILE *out, const reply *r) {
    if (!r->waiting) {
        fputs("not waiting in any dsc operation", out);
        return;
    }
    fprintf(out, "waiting in %s", r->what);
    if (r->wait_peer >= 0)
        fprintf(out, " with world rank %lld (host %s)", (long long)r->wait_peer, host_of((int)r->wait_peer));
    fprintf(out, " on \"%s\"", r->comm);
}

static void write_report(FILE *out, const dsc_comm *c, int peer, const int *targets, const verdict *v, int n,
                         double window) {
    if (peer >= 0) {
        int w = c->world_ranks[peer];
        if (v[0] == VERDICT_SILENT) {
            fprintf(out,
                    "; the peer (host %s) did not answer within %.1f s (gone, unreachable, or busy outside "
                    "dsc's communication)",
                    host_of(w), window);
        } else {
            fprintf(out, "; the peer (host %s) answered: it is ", host_of(w));
            describe_wait(out, &wd->slots[w].r_in);
        }
        return;
    }
    fprintf(out, "; on host %s, as collective #%lld on \"%s\"; did not answer within %.1f s: ", host_of(wd->rank),
            (long long)c->seq, c->name, window);
    if (list_ranks(out, c, targets, v, n, VERDICT_SILENT) == 0) fputs("none", out);
    int behind = 0;
    for (int i = 0; i < n; i++) {
        if (v[i] != VERDICT_BEHIND || behind++ >= LIST_MAX) continue;
        int w = c->world_ranks[targets[i]];
        const reply *r = &wd->slots[w].r_in;
        fprintf(out, "; world rank %d (host %s) has not reached it (", w, host_of(w));
        if (r->seq < 0)
            fputs("it has no such communicator", out);
        else
            fprintf(out, "%lld collective%s entered on \"%s\"", (long long)r->seq, r->seq == 1 ? "" : "s",
                    c->name);
        fputs("), ", out);
        describe_wait(out, r);
    }
    int inside = 0;
    for (int i = 0; i < n; i++)
        inside += v[i] == VERDICT_INSIDE;
    if (inside > 0) {
        fputs("; also inside it: ", out);
        list_ranks(out, c, targets, v, n, VERDICT_INSIDE);
    }
}

void dsc_comm_watch_diagnose(const dsc_comm *c, int peer, char *text, size_t len) {
    *text = '\0';
    if (!wd || wd->side == MPI_COMM_NULL || c->size < 2) return;
    int n = peer >= 0 ? 1 : c->size - 1;
    int *targets = wd->targets;
    verdict *v = wd->verdicts;
    for (int i = 0, k = 0; i < c->size; i++)
        if (peer >= 0 ? i == peer : i != c->rank) targets[k++] = i;
    wd->nonce++;
    for (int i = 0; i < n; i++)
        v[i] = ask(c->world_ranks[targets[i]], c->watch_id) ? VERDICT_ASKED : VERDICT_SILENT;
    /* Long enough for a loaded peer to come round to its next test; short
     * enough that the job still stops soon after the deadline. */
    double window = fmin(3.0, fmax(0.2, c->opts.timeout_s / 4)), end = dsc_comm_now() + window;
    for (int pending = n; pending > 0 && dsc_comm_now() < end;) {
        dsc_comm_watch_serve();
        pending = 0;
        for (int i = 0; i < n; i++) {
            if (v[i] != VERDICT_ASKED) continue;
            int w = c->world_ranks[targets[i]];
            if (!answered(w)) {
                pending++;
                continue;
            }
            v[i] = wd->slots[w].r_in.seq < c->seq ? VERDICT_BEHIND : VERDICT_INSIDE;
        }
        if (pending) {
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    for (int i = 0; i < n; i++)
        if (v[i] == VERDICT_ASKED) v[i] = VERDICT_SILENT;
    FILE *out = fmemopen(text, len, "w");
    if (!out) return;
    write_report(out, c, peer, targets, v, n, window);
    fclose(out);
}
