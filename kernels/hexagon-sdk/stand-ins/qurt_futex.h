// Compile-check stand-in for the Hexagon SDK (QuRT) header of the same name (see AEEStdErr.h).
#pragma once
int qurt_futex_wait(void * lock, int val);
int qurt_futex_wake(void * lock, int n_to_wake);
