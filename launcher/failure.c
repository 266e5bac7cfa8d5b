/* Reading a job's output for the failed rank and the reason. Two sources:
 * Open MPI's own reports (mpirun names the first process that exited with a
 * non-zero status, died of a signal, called MPI_Abort or skipped
 * MPI_Finalize, and a host whose daemon it lost), and what a dsc program
 * prints when it fails,
 *     dsc: rank 3 failed: <message>      (the failure note)
 *     dsc-train: rank 3: <message>       (an app's error line)
 * which carries the reason. Pure text processing: no processes, no I/O.
 * Matching uses substrings so that --tag-output prefixes do not hide a line. */
#include <stdio.h>
#include <string.h>

#include "launcher/launcher.h"

enum { EXPECT_NOTHING = 0, EXPECT_EXIT_CODE, EXPECT_ABORT_CODE };

void dsc_launch_failure_init(dsc_launch_failure *f) {
    memset(f, 0, sizeof *f);
    f->rank = -1;
}

/* Records mpirun's report unless an earlier one already named the first failure. */
static bool report(dsc_launch_failure *f, dsc_launch_failure_kind kind, int rank, int code) {
    if (f->kind != DSC_LAUNCH_FAILURE_KIND_NONE) return true;
    f->kind = kind;
    f->rank = rank;
    f->code = code;
    return true;
}

/* A rank's own word on why it failed: the note "dsc: rank 3 failed: <why>",
 * or a dsc program's error line "dsc-train: rank 3: <why>" (its name, then a
 * dsc_status message, which starts with the rank). Either may follow a
 * --tag-output prefix, which ends in ':'. */
static bool scan_note(dsc_launch_failure *f, const char *line) {
    for (const char *p = strstr(line, "dsc"); p; p = strstr(p + 1, "dsc")) {
        int rank, offset = 0;
        if (p != line && p[-1] != ':') continue;
        if (sscanf(p, "dsc: rank %d failed: %n", &rank, &offset) != 1 || offset == 0) {
            offset = 0;
            if (sscanf(p, "dsc-%*[a-z0-9_-]: rank %d: %n", &rank, &offset) != 1 || offset == 0) continue;
        }
        if (f->n_notes < DSC_LAUNCH_MAX_NOTES) {
            f->note[f->n_notes].rank = rank;
            snprintf(f->note[f->n_notes].reason, sizeof f->note[0].reason, "%s", p + offset);
            f->n_notes++;
        }
        return true;
    }
    return false;
}

