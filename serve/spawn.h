/* Starting and stopping a dsc-serve process for tests and the load
 * generator: the child dies with its parent (PR_SET_PDEATHSIG), the port
 * comes from its "listening on" line, every wait is bounded, and stopping
 * escalates from SIGTERM to SIGKILL so no server is ever left running. */
#ifndef DSC_SERVE_SPAWN_H
#define DSC_SERVE_SPAWN_H

#include <sys/types.h>

#include "dsc/status.h"

typedef struct serve_proc {
    pid_t pid;
    int port;
    int out_fd; /* the child's stdout */
} serve_proc;

/* Runs `app` with argv (NULL-terminated, argv[0] included) and waits up to
 * timeout_s for it to listen. */
dsc_status serve_proc_start(serve_proc *p, const char *app, const char *const *argv, double timeout_s);
/* Sends SIGTERM and waits up to timeout_s; then SIGKILL. *exit_code is the
 * exit status, or -signal when killed. */
dsc_status serve_proc_stop(serve_proc *p, double timeout_s, int *exit_code);
/* Resident memory of the process in KiB (from /proc), -1 when unknown. */
long serve_proc_rss_kib(pid_t pid);

#endif
