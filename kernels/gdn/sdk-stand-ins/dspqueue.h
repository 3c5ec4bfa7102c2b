// Syntax-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
#include <stdint.h>

typedef struct dspqueue * dspqueue_t;

enum { DSPQUEUE_BUFFER_FLAG_FLUSH_SENDER = 1, DSPQUEUE_BUFFER_FLAG_INVALIDATE_RECIPIENT = 2 };
#define DSPQUEUE_TIMEOUT_NONE 0xffffffff

struct dspqueue_buffer { uint32_t fd; uint32_t size; uint32_t offset; uint32_t flags; void * ptr; };

#ifdef __cplusplus
extern "C" {
#endif
int dspqueue_create(int domain, uint32_t flags, uint32_t req_queue_size, uint32_t resp_queue_size,
                    void * packet_callback, void * error_callback, void * callback_context, dspqueue_t * queue);
int dspqueue_close(dspqueue_t queue);
int dspqueue_export(dspqueue_t queue, uint64_t * queue_id);
int dspqueue_write(dspqueue_t queue, uint32_t flags, uint32_t num_buffers, struct dspqueue_buffer * buffers,
                   uint32_t message_length, const uint8_t * message, uint32_t timeout_us);
int dspqueue_read(dspqueue_t queue, uint32_t * flags, uint32_t max_buffers, uint32_t * num_buffers,
                  struct dspqueue_buffer * buffers, uint32_t max_message_length, uint32_t * message_length,
                  uint8_t * message, uint32_t timeout_us);
#ifdef __cplusplus
}
#endif
