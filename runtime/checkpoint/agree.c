/* Turns per-rank outcomes of a collective step into one shared outcome, so a
 * failure on one rank (a full disk, a missing file) stops all ranks with the
 * same reason instead of leaving the others waiting in the next collective. */
#include "runtime/checkpoint/agree.h"

#include <limits.h>
#include <stdio.h>

dsc_status dsc_agree(MPI_Comm comm, dsc_status local) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    int mine = local ? rank : INT_MAX, first = INT_MAX;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == INT_MAX) return NULL;
    char message[2048] = "";
    int code = 0;
    if (rank == first) {
        snprintf(message, sizeof message, "%s", dsc_status_message(local));
        code = (int)dsc_status_code(local);
    }
    MPI_Bcast(message, sizeof message, MPI_CHAR, first, comm);
    MPI_Bcast(&code, 1, MPI_INT, first, comm);
    if (local) return local; /* a failing rank keeps its own, more specific message */
    /* The same reason on every rank (its message starts with "rank N: "), so
     * callers can act on the code wherever they run. */
    return dsc_error((dsc_code)code, "stopping because %s", message);
}
