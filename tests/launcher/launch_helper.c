/* A plain MPI program for the launcher's tests (not a test itself): every
 * rank sums its rank in a loop of MPI_Allreduce calls; one chosen rank can
 * fail in the middle of the loop, by exiting with an error message in dsc's
 * failure-note format or by a signal, while the others stay in the
 * collective. It can also print selected environment variables.
 *
 *   launch_helper ok TOKEN                 prints "rank R of N" and succeeds
 *   launch_helper fail RANK TOKEN          RANK exits with status 3 at iteration 50
 *   launch_helper signal RANK SIG TOKEN    RANK raises SIG at iteration 50
 *   launch_helper env NAME... TOKEN        rank 0 prints NAME=value for each NAME
 *
 * TOKEN only marks the processes so that a test can look for leftovers. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "ok";
    int victim = argc > 2 ? atoi(argv[2]) : -1;
    if (strcmp(mode, "env") == 0) {
        for (int i = 2; rank == 0 && i < argc - 1; i++) {
            const char *v = getenv(argv[i]);
            printf("%s=%s\n", argv[i], v ? v : "(unset)");
        }
    } else if (strcmp(mode, "fail") == 0 || strcmp(mode, "signal") == 0) {
        /* The survivors never leave the loop on their own: only the launcher's
         * failure handling can end them. */
        for (long it = 0;; it++) {
            if (rank == victim && it == 50) {
                if (mode[0] == 'f') {
                    fprintf(stderr, "dsc: rank %d failed: simulated error in allreduce %ld\n", rank, it);
                    fflush(stderr);
                    exit(3);
                }
                raise(atoi(argv[3]));
            }
            long x = rank, sum = 0;
            MPI_Allreduce(&x, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            if (sum != (long)size * (size - 1) / 2) {
                fprintf(stderr, "rank %d: wrong sum %ld\n", rank, sum);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
        }
    } else {
        printf("rank %d of %d\n", rank, size);
    }
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
