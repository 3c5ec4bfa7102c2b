// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
#include "HAP_power.h"
int HAP_set_dcvs_v3_protected_bus_corners(HAP_power_request_t * request, unsigned char enable);
