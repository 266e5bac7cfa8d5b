/* comm.c — communicator lifecycle: MPI start-up, the world communicator,
 * sub-communicators from member lists (with an agreement step so that bad
 * lists become errors on every rank rather than a hang), accessors and the
 * byte counters' storage. Every communicator is registered with the
 * watchdog (watchdog.c) while it lives.
 * Not here: the operations (collectives.c) or how bytes move (backends). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_internal.h"

static bool dsc_started_mpi; /* dsc_comm_finalize only finalises what dsc initialised */

static dsc_status start_mpi(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    DSC_CHECK(!finalized, DSC_ERR_COMM, "creating the world communicator: MPI is already finalized");
    if (!initialized) {
        int provided = 0;
        DSC_TRY(dsc_comm_mpi_check(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread",
                                   NULL));
        dsc_started_mpi = true;
    }
    /* Failures must come back as statuses, never as MPI's default abort. */
    return dsc_comm_mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                              "MPI_Comm_set_errhandler", NULL);
}

static dsc_status pick_backend(dsc_device device, const dsc_comm_backend **out) {
    if (device.type == DSC_DEVICE_CPU) {
        *out = &dsc_comm_mpi_backend;
        return NULL;
    }
#ifdef DSC_HAVE_CUDA
    *out = &dsc_comm_nccl_backend;
    return NULL;
#else
    char dev[32];
    return dsc_error(DSC_ERR_UNSUPPORTED,
                     "a communicator for %s tensors needs NCCL, but dsc was built without CUDA",
                     dsc_device_name(device, dev, sizeof dev));
#endif
}

static dsc_comm_options normalize(const dsc_comm_options *opts) {
    dsc_comm_options o = opts ? *opts : (dsc_comm_options){.device = DSC_CPU};
    if (o.timeout_s <= 0) o.timeout_s = DSC_COMM_DEFAULT_TIMEOUT_S;
    const char *check = getenv("DSC_COMM_CHECK");
    if (check && strcmp(check, "1") == 0) o.check_collectives = true;
    return o;
}

/* A communicator shell: everything but the MPI communicator and the backend. */
static dsc_status comm_alloc(const char *name, int rank, int size, const dsc_comm_options *opts, dsc_comm **out) {
    dsc_comm *c;
    DSC_TRY(dsc_mem_alloc((void **)&c, sizeof *c, DSC_MEM_COMM, DSC_CPU));
    snprintf(c->name, sizeof c->name, "%s", name);
    c->rank = rank;
    c->size = size;
    c->mpi = MPI_COMM_NULL;
    c->opts = *opts;
    *out = c;
    dsc_status s = pick_backend(opts->device, &c->backend);
    if (!s) s = dsc_mem_alloc((void **)&c->world_ranks, (size_t)size * sizeof(int), DSC_MEM_COMM, DSC_CPU);
    if (!s) s = dsc_mem_alloc((void **)&c->even_counts, (size_t)size * sizeof(int64_t), DSC_MEM_COMM, DSC_CPU);
    if (s) {
        dsc_comm_free(c);
        *out = NULL;
    }
    return s;
}

