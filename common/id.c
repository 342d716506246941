/* id.c — resource ids: a date prefix so ids sort roughly by creation,
 * then 64 random bits. */
#include <stdio.h>
#include <sys/random.h>
#include <time.h>

#include "common.h"

int kc_new_id(char out[40]) {
  unsigned char raw[8];
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return -1;
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  int n = snprintf(out, 40, "%04d%02d%02d-", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
  for (size_t i = 0; i < sizeof raw; i++) n += snprintf(out + n, (size_t)(40 - n), "%02x", raw[i]);
  return 0;
}
