// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
#include <stddef.h>
#include <stdint.h>
#define HAP_PROT_READ               1
#define HAP_PROT_WRITE              2
#define HAP_MEM_CACHE_NON_SHARED    0x10
#define HAP_MEM_FLAGS_EXTENDED_MAP  0x100
enum { HAP_MEM_MAP = 1, HAP_MEM_UNMAP = 2 };
typedef struct {
    int request_id;
    union {
        struct { uint64_t len; uint32_t prot; uint32_t flags; int fd; uint64_t dsp_va; } mmap;
        struct { uint64_t dsp_va; uint64_t len; } munmap;
    };
} HAP_mem_req_payload_t;
int    HAP_mem_request(HAP_mem_req_payload_t * payload);
void * HAP_mmap(void * addr, int len, int prot, int flags, int fd, long offset);
int    HAP_munmap(void * addr, int len);
void * HAP_mmap2(void * addr, size_t len, int prot, int flags, int fd, long offset);
int    HAP_munmap2(void * addr, size_t len);
