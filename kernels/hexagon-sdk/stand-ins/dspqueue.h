// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h): the
// dspqueue API of both sides (host: create/export/read; DSP: import/peek/read_noblock).
#pragma once
#include <stdint.h>
#include "AEEStdErr.h"

typedef struct dspqueue * dspqueue_t;
typedef void (*dspqueue_callback_t)(dspqueue_t queue, AEEResult error, void * context);

enum { DSPQUEUE_BUFFER_FLAG_FLUSH_SENDER = 1, DSPQUEUE_BUFFER_FLAG_INVALIDATE_RECIPIENT = 2 };
#define DSPQUEUE_TIMEOUT_NONE 0xffffffff

struct dspqueue_buffer { uint32_t fd; uint32_t size; uint32_t offset; uint32_t flags; void * ptr; };

#ifdef __cplusplus
extern "C" {
#endif
AEEResult dspqueue_create(int domain, uint32_t flags, uint32_t req_queue_size, uint32_t resp_queue_size,
                          dspqueue_callback_t packet_callback, dspqueue_callback_t error_callback,
                          void * callback_context, dspqueue_t * queue);
AEEResult dspqueue_import(uint64_t id, dspqueue_callback_t packet_callback, dspqueue_callback_t error_callback,
                          void * callback_context, dspqueue_t * queue);
AEEResult dspqueue_close(dspqueue_t queue);
AEEResult dspqueue_export(dspqueue_t queue, uint64_t * queue_id);
AEEResult dspqueue_write(dspqueue_t queue, uint32_t flags, uint32_t num_buffers, struct dspqueue_buffer * buffers,
                         uint32_t message_length, const uint8_t * message, uint32_t timeout_us);
AEEResult dspqueue_read(dspqueue_t queue, uint32_t * flags, uint32_t max_buffers, uint32_t * num_buffers,
                        struct dspqueue_buffer * buffers, uint32_t max_message_length, uint32_t * message_length,
                        uint8_t * message, uint32_t timeout_us);
AEEResult dspqueue_read_noblock(dspqueue_t queue, uint32_t * flags, uint32_t max_buffers, uint32_t * num_buffers,
                                struct dspqueue_buffer * buffers, uint32_t max_message_length,
                                uint32_t * message_length, uint8_t * message);
AEEResult dspqueue_peek(dspqueue_t queue, uint32_t * flags, uint32_t * num_buffers, uint32_t * message_length,
                        uint32_t timeout_us);
#ifdef __cplusplus
}
#endif
