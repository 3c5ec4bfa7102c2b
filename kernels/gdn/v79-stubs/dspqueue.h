// v79 compile-check stub of the Hexagon SDK's dspqueue.h.
#pragma once
typedef struct dspqueue * dspqueue_t;
