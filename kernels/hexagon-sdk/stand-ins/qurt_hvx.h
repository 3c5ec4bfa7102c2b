// Compile-check stand-in for the Hexagon SDK (QuRT) header of the same name (see AEEStdErr.h).
#pragma once
int qurt_hvx_get_units(void);
int qurt_hvx_unlock(void);
