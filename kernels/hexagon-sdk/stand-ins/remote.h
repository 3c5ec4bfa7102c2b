// Syntax-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h): the FastRPC API of the host side.
// Struct members are those ggml-hexagon.cpp sets or reads.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef uint32_t remote_handle;
typedef uint64_t remote_handle64;

typedef struct { void * pv; size_t nLen; } remote_buf;
typedef union { remote_buf buf; remote_handle h; remote_handle64 h64; } remote_arg;

#define CDSP_DOMAIN_ID   3
#define CDSP_DOMAIN_NAME "cdsp"

typedef enum fastrpc_map_flags { FASTRPC_MAP_FD, FASTRPC_MAP_FD_DELAYED, FASTRPC_MAP_FD_DELAYED_EXTENDED } fastrpc_map_flags;

enum {
    DSPRPC_CONTROL_LATENCY,
    DSPRPC_CONTROL_UNSIGNED_MODULE,
    FASTRPC_RESERVE_NEW_SESSION,
    FASTRPC_GET_EFFECTIVE_DOMAIN_ID,
    FASTRPC_GET_URI,
    FASTRPC_GET_DOMAINS,
    DSPRPC_GET_DSP_INFO,
};

enum { ARCH_VER = 1 };
struct remote_dsp_capability { uint32_t domain; uint32_t attribute_ID; uint32_t capability; };

enum { FASTRPC_NSP = 1 };
#define DOMAINS_LIST_FLAGS_SET_TYPE(flags, type) ((flags) | (type))

struct remote_rpc_control_latency { uint32_t enable; uint32_t latency; };
struct remote_rpc_control_unsigned_module { int domain; int enable; };
struct remote_rpc_reserve_new_session {
    char * domain_name; uint32_t domain_name_len; char * session_name; uint32_t session_name_len;
    uint32_t effective_domain_id; uint32_t session_id;
};
struct remote_rpc_effective_domain_id { char * domain_name; uint32_t domain_name_len; uint32_t session_id; uint32_t effective_domain_id; };
struct remote_rpc_get_uri {
    char * domain_name; uint32_t domain_name_len; uint32_t session_id; char * module_uri; uint32_t module_uri_len;
    char * uri; uint32_t uri_len;
};

typedef struct { int id; const char * name; int type; int status; int instance_id; } fastrpc_domain;
typedef struct { int id; const char * uri; } domain;
typedef struct {
    int id;
    union {
        struct { fastrpc_domain * domains; int max_domains; int num_domains; uint32_t flags; } sys;
    };
} system_req_payload;

#ifdef __cplusplus
extern "C" {
#endif
int remote_session_control(uint32_t req, void * data, uint32_t datalen);
int remote_handle_control(uint32_t req, void * data, uint32_t datalen);
int remote_handle64_control(remote_handle64 h, uint32_t req, void * data, uint32_t datalen);
int remote_handle64_open(const char * name, remote_handle64 * ph);
int remote_handle64_invoke(remote_handle64 h, uint32_t dwScalars, remote_arg * pra);
int remote_handle64_close(remote_handle64 h);
int remote_system_request(system_req_payload * req);
int fastrpc_mmap(int domain, int fd, void * addr, int offset, size_t length, enum fastrpc_map_flags flags);
int fastrpc_munmap(int domain, int fd, void * addr, size_t length);
#ifdef __cplusplus
}
#endif
