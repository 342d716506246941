/* fuzz_router.c — request routing and query arguments: "METHOD PATH\n"
 * then lines for the list filter, an integer argument and :wait's timeout.
 * A route found has every {param} filled with one non-empty segment; no
 * route and no allowed methods means 404; the argument parsers accept only
 * what their rules allow. */
#include "fuzz.h"

#include <string.h>

#include "routes.h"

/* The next line of *text (cut at '\n'), advancing past it; "" at the end. */
static char *next_line(char **text) {
  char *line = *text, *nl = strchr(line, '\n');
  if (nl) {
    *nl = '\0';
    *text = nl + 1;
  } else {
    *text = line + strlen(line);
  }
  return line;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = fuzz_cstr(data, size), *rest = copy;
  char *first = next_line(&rest);
  char *space = strchr(first, ' ');
  const char *method = "GET", *path = first;
  if (space) {
    *space = '\0';
    method = first;
    path = space + 1;
  }
  char *query = strchr(path, '?');
  if (query) *query = '\0';
  char params[HTTP_MAX_PARAMS][128];
  char allowed[64];
  const http_route *r = http_route_find(method, path, params, allowed, sizeof allowed);
  if (r) {
    FUZZ_CHECK(strcmp(r->method, method) == 0, "route %s %s for method %s", r->method, r->pattern,
               method);
    int n = 0;
    for (const char *p = r->pattern; (p = strchr(p, '{')); p++) n++;
    for (int i = 0; i < n; i++)
      FUZZ_CHECK(params[i][0] && !strpbrk(params[i], "/:"),
                 "param %d of %s is one non-empty segment, got '%s'", i, path, params[i]);
  }
  FUZZ_CHECK(strlen(allowed) < sizeof allowed, "allowed stays in its buffer");

  http_request req = {.method = method, .path = path};
  req.who.admin = size % 2;
  const char *filter = next_line(&rest);
  const char *state = NULL;
  char tenant[64] = "", why[256];
  if (http_parse_filter(filter, &req, &state, tenant, sizeof tenant, why, sizeof why) == 0) {
    FUZZ_CHECK(!state || api_job_state_parse(state) >= 0, "filter state '%s' is a state",
               state ? state : "");
    FUZZ_CHECK(req.who.admin || !tenant[0], "only an admin filters by tenant");
  } else {
    FUZZ_CHECK(why[0], "a refused filter says why");
  }
  const char *number = next_line(&rest);
  int value = -1;
  if (http_parse_int_arg(number, 1, 100000, &value) == 0)
    FUZZ_CHECK(value >= 1 && value <= 100000, "'%s' gave %d outside 1..100000", number, value);
  const char *timeout = next_line(&rest);
  double seconds = http_parse_duration(timeout);
  FUZZ_CHECK(seconds == -1 || seconds >= 0, "timeout '%s' gave %g", timeout, seconds);
  free(copy);
  return 0;
}
