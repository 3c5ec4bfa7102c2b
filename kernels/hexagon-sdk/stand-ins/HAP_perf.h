// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
#include <stdint.h>
uint64_t HAP_perf_get_qtimer_count(void);
uint64_t HAP_perf_qtimer_count_to_us(uint64_t count);
