// v79 compile-check stub of the Hexagon SDK's qurt_futex.h.
#pragma once
int qurt_futex_wake(void * lock, int n_to_wake);
