/* libFuzzer harness: the dsc JSON config and --set overrides. The input is
 * split at NUL bytes: the first piece is the config text, each later piece
 * (up to 8) one "key=value" override, applied as dsc-train applies --set.
 * A config that parses is emitted back as JSON and parsed again, which must
 * succeed: what the parser accepted, it must be able to state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/config.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    const char *sets[8];
    int n = 0;
    for (char *p = text + strlen(text); p < text + size && n < 8; p += strlen(p))
        sets[n++] = ++p;
    dsc_config cfg;
    dsc_status s = dsc_config_parse_string(text, "fuzz.json", sets, n, &cfg);
    if (s) {
        dsc_status_free(s);
        free(text);
        return 0;
    }
    char *json;
    if (dsc_config_to_json(&cfg, &json)) abort();
    dsc_config again;
    s = dsc_config_parse_string(json, "emitted.json", NULL, 0, &again);
    if (s) {
        fprintf(stderr, "the emitted config does not parse: %s\n%s\n", dsc_status_message(s), json);
        abort();
    }
    dsc_config_free(&again);
    free(json);
    dsc_config_free(&cfg);
    free(text);
    return 0;
}
