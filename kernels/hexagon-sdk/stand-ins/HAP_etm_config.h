// Compile-check stand-in for the Hexagon SDK header of the same name (see AEEStdErr.h).
#pragma once
int HAP_user_etm_enable(void);
int HAP_user_etm_disable(void);
