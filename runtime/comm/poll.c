/* poll.c — deadline-bounded waiting and MPI error translation for the
 * communicator backends.
 *
 * Every blocking operation in dsc ends in dsc_comm_poll: test until done or
 * past the deadline. For the first SPIN_S seconds it tests back to back
 * (small messages complete here, at MPI's latency; MPI's own blocking calls
 * spin forever), and goes on for another SPIN_S, up to SPIN_MAX_S, each
 * time no task is waiting for a core; after that it sleeps between tests
 * with a 50 -> 200 us backoff.
 * Sleeping rather than spinning matters when ranks outnumber cores: a
 * spinning rank would steal the CPU its peer needs to make progress. Where
 * every runnable task has a core, a sleep only delays the test that would
 * have found the operation done: the 50 us sleeps (and the timer's slack)
 * held 1 MB all-reduces and sends at a fifth and a half of Open MPI's rate
 * on 2 ranks with a core each.
 * While it sleeps, a waiting rank answers its peers' watchdog queries, and a
 * timeout error carries the watchdog's diagnosis of the peers (watchdog.c).
 * Not here: what is being waited for (the backends post the operations). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep, pread */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "runtime/comm/comm_internal.h"

static const double SPIN_S = 100e-6, SPIN_MAX_S = 5e-3;
static const long SLEEP_MIN_NS = 50 * 1000, SLEEP_MAX_NS = 200 * 1000;

/* Whether no task waits for a core now: the fourth field of /proc/loadavg ("3/412") counts the
 * tasks running or ready to run, this one included. False where it cannot be read (not Linux):
 * the wait then sleeps as if the cores were oversubscribed. */
static bool cores_to_spare(void) {
    static _Atomic int fd = -2; /* -2: not opened yet; -1: cannot be */
    static _Atomic long cpus;
    int f = atomic_load(&fd);
    if (f == -2) {
        atomic_store(&cpus, sysconf(_SC_NPROCESSORS_ONLN)); /* before fd: a reader of fd sees it */
        f = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
        int expected = -2;
        if (!atomic_compare_exchange_strong(&fd, &expected, f)) {
            if (f >= 0) close(f);
            f = expected;
        }
    }
    char text[128];
    ssize_t n = f >= 0 ? pread(f, text, sizeof text - 1, 0) : -1;
    if (n <= 0) return false;
    text[n] = '\0';
    long running = 0;
    if (sscanf(text, "%*s %*s %*s %ld/", &running) != 1) return false;
    return running <= atomic_load(&cpus);
}

double dsc_comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

dsc_status dsc_comm_timeout_error(const dsc_comm *c, const char *what, int peer) {
    char peers[1536];
    dsc_comm_watch_diagnose(c, peer, peers, sizeof peers);
    if (peer >= 0)
        return dsc_error(DSC_ERR_TIMEOUT,
                         "%s with peer %d (world rank %d) on communicator \"%s\" timed out after %g s%s", what,
                         peer, c->world_ranks[peer], c->name, c->opts.timeout_s, peers);
    return dsc_error(DSC_ERR_TIMEOUT, "%s on communicator \"%s\" (%d ranks) timed out after %g s%s", what, c->name,
                     c->size, c->opts.timeout_s, peers);
}

dsc_status dsc_comm_poll(const dsc_comm *c, const char *what, int peer, double deadline, dsc_comm_test_fn test,
                         void *arg) {
    long sleep_ns = SLEEP_MIN_NS;
    const double t0 = dsc_comm_now();
    double spin_until = t0 + SPIN_S;
    dsc_comm_watch_waiting(c, what, peer);
    dsc_status s = NULL;
    for (;;) {
        bool done = false;
        s = test(arg, &done);
        if (s || done) break;
        double now = dsc_comm_now();
        if (now > deadline) {
            s = dsc_comm_timeout_error(c, what, peer);
            break;
        }
        if (now < spin_until) continue;
        if (now < t0 + SPIN_MAX_S && cores_to_spare()) {
            spin_until = now + SPIN_S;
            continue;
        }
        dsc_comm_watch_serve();
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        sleep_ns = sleep_ns * 2 > SLEEP_MAX_NS ? SLEEP_MAX_NS : sleep_ns * 2;
    }
    dsc_comm_watch_waiting(NULL, NULL, -1);
    return s;
}

dsc_status dsc_comm_mpi_test(const dsc_comm *c, const char *what, MPI_Request *reqs, int n, MPI_Status *statuses,
                             bool *done) {
    int flag = 0;
    int rc = MPI_Testall(n, reqs, &flag, statuses);
    if (rc == MPI_ERR_IN_STATUS && statuses != MPI_STATUSES_IGNORE) {
        for (int i = 0; i < n; i++) {
            MPI_Status *st = &statuses[i];
            if (st->MPI_ERROR == MPI_SUCCESS || st->MPI_ERROR == MPI_ERR_PENDING) continue;
            return dsc_error_wrap(dsc_comm_mpi_check(st->MPI_ERROR, "MPI_Testall", c), "%s, message from peer %d",
                                  what, st->MPI_SOURCE);
        }
    }
    DSC_TRY(dsc_error_wrap(dsc_comm_mpi_check(rc, "MPI_Testall", c), "%s", what));
    *done = flag != 0;
    return NULL;
}

typedef struct mpi_wait {
    const dsc_comm *comm;
    const char *what;
    MPI_Request *reqs;
    int n;
    MPI_Status *statuses;
} mpi_wait;

static dsc_status test_mpi(void *arg, bool *done) {
    mpi_wait *w = arg;
    return dsc_comm_mpi_test(w->comm, w->what, w->reqs, w->n, w->statuses, done);
}

dsc_status dsc_comm_mpi_wait(const dsc_comm *c, const char *what, int peer, MPI_Request *reqs, int n,
                             MPI_Status *statuses) {
    mpi_wait w = {c, what, reqs, n, statuses};
    return dsc_comm_poll(c, what, peer, c->deadline, test_mpi, &w);
}

dsc_status dsc_comm_mpi_check(int rc, const char *call, const dsc_comm *c) {
    if (rc == MPI_SUCCESS) return NULL;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return dsc_error(DSC_ERR_COMM, "%s failed on communicator \"%s\": %s", call, c ? c->name : "(none)", msg);
}

MPI_Datatype dsc_comm_mpi_type(dsc_dtype dtype) {
    switch (dtype) {
    case DSC_DTYPE_F32:
        return MPI_FLOAT;
    case DSC_DTYPE_BF16:
    case DSC_DTYPE_F16:
        return MPI_UINT16_T;
    case DSC_DTYPE_I32:
        return MPI_INT32_T;
    case DSC_DTYPE_I64:
        return MPI_INT64_T;
    case DSC_DTYPE_U8:
        return MPI_UINT8_T;
    default:
        return MPI_DATATYPE_NULL;
    }
}
