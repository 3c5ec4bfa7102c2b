// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
#include <stddef.h>
#include <stdint.h>
#define RPCMEM_HEAP_ID_SYSTEM 25
#define RPCMEM_DEFAULT_FLAGS  1
#ifdef __cplusplus
extern "C" {
#endif
void * rpcmem_alloc(int heapid, uint32_t flags, int size);
void * rpcmem_alloc2(int heapid, uint32_t flags, size_t size);
void   rpcmem_free(void * po);
int    rpcmem_to_fd(void * po);
#ifdef __cplusplus
}
#endif
