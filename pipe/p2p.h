/* Private to pipe/ (and inference/pipeline.c, whose serving stages send
 * activations the same way): point-to-point transfers of activations and
 * gradients between virtual stages, with the meta handshake. See pipe/p2p.c. */
#ifndef DSC_PIPE_P2P_H
#define DSC_PIPE_P2P_H

#include "dsc/comm.h"
#include "dsc/tensor.h"

typedef struct pipe_p2p pipe_p2p;

/* Collective over `pipe` (comm rank = stage), which it borrows: transfers
 * time out after pipe's timeout. */
dsc_status pipe_p2p_create(dsc_comm *pipe, int chunks, pipe_p2p **out);
void pipe_p2p_destroy(pipe_p2p *p);

/* Starts a batch: the first activation on each edge carries a meta header
 * (dtype, shape), so a shape may change from one batch to the next. */
void pipe_p2p_begin_batch(pipe_p2p *p);

/* Posts the activation output of local chunk `chunk` to (peer_stage,
 * peer_chunk); `t` must stay untouched until pipe_p2p_wait_sends. */
dsc_status pipe_p2p_send_activation(pipe_p2p *p, const dsc_tensor *t, int chunk, int peer_stage, int peer_chunk);
/* Receives the input of local chunk `chunk` into `buf`, whose shape is the
 * largest accepted (B, T, C): a header with another dtype, rank or width, or
 * larger (b, t), is DSC_ERR_INVALID naming both stages. *out is a view of
 * buf with the received shape. */
dsc_status pipe_p2p_recv_activation(pipe_p2p *p, dsc_tensor *buf, int chunk, int peer_stage, int peer_chunk,
                                    dsc_tensor *out);
/* Gradients carry no header: the receiver knows the shape (its own output). */
dsc_status pipe_p2p_send_grad(pipe_p2p *p, const dsc_tensor *t, int chunk, int peer_stage, int peer_chunk);
dsc_status pipe_p2p_recv_grad(pipe_p2p *p, dsc_tensor *t, int chunk, int peer_stage, int peer_chunk);

/* Transfers whose size both ends know, with no header and a request handle
 * (serving's pipeline, inference/pipeline.c, whose messages carry their own
 * header in the payload): `stream` (< PIPE_P2P_STREAMS) picks a tag of its
 * own, so the streams never match each other or the kinds above; between
 * two stages one stream's messages arrive in order. The send is posted (t
 * untouched until *req completes through dsc_comm_wait / dsc_comm_test);
 * the receive completes before it returns. */
enum { PIPE_P2P_STREAMS = 2 };
dsc_status pipe_p2p_isend_stream(pipe_p2p *p, const dsc_tensor *t, int peer_stage, int stream,
                                 dsc_comm_request **req);
dsc_status pipe_p2p_recv_stream(pipe_p2p *p, dsc_tensor *t, int peer_stage, int stream);

/* Completes every posted send (before a buffer they read is reused). */
dsc_status pipe_p2p_wait_sends(pipe_p2p *p);

#endif
