// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h): the
// request fields ggml-hexagon's DSP side sets.
#pragma once
#include <stdint.h>
typedef enum { HAP_DCVS_VCORNER_DISABLE, HAP_DCVS_VCORNER_MAX = 255 } HAP_dcvs_voltage_corner_t;
typedef enum { HAP_DCVS_EXP_VCORNER_DISABLE, HAP_DCVS_EXP_VCORNER_MAX = 255 } HAP_dcvs_exp_voltage_corner_t;
typedef enum { HAP_CLK_PERF_LOW, HAP_CLK_PERF_HIGH } HAP_clk_perf_mode_t;
typedef enum { HAP_POWER_UNKNOWN_CLIENT_CLASS, HAP_POWER_COMPUTE_CLIENT_CLASS = 2 } HAP_power_app_type_payload;
typedef enum {
    HAP_power_set_mips_bw, HAP_power_set_HVX, HAP_power_set_apptype, HAP_power_set_linelock,
    HAP_power_set_DCVS, HAP_power_set_DCVS_v2, HAP_power_set_DCVS_v3, HAP_power_set_HMX, HAP_power_set_HMX_v2,
} HAP_Power_request_type;
typedef struct { HAP_dcvs_voltage_corner_t min_corner, max_corner, target_corner; } HAP_dcvs_params_t;
typedef struct {
    uint32_t set_dcvs_enable, dcvs_enable, set_bus_params, set_core_params, set_sleep_disable, sleep_disable;
    HAP_dcvs_params_t bus_params, core_params;
} HAP_power_dcvs_v3_payload;
typedef struct { uint32_t power_up; } HAP_power_hvx_payload;
typedef struct { uint32_t power_up; } HAP_power_hmx_payload;
typedef struct {
    uint32_t set_power, power_up, set_clock;
    HAP_dcvs_exp_voltage_corner_t target_corner, min_corner, max_corner;
    HAP_clk_perf_mode_t perf_mode;
} HAP_power_hmx_payload_v2;
typedef struct {
    HAP_Power_request_type type;
    union {
        HAP_power_app_type_payload apptype;
        HAP_power_dcvs_v3_payload  dcvs_v3;
        HAP_power_hvx_payload      hvx;
        HAP_power_hmx_payload      hmx;
        HAP_power_hmx_payload_v2   hmx_v2;
    };
} HAP_power_request_t;
int HAP_power_set(void * context, HAP_power_request_t * request);
