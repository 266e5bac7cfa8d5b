/* A small HTTP/1.1 client for 127.0.0.1 only, for dsc-serve's tests and
 * load generator: one request per connection (Connection: close), every
 * read bounded by a timeout, bodies de-chunked, server-sent events read one
 * at a time. Not a general client: no TLS, no redirects, no other hosts. */
#ifndef DSC_SERVE_CLIENT_H
#define DSC_SERVE_CLIENT_H

#include <stddef.h>

#include "dsc/status.h"

typedef struct serve_client serve_client;

/* Connects to 127.0.0.1:port, sends the request (`headers`: extra "Name:
 * value\r\n" lines or NULL; body NULL: none) and reads the status line and
 * headers. rcvbuf > 0 sets the socket's receive buffer (a slow reader). */
dsc_status serve_client_open(int port, const char *method, const char *path, const char *headers, const char *body,
                             double timeout_s, int rcvbuf, serve_client **out);
int serve_client_status(const serve_client *c);
/* A response header's value (case-insensitive name), or NULL. */
const char *serve_client_header(const serve_client *c, const char *name);
/* The whole body, NUL-terminated; owned by c. */
dsc_status serve_client_body(serve_client *c, const char **body, size_t *len);
/* The next server-sent event's data; *data NULL at the end of the stream. Owned by c until the next call. */
dsc_status serve_client_event(serve_client *c, const char **data);
/* Closes the connection (abruptly when the body is unread: a client that leaves). */
void serve_client_close(serve_client *c);

/* One whole request: *status and a malloc'd *body. */
dsc_status serve_client_fetch(int port, const char *method, const char *path, const char *headers,
                              const char *body, double timeout_s, int *status, char **body_out);

#endif
