/* OpenAI-shaped bodies and server-sent event chunks for a job (response.c).
 * The caller holds the server's mutex; returned strings are malloc'd (NULL
 * when out of memory). */
#ifndef DSC_SERVE_RESPONSE_H
#define DSC_SERVE_RESPONSE_H

#include "serve/serve_internal.h"
#include "serve/strbuf.h"

char *serve_json_final(const dsc_server *srv, const serve_job *job);
char *serve_json_error(const serve_error *e);
char *serve_json_models(const dsc_server *srv);
/* The chunks before any token: chat's role, an echoed prompt. */
void serve_sse_begin(const dsc_server *srv, const serve_job *job, serve_buf *out);
/* One chunk per event in [from, to). */
void serve_sse_events(const dsc_server *srv, const serve_job *job, int32_t from, int32_t to, serve_buf *out);
/* An error event when the job failed, the usage chunk when asked, `data: [DONE]`. */
void serve_sse_end(const dsc_server *srv, const serve_job *job, serve_buf *out);

#endif
