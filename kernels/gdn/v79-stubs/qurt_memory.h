// v79 compile-check stub of the Hexagon SDK's qurt_memory.h: nothing the GDN sources use.
#pragma once
