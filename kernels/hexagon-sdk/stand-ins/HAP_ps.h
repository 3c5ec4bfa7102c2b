// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
#include <stdint.h>
int HAP_setFARFRuntimeLoggingParams(uint32_t mask, const char * files[], uint16_t numberOfFiles);
