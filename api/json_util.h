/* json_util.h — jansson helpers shared by the files of the api module
 * (private: other modules include api.h only). */
#ifndef KILN_API_JSON_UTIL_H
#define KILN_API_JSON_UTIL_H

#include <jansson.h>

/* "object", "array", "string", "integer", "number", "boolean" or "null",
 * as error messages name a value's type. */
const char *api_json_type_name(const json_t *value);
/* Fewest significant digits (1..17) that read back as exactly this double;
 * JSON is written with the most any of its numbers needs, so every value
 * round-trips exactly and 0.5 stays "0.5". */
int api_json_real_digits(double value);

#endif
