// v79 compile-check stub of the Hexagon SDK's qurt_thread.h.
#pragma once
typedef unsigned int qurt_thread_t;
