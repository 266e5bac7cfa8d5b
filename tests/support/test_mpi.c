/* Runs a cmocka group on every rank; a failing rank aborts the job so the
 * others never hang in a collective waiting for it. */
#include <mpi.h>
#include <stdio.h>

#include "dsc/log.h"
#include "test_mpi.h"

int dsc_test_run_mpi(const char *name, const struct CMUnitTest *tests, size_t count) {
    int initialized;
    MPI_Initialized(&initialized);
    if (!initialized) MPI_Init(NULL, NULL);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dsc_set_rank(rank);
    char group[256];
    snprintf(group, sizeof group, "%s [rank %d of %d]", name, rank, size);
    int failed = _cmocka_run_group_tests(group, tests, count, NULL, NULL);
    int any_failed = 0;
    /* A rank that failed mid-collective may leave peers blocked; abort then. */
    if (failed) {
        fprintf(stderr, "rank %d: %d test(s) failed, aborting the job\n", rank, failed);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any_failed ? 1 : 0;
}
