// Compile-check stand-in for the Hexagon SDK (QuRT) header of the same name (see AEEStdErr.h).
#pragma once
typedef unsigned int qurt_addr_t;
typedef unsigned int qurt_size_t;
typedef enum { QURT_MEM_CACHE_FLUSH, QURT_MEM_CACHE_INVALIDATE, QURT_MEM_CACHE_FLUSH_INVALIDATE,
               QURT_MEM_CACHE_FLUSH_ALL, QURT_MEM_CACHE_FLUSH_INVALIDATE_ALL } qurt_mem_cache_op_t;
typedef enum { QURT_MEM_ICACHE, QURT_MEM_DCACHE } qurt_mem_cache_type_t;
int qurt_mem_cache_clean(qurt_addr_t addr, qurt_size_t size, qurt_mem_cache_op_t opcode, qurt_mem_cache_type_t type);
