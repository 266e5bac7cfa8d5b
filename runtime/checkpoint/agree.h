/* Agreement on failure after a collective step: if any rank of `comm` failed,
 * every rank returns an error carrying the first failing rank's code and
 * message. */
#ifndef DSC_RUNTIME_CHECKPOINT_AGREE_H
#define DSC_RUNTIME_CHECKPOINT_AGREE_H

#include <mpi.h>

#include "dsc/status.h"

/* Collective over comm; consumes `local` and returns the agreed status. */
dsc_status dsc_agree(MPI_Comm comm, dsc_status local);

#endif