bool dsc_launch_failure_scan(dsc_launch_failure *f, const char *line) {
    int expect = f->expect, rank, code;
    const char *p;
    f->expect = EXPECT_NOTHING;
    if (scan_note(f, line)) return true;
    if (expect == EXPECT_EXIT_CODE && (p = strstr(line, "Exit code:")) && sscanf(p, "Exit code: %d", &code) == 1) {
        f->code = code;
        return true;
    }
    if (expect == EXPECT_ABORT_CODE && (p = strstr(line, "with errorcode ")) &&
        sscanf(p, "with errorcode %d", &code) == 1) {
        f->code = code;
        return true;
    }
    if ((p = strstr(line, "Process name: [[")) && sscanf(p, "Process name: [[%*d,%*d],%d]", &rank) == 1) {
        if (f->kind == DSC_LAUNCH_FAILURE_KIND_NONE) f->expect = EXPECT_EXIT_CODE;
        return report(f, DSC_LAUNCH_FAILURE_KIND_EXIT, rank, -1);
    }
    char name[32], node[64];
    if ((p = strstr(line, "mpirun noticed that process rank ")) &&
        sscanf(p, "mpirun noticed that process rank %d with PID %*d on node %63s exited on signal %d (%31[^)])",
               &rank, node, &code, name) == 4) {
        if (f->kind == DSC_LAUNCH_FAILURE_KIND_NONE) {
            snprintf(f->signal_name, sizeof f->signal_name, "%s", name);
            snprintf(f->host, sizeof f->host, "%s", node);
        }
        return report(f, DSC_LAUNCH_FAILURE_KIND_SIGNAL, rank, code);
    }
    /* "Remote daemon: [[1234,0],1] on node worker-2": the host is gone or cut off. */
    if ((p = strstr(line, "Remote daemon: [[")) &&
        sscanf(p, "Remote daemon: [[%*d,%*d],%*d] on node %63s", node) == 1) {
        if (f->kind == DSC_LAUNCH_FAILURE_KIND_NONE) snprintf(f->host, sizeof f->host, "%s", node);
        return report(f, DSC_LAUNCH_FAILURE_KIND_HOST_LOST, -1, 0);
    }
    if ((p = strstr(line, "MPI_ABORT was invoked on rank ")) &&
        sscanf(p, "MPI_ABORT was invoked on rank %d", &rank) == 1) {
        if (f->kind == DSC_LAUNCH_FAILURE_KIND_NONE) f->expect = EXPECT_ABORT_CODE;
        return report(f, DSC_LAUNCH_FAILURE_KIND_ABORT, rank, -1);
    }
    if ((p = strstr(line, "mpirun has exited due to process rank ")) &&
        sscanf(p, "mpirun has exited due to process rank %d", &rank) == 1)
        return report(f, DSC_LAUNCH_FAILURE_KIND_IMPROPER, rank, 0);
    return strstr(line, "process returned") && strstr(line, "non-zero exit code");
}

static const char *note_for(const dsc_launch_failure *f, int rank) {
    for (int i = 0; i < f->n_notes; i++)
        if (f->note[i].rank == rank) return f->note[i].reason;
    return NULL;
}

void dsc_launch_failure_describe(const dsc_launch_failure *f, char *out, size_t len) {
    *out = '\0';
    if (f->kind == DSC_LAUNCH_FAILURE_KIND_NONE && f->n_notes == 0) return;
    int rank = f->kind != DSC_LAUNCH_FAILURE_KIND_NONE ? f->rank : f->note[0].rank;
    char where[80] = ""; /* " on host X" when mpirun's report named it */
    if (f->host[0] && f->name_hosts) snprintf(where, sizeof where, " on host %s", f->host);
    size_t used;
    switch (f->kind) {
    case DSC_LAUNCH_FAILURE_KIND_EXIT:
        used = f->code >= 0 ? (size_t)snprintf(out, len, "rank %d exited with status %d", rank, f->code)
                            : (size_t)snprintf(out, len, "rank %d exited with a non-zero status", rank);
        break;
    case DSC_LAUNCH_FAILURE_KIND_SIGNAL:
        used =
            (size_t)snprintf(out, len, "rank %d%s killed by signal %d (%s)", rank, where, f->code, f->signal_name);
        break;
    case DSC_LAUNCH_FAILURE_KIND_HOST_LOST:
        used = (size_t)snprintf(out, len,
                                "mpirun lost contact with host %s (its daemon died or the network to it "
                                "failed)",
                                f->host);
        break;
    case DSC_LAUNCH_FAILURE_KIND_ABORT:
        used = (size_t)snprintf(out, len, "rank %d called MPI_Abort with error code %d", rank, f->code);
        break;
    case DSC_LAUNCH_FAILURE_KIND_IMPROPER:
        used = (size_t)snprintf(out, len, "rank %d exited without calling MPI_Finalize", rank);
        break;
    default:
        used = (size_t)snprintf(out, len, "rank %d failed", rank);
        break;
    }
    if (used >= len) return;
    const char *why = note_for(f, rank);
    if (why)
        snprintf(out + used, len - used, ": %s", why);
    else if (f->n_notes > 0)
        snprintf(out + used, len - used, "; rank %d reported: %s", f->note[0].rank, f->note[0].reason);
}
