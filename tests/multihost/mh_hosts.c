/* mh_hosts: where a job's ranks run, for the multi-host tests' placement
 * checks. World rank 0 prints "rank R of N on host H" for every rank, from
 * the host names dsc's communicator gathered at creation (dsc_comm_host),
 * which on the test hosts are their names.
 * Not here: the checks (test_multihost.sh). */
#include <stdio.h>

#include "dsc/comm.h"

int main(void) {
    dsc_comm *world = NULL;
    dsc_status s = dsc_comm_world(NULL, &world);
    if (s) {
        fprintf(stderr, "dsc: rank %d failed: %s\n", dsc_get_rank(), dsc_status_message(s));
        dsc_status_free(s);
        return 1;
    }
    for (int r = 0; dsc_comm_rank(world) == 0 && r < dsc_comm_size(world); r++)
        printf("rank %d of %d on host %s\n", r, dsc_comm_size(world), dsc_comm_host(world, r));
    dsc_comm_free(world);
    dsc_status_free(dsc_comm_finalize());
    return 0;
}
