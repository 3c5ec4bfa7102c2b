// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
#include <stdint.h>
typedef struct { unsigned long long attributes[8]; } compute_res_attr_t;
int      HAP_compute_res_attr_init(compute_res_attr_t * attr);
int      HAP_compute_res_attr_set_serialize(compute_res_attr_t * attr, unsigned char serialize);
int      HAP_compute_res_attr_set_cache_mode(compute_res_attr_t * attr, unsigned char mode);
int      HAP_compute_res_attr_set_hmx_param(compute_res_attr_t * attr, unsigned char lock);
int      HAP_compute_res_attr_set_vtcm_param_v2(compute_res_attr_t * attr, unsigned int size,
                                                unsigned int min_page_size, unsigned int min_size);
int      HAP_compute_res_attr_set_release_callback(compute_res_attr_t * attr,
                                                   int (*callback)(unsigned int context_id, void * client_context),
                                                   void * client_context);
int      HAP_compute_res_attr_get_vtcm_ptr_v2(compute_res_attr_t * attr, void ** vtcm, unsigned int * size);
unsigned HAP_compute_res_acquire(compute_res_attr_t * attr, unsigned int timeout_us);
int      HAP_compute_res_release(unsigned int context_id);
int      HAP_compute_res_acquire_cached(unsigned int context_id, unsigned int timeout_us);
int      HAP_compute_res_release_cached(unsigned int context_id);
int      HAP_compute_res_update_priority(unsigned int context_id, unsigned short priority);
int      HAP_compute_res_hmx_lock(unsigned int context_id);
int      HAP_compute_res_hmx_unlock(unsigned int context_id);
int      HAP_compute_res_query_VTCM(unsigned int application_id, unsigned int * total_block_size,
                                    void * total_block_layout, unsigned int * avail_block_size,
                                    void * avail_block_layout);
