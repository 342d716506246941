/* json_util.c — jansson helpers shared by spec.c and progress.c. */
#include <stdio.h>
#include <stdlib.h>

#include "json_util.h"

const char *api_json_type_name(const json_t *value) {
  switch (json_typeof(value)) {
  case JSON_OBJECT: return "object";
  case JSON_ARRAY: return "array";
  case JSON_STRING: return "string";
  case JSON_INTEGER: return "integer";
  case JSON_REAL: return "number";
  case JSON_TRUE:
  case JSON_FALSE: return "boolean";
  case JSON_NULL: return "null";
  }
  return "unknown";
}

int api_json_real_digits(double value) {
  char text[40];
  for (int digits = 1; digits < 17; digits++) {
    snprintf(text, sizeof text, "%.*g", digits, value);
    if (strtod(text, NULL) == value) return digits;
  }
  return 17;
}
