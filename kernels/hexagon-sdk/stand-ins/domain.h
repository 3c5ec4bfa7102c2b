// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h): the
// table of FastRPC domains (the type `domain` comes from remote.h).
#pragma once
#include "remote.h"
static domain supported_domains[] = { { CDSP_DOMAIN_ID, "file:///libcdsprpc.so?cdsp" } };