/* Fills world_ranks from c->mpi and starts the backend. */
static dsc_status comm_start(dsc_comm *c) {
    MPI_Group group, world;
    DSC_TRY(dsc_comm_mpi_check(MPI_Comm_group(c->mpi, &group), "MPI_Comm_group", c));
    DSC_TRY(dsc_comm_mpi_check(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group", c));
    int rc = MPI_SUCCESS;
    for (int i = 0; i < c->size && rc == MPI_SUCCESS; i++)
        rc = MPI_Group_translate_ranks(group, 1, &i, world, &c->world_ranks[i]);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    DSC_TRY(dsc_comm_mpi_check(rc, "MPI_Group_translate_ranks", c));
    DSC_TRY(dsc_comm_mpi_check(MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", c));
    c->deadline = dsc_comm_now() + c->opts.timeout_s;
    DSC_TRY(dsc_comm_watch_attach(c));
    return c->backend->init(c);
}

dsc_status dsc_comm_world(const dsc_comm_options *opts, dsc_comm **out) {
    *out = NULL;
    DSC_TRY(start_mpi());
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dsc_set_rank(rank);
    dsc_comm_options o = normalize(opts);
    dsc_comm *c;
    DSC_TRY(comm_alloc("world", rank, size, &o, &c));
    /* A private duplicate, so dsc's traffic never matches the application's. */
    c->deadline = dsc_comm_now() + o.timeout_s;
    MPI_Request req;
    dsc_status s = dsc_comm_mpi_check(MPI_Comm_idup(MPI_COMM_WORLD, &c->mpi, &req), "MPI_Comm_idup", c);
    if (!s) s = dsc_comm_mpi_wait(c, "creating the world communicator", -1, &req, 1, MPI_STATUSES_IGNORE);
    if (!s) s = comm_start(c);
    if (s) {
        dsc_comm_free(c);
        return s;
    }
    *out = c;
    return NULL;
}

/* What each rank tells the others about the group it asks to join. */
enum { CLAIM_VALID, CLAIM_FIRST, CLAIM_COUNT, CLAIM_HASH, CLAIM_FIELDS };

static int list_hash(const int *members, int count) {
    uint32_t h = 2166136261u; /* FNV-1a over the member list, in order */
    for (int i = 0; i < count; i++) {
        uint32_t v = (uint32_t)members[i];
        for (int b = 0; b < 4; b++)
            h = (h ^ ((v >> (8 * b)) & 0xffu)) * 16777619u;
    }
    return (int)(h & 0x7fffffff);
}

/* Why this rank's list is unusable, or NULL. `key` gets this rank's position. */
static dsc_status check_members(const dsc_comm *parent, const int *members, int count, const char *name,
                                int *key) {
    DSC_CHECK(count >= 1 && count <= parent->size, DSC_ERR_INVALID,
              "communicator \"%s\": %d members requested from a parent of %d ranks", name, count, parent->size);
    *key = -1;
    for (int i = 0; i < count; i++) {
        DSC_CHECK(members[i] >= 0 && members[i] < parent->size, DSC_ERR_INVALID,
                  "communicator \"%s\": member %d is not a rank of \"%s\" (size %d)", name, members[i],
                  parent->name, parent->size);
        for (int j = 0; j < i; j++)
            DSC_CHECK(members[j] != members[i], DSC_ERR_INVALID, "communicator \"%s\": member %d is listed twice",
                      name, members[i]);
        if (members[i] == parent->rank) *key = i;
    }
    DSC_CHECK(*key >= 0, DSC_ERR_INVALID,
              "communicator \"%s\": this rank (%d of \"%s\") is not in its member list", name, parent->rank,
              parent->name);
    return NULL;
}

/* The verdict every rank computes identically from all claims: claims naming
 * the same first member must be identical, and exactly `count` ranks, the
 * first member among them, must claim each group. */
static dsc_status check_claims(const dsc_comm *parent, const int *claims, int *tally, const char *name) {
    int p = parent->size;
    for (int y = 0; y < p; y++) {
        const int *cy = claims + y * CLAIM_FIELDS;
        DSC_CHECK(cy[CLAIM_VALID], DSC_ERR_PEER,
                  "communicator \"%s\": rank %d of \"%s\" passed an invalid member list", name, y, parent->name);
    }
    for (int y = 0; y < p; y++) {
        const int *cy = claims + y * CLAIM_FIELDS;
        const int *head = claims + cy[CLAIM_FIRST] * CLAIM_FIELDS;
        DSC_CHECK(head[CLAIM_FIRST] == cy[CLAIM_FIRST] && head[CLAIM_COUNT] == cy[CLAIM_COUNT] &&
                      head[CLAIM_HASH] == cy[CLAIM_HASH],
                  DSC_ERR_INVALID,
                  "communicator \"%s\": member lists disagree: rank %d lists a group led by rank %d that rank %d "
                  "does not list",
                  name, y, cy[CLAIM_FIRST], cy[CLAIM_FIRST]);
        tally[cy[CLAIM_FIRST]]++;
    }
    for (int y = 0; y < p; y++) {
        const int *cy = claims + y * CLAIM_FIELDS;
        DSC_CHECK(
            tally[y] == 0 || tally[y] == cy[CLAIM_COUNT], DSC_ERR_INVALID,
            "communicator \"%s\": member lists disagree: the group led by rank %d lists %d ranks but %d ranks "
            "claim it",
            name, y, cy[CLAIM_COUNT], tally[y]);
    }
    return NULL;
}

/* All ranks exchange their claims (bounded by the timeout) and judge them.
 * On success `key` is this rank's position in its list and `first` the
 * group's lowest member (its colour for MPI_Comm_split). */
static dsc_status agree(dsc_comm *parent, const int *members, int count, const char *name, int *key, int *first) {
    dsc_status mine = check_members(parent, members, count, name, key);
    /* An invalid claim still names a valid index (its own rank); it is rejected anyway. */
    int claim[CLAIM_FIELDS] = {mine == NULL, parent->rank, count, mine ? 0 : list_hash(members, count)};
    for (int i = 0; !mine && i < count; i++)
        if (members[i] < claim[CLAIM_FIRST]) claim[CLAIM_FIRST] = members[i];
    *first = claim[CLAIM_FIRST];
    size_t bytes = (size_t)parent->size * (CLAIM_FIELDS + 1) * sizeof(int);
    int *claims = NULL;
    dsc_status s = dsc_mem_alloc((void **)&claims, bytes, DSC_MEM_COMM, DSC_CPU);
    if (!s) {
        parent->deadline = dsc_comm_now() + parent->opts.timeout_s;
        parent->seq++; /* a collective on the parent, as the watchdog counts them */
        MPI_Request req;
        s = dsc_comm_mpi_check(
            MPI_Iallgather(claim, CLAIM_FIELDS, MPI_INT, claims, CLAIM_FIELDS, MPI_INT, parent->mpi, &req),
            "MPI_Iallgather", parent);
        if (!s) s = dsc_comm_mpi_wait(parent, "agreeing on members", -1, &req, 1, MPI_STATUSES_IGNORE);
    }
    if (!s && !mine) s = check_claims(parent, claims, claims + parent->size * CLAIM_FIELDS, name);
    dsc_mem_free(claims, bytes, DSC_MEM_COMM, DSC_CPU);
    if (mine) {
        dsc_status_free(s);
        return mine;
    }
    return s;
}

dsc_status dsc_comm_create_sub(dsc_comm *parent, const int *members, int count, const char *name, dsc_comm **out) {
    *out = NULL;
    int key = -1, color = -1;
    DSC_TRY(agree(parent, members, count, name, &key, &color));
    dsc_comm *c;
    DSC_TRY(comm_alloc(name, key, count, &parent->opts, &c));
    /* Every rank of the parent is here (the agreement proved it), so the
     * blocking split cannot wait on an absent rank. */
    dsc_status s = dsc_comm_mpi_check(MPI_Comm_split(parent->mpi, color, key, &c->mpi), "MPI_Comm_split", parent);
    if (!s) s = comm_start(c);
    if (s) {
        dsc_comm_free(c);
        return dsc_error_wrap(s, "creating communicator \"%s\"", name);
    }
    *out = c;
    return NULL;
}

void dsc_comm_free(dsc_comm *c) {
    if (!c) return;
    dsc_comm_watch_detach(c);
    if (c->backend && c->impl) c->backend->fini(c);
    if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
    dsc_mem_free(c->world_ranks, (size_t)c->size * sizeof(int), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(c->even_counts, (size_t)c->size * sizeof(int64_t), DSC_MEM_COMM, DSC_CPU);
    dsc_mem_free(c, sizeof *c, DSC_MEM_COMM, DSC_CPU);
}

dsc_status dsc_comm_finalize(void) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!dsc_started_mpi || finalized) return NULL;
    dsc_started_mpi = false;
    return dsc_comm_mpi_check(MPI_Finalize(), "MPI_Finalize", NULL);
}

int dsc_comm_rank(const dsc_comm *c) {
    return c->rank;
}
int dsc_comm_size(const dsc_comm *c) {
    return c->size;
}
const char *dsc_comm_name(const dsc_comm *c) {
    return c->name;
}
const char *dsc_comm_backend_name(const dsc_comm *c) {
    return c->backend->name;
}

int dsc_comm_world_rank(const dsc_comm *c, int rank) {
    DSC_ASSERT(rank >= 0 && rank < c->size);
    return c->world_ranks[rank];
}

const char *dsc_comm_host(const dsc_comm *c, int rank) {
    DSC_ASSERT(rank >= 0 && rank < c->size);
    return dsc_comm_watch_host(c->world_ranks[rank]);
}

double dsc_comm_timeout(const dsc_comm *c) {
    return c->opts.timeout_s;
}

dsc_status dsc_comm_set_timeout(dsc_comm *c, double timeout_s) {
    DSC_CHECK(timeout_s > 0, DSC_ERR_INVALID, "communicator \"%s\": timeout %g s must be positive", c->name,
              timeout_s);
    c->opts.timeout_s = timeout_s;
    return NULL;
}

void dsc_comm_get_stats(const dsc_comm *c, dsc_comm_stats *out) {
    *out = c->stats;
}
void dsc_comm_reset_stats(dsc_comm *c) {
    memset(&c->stats, 0, sizeof c->stats);
}

const char *dsc_comm_op_name(dsc_comm_op op) {
    static const char *names[] = {"all-reduce", "reduce-scatter", "all-gather", "all-to-all", "all-to-all-v",
                                  "broadcast",  "send",           "recv",       "barrier"};
    return (unsigned)op < DSC_COMM_OP_COUNT ? names[op] : "unknown";
}

const char *dsc_reduce_op_name(dsc_reduce_op op) {
    static const char *names[] = {"sum", "avg", "max"};
    return (unsigned)op < DSC_REDUCE_OP_COUNT ? names[op] : "unknown";
}
