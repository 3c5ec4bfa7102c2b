// Compile-check stand-in for the Hexagon SDK (QuRT) header of the same name (see AEEStdErr.h).
#pragma once
#include <stdint.h>
typedef unsigned int qurt_thread_t;
typedef struct { char name[16]; unsigned short priority; unsigned int stack_size; void * stack_addr; } qurt_thread_attr_t;
void qurt_thread_attr_init(qurt_thread_attr_t * attr);
void qurt_thread_attr_set_name(qurt_thread_attr_t * attr, const char * name);
void qurt_thread_attr_set_priority(qurt_thread_attr_t * attr, unsigned short priority);
void qurt_thread_attr_set_stack_size(qurt_thread_attr_t * attr, unsigned int stack_size);
void qurt_thread_attr_set_stack_addr(qurt_thread_attr_t * attr, void * stack_addr);
int  qurt_thread_create(qurt_thread_t * thread_id, qurt_thread_attr_t * attr, void (*entrypoint)(void *), void * arg);
int  qurt_thread_join(unsigned int tid, int * status);
qurt_thread_t qurt_thread_get_id(void);
int  qurt_thread_get_priority(qurt_thread_t threadid);
