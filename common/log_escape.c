/* log_escape.c — text from users and trainers made safe for a log line: a
 * display_name with a newline must not start a line of its own. */
#include <stdio.h>

#include "common.h"

size_t kc_log_escape(char *out, size_t outlen, const char *in, int quotes) {
  size_t used = 0;
  if (outlen == 0) return 0;
  for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
    char buf[5];
    const char *piece = buf;
    if (*p == '\n') {
      piece = "\\n";
    } else if (*p == '\r') {
      piece = "\\r";
    } else if (*p == '\t') {
      piece = "\\t";
    } else if (*p < 0x20 || *p == 0x7f) {
      snprintf(buf, sizeof buf, "\\x%02x", *p);
    } else if (quotes && (*p == '"' || *p == '\\')) {
      buf[0] = '\\';
      buf[1] = (char)*p;
      buf[2] = '\0';
    } else {
      buf[0] = (char)*p;
      buf[1] = '\0';
    }
    size_t len = 0;
    while (piece[len]) len++;
    if (used + len >= outlen) break; /* cut whole escapes only */
    for (size_t i = 0; i < len; i++) out[used++] = piece[i];
  }
  out[used] = '\0';
  return used;
}
