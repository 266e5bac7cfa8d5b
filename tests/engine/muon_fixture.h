/* Loads muon_fixtures.json (tests/ref/make_muon_fixtures.py), shared by the
 * Muon tests; NULL with a message on stderr when it cannot be read. */
#ifndef DSC_TEST_MUON_FIXTURE_H
#define DSC_TEST_MUON_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "test_mpi.h"

static inline cJSON *muon_fixture_load(void) {
    char *text = dsc_test_read_file(DSC_SOURCE_DIR "/tests/engine/muon_fixtures.json");
    if (!text) return fprintf(stderr, "muon_fixtures.json: cannot read\n"), NULL;
    cJSON *fixture = cJSON_Parse(text);
    free(text);
    if (!fixture) fprintf(stderr, "muon_fixtures.json: not JSON\n");
    return fixture;
}

#endif
