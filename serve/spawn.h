/* Starting and stopping a dsc-serve process (or dsc-launch running one on
 * several ranks) for tests and the load generator: the child dies with its
 * parent (PR_SET_PDEATHSIG), the port and the ranks' pids come from its
 * "listening on" line, every wait is bounded, and stopping escalates from
 * SIGTERM to SIGKILL so no server is ever left running. */
#ifndef DSC_SERVE_SPAWN_H
#define DSC_SERVE_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "dsc/status.h"

enum { SERVE_PROC_MAX_RANKS = 16 };

typedef struct serve_proc {
    pid_t pid; /* the child: dsc-serve, or the launcher */
    int port;
    int out_fd;                        /* the child's stdout (and stderr with merge_stderr) */
    pid_t ranks[SERVE_PROC_MAX_RANKS]; /* the server's ranks, in rank order ("pids 1,2") */
    int n_ranks;
} serve_proc;

/* Runs `app` with argv (NULL-terminated, argv[0] included) and waits up to
 * timeout_s for it to listen. merge_stderr: the child's stderr goes to
 * out_fd too (serve_proc_wait then returns it). */
dsc_status serve_proc_start(serve_proc *p, const char *app, const char *const *argv, double timeout_s,
                            bool merge_stderr);
/* Waits up to timeout_s for the child to exit by itself (no signal) and
 * collects what it printed after its listening line (NUL-terminated, at
 * most cap - 1 bytes; the rest is read and dropped). *exit_code as for
 * serve_proc_stop; a timeout kills the child and is an error. */
dsc_status serve_proc_wait(serve_proc *p, double timeout_s, int *exit_code, char *out, size_t cap);
/* Sends SIGTERM and waits up to timeout_s; then SIGKILL. *exit_code is the
 * exit status, or -signal when killed. */
dsc_status serve_proc_stop(serve_proc *p, double timeout_s, int *exit_code);
/* Resident memory of the process in KiB (from /proc), -1 when unknown. */
long serve_proc_rss_kib(pid_t pid);

#endif
