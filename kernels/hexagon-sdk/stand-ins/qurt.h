// Compile-check stand-in for the Hexagon SDK (QuRT) header of the same name (see AEEStdErr.h):
// like the SDK's, it includes the other qurt_*.h and declares the PMU, sysenv and timer calls.
#pragma once
#include <stdlib.h>
#include "qurt_futex.h"
#include "qurt_hvx.h"
#include "qurt_memory.h"
#include "qurt_thread.h"
typedef struct { unsigned int max_hthreads; } qurt_sysenv_max_hthreads_t;
int qurt_sysenv_get_max_hw_threads(qurt_sysenv_max_hthreads_t * info);
enum { QURT_PMUCNT0, QURT_PMUCNT1, QURT_PMUCNT2, QURT_PMUCNT3, QURT_PMUCFG, QURT_PMUEVTCFG,
       QURT_PMUCNT4, QURT_PMUCNT5, QURT_PMUCNT6, QURT_PMUCNT7, QURT_PMUEVTCFG1 };
void         qurt_pmu_set(int reg_id, unsigned int reg_value);
unsigned int qurt_pmu_get(int reg_id);
int          qurt_pmu_enable(int enable);
void         qurt_sleep(unsigned long long duration);
