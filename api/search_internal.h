/* search_internal.h — private to api/: the parsed search that search.c
 * makes and search_decide.c reads. */
#ifndef KILN_API_SEARCH_INTERNAL_H
#define KILN_API_SEARCH_INTERNAL_H

#include <jansson.h>
#include <stdint.h>

#include "api_search.h"

typedef enum search_param_type {
  SEARCH_UNIFORM = 0,
  SEARCH_LOG_UNIFORM,
  SEARCH_INT_UNIFORM,
  SEARCH_CATEGORICAL,
} search_param_type;

typedef struct search_param {
  char path[API_SEARCH_PATH_LEN];
  search_param_type type;
  double min, max; /* uniform, log_uniform, int_uniform */
  int count;       /* grid points of a range; 0 = not given */
  json_t *values;  /* categorical: a non-empty array (owned reference) */
} search_param;

struct api_search {
  api_searcher searcher;
  char metric[API_SEARCH_METRIC_LEN];
  int mode_max;
  int max_trials, max_concurrent;
  uint64_t seed;
  int n_params;
  search_param params[API_SEARCH_MAX_PARAMS];
  int n_trials;
  /* asha */
  int min_epochs, max_epochs, eta;
  int n_rungs;
  int rung_epochs[API_SEARCH_MAX_RUNGS];
};

#endif
