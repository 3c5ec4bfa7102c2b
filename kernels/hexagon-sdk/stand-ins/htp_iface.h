// Syntax-check stand-in for htp_iface.h, which the build generates from htp/htp_iface.idl with
// the SDK's qaic: the IDL's functions with qaic's C types (uint32 -> unsigned int,
// uint64 -> unsigned long long).
#pragma once
#include "remote.h"

typedef struct htp_iface_pmu_conf { unsigned int events[8]; } htp_iface_pmu_conf;

#ifdef __cplusplus
extern "C" {
#endif
int htp_iface_open(const char * uri, remote_handle64 * h);
int htp_iface_close(remote_handle64 h);
int htp_iface_start(remote_handle64 h, unsigned int sess_id, unsigned long long dsp_queue_id, unsigned int n_hvx, unsigned int n_hmx, unsigned long long max_vmem);
int htp_iface_stop(remote_handle64 h);
int htp_iface_mmap(remote_handle64 h, unsigned int fd, unsigned long long size);
int htp_iface_munmap(remote_handle64 h, unsigned int fd);
int htp_iface_profiler(remote_handle64 h, unsigned int mode, const htp_iface_pmu_conf * pmu);
int htp_iface_etm(remote_handle64 h, unsigned int enable);
int htp_iface_hwinfo(remote_handle64 h, unsigned int * n_threads, unsigned int * n_hvx, unsigned int * n_hmx, unsigned long long * vtcm_size);
#ifdef __cplusplus
}
#endif
