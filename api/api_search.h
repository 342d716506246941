/* api_search.h — an experiment's search: the search object parsed and
 * validated (with field paths in errors), the parameter values of each
 * trial (grid, seeded random), each trial's job spec made from the base
 * spec, and the searchers' decisions (which trial starts, which ASHA
 * promotes or stops, when the experiment is done). Pure: no I/O, no
 * globals. Part of the api module (prefix api_). */
#ifndef KILN_API_SEARCH_H
#define KILN_API_SEARCH_H

#include <stddef.h>

#include "api.h"

#define API_SEARCH_MAX_PARAMS  16
#define API_SEARCH_MAX_TRIALS  1000
#define API_SEARCH_MAX_RUNGS   16
#define API_SEARCH_PATH_LEN    96
#define API_SEARCH_METRIC_LEN  48
#define API_SEARCH_DEFAULT_ETA 3

typedef enum api_searcher {
  API_SEARCHER_GRID = 0,
  API_SEARCHER_RANDOM,
  API_SEARCHER_ASHA,
} api_searcher;

typedef struct api_search api_search;

/* Parses and validates a search object (len bytes of JSON). On failure -1
 * with err a 400 whose details name each bad field as "search.<field>"
 * ("search.parameters.optimizer.learning_rate.min"). Paths are checked
 * against a base spec by api_search_trial_spec, not here. */
int api_search_parse(const char *json, size_t len, api_search **out, api_error *err);
void api_search_free(api_search *s); /* NULL is a no-op */
/* The search as given with every default filled in (malloc'd JSON text;
 * api_search_parse accepts it and makes the same trials). */
char *api_search_to_json(const api_search *s);

api_searcher api_search_searcher(const api_search *s);
const char *api_search_searcher_name(api_searcher searcher); /* "grid", "random", "asha" */
const char *api_search_metric(const api_search *s);
int api_search_mode_max(const api_search *s); /* 1: a higher metric is better */
int api_search_max_concurrent(const api_search *s);
/* How many trials the search makes: the grid's points, else max_trials. */
int api_search_trial_count(const api_search *s);
int api_search_param_count(const api_search *s);
const char *api_search_param_path(const api_search *s, int i);
/* ASHA's rungs (1 for grid and random) and the epochs a trial has trained
 * when it ends rung r: min_epochs * eta^r, the last one max_epochs. 0 for
 * grid and random: the base spec's epochs apply. */
int api_search_rung_count(const api_search *s);
int api_search_rung_epochs(const api_search *s, int rung);

/* The values of trial index (0 <= index < api_search_trial_count) as a
 * JSON object {"path": value, ...} (malloc'd text): grid points in order,
 * the first parameter slowest; random and ASHA draws that depend only on
 * (seed, index), so the same seed makes the same trials. NULL when out of
 * memory or index is out of range. */
char *api_search_trial_values(const api_search *s, int index);
/* The job spec of a trial: base_spec (a canonical job spec's JSON, every
 * default present) with each value written at its path and, when epochs >
 * 0, "epochs" set to it; validated with api_spec_parse and returned in
 * canonical form in *out (malloc'd). -1 with err a 400 naming
 * "search.parameters.<path>" when a path does not exist in the base spec,
 * does not hold a value there, or its value makes an invalid spec. */
int api_search_trial_spec(const api_search *s, const char *base_spec, const char *values_json,
                          int epochs, char **out, api_error *err);

/* ---- the searchers' decisions ---- */

typedef enum api_trial_state {
  API_TRIAL_WAITING = 0, /* not started yet: no job */
  API_TRIAL_RUNNING,     /* its job trains toward the end of its rung */
  API_TRIAL_PROMOTED,    /* ASHA promoted it: its job resumes toward the next rung */
  API_TRIAL_PAUSED,      /* ASHA: finished a rung, waits on its checkpoint, holds no device */
  API_TRIAL_STOPPED,     /* ASHA did not promote it: it ends at its last rung */
  API_TRIAL_DONE,        /* trained its full budget */
  API_TRIAL_FAILED,      /* its job failed or was cancelled, or never reported the metric */
  API_TRIAL_STATE_COUNT
} api_trial_state;
const char *api_trial_state_name(api_trial_state state); /* "WAITING" ... */
int api_trial_state_parse(const char *name);             /* -1 when unknown */

/* A trial as the searcher sees it. */
typedef struct api_trial_view {
  api_trial_state state;
  /* RUNNING / PROMOTED: the rung it trains toward; otherwise the last rung
   * it finished (0 for one that never finished one). */
  int rung;
  int n_results;                        /* rungs finished: results[0 .. n_results) */
  double results[API_SEARCH_MAX_RUNGS]; /* the metric at the end of each (NaN: worst) */
} api_trial_view;

typedef enum api_search_action_kind {
  API_ACTION_NONE = 0, /* wait for a running trial */
  API_ACTION_START,    /* start trial (WAITING) toward rung 0 */
  API_ACTION_PROMOTE,  /* ASHA: resume trial (PAUSED) toward its next rung */
  API_ACTION_STOP,     /* ASHA: trial (PAUSED) can never be promoted: it stops */
  API_ACTION_FINISH,   /* nothing runs or waits any more: the experiment is done */
} api_search_action_kind;

typedef struct api_search_action {
  api_search_action_kind kind;
  int trial; /* index into trials; -1 for NONE and FINISH */
} api_search_action;

/* The next thing to do, given every trial's view (n = trial count). The
 * caller applies it, updates the view and asks again until NONE or
 * FINISH. Stops come first; then, while fewer than max_concurrent_trials
 * run, ASHA promotes a paused trial that ranks in the top 1/eta of its
 * rung's results (the highest rung first), else a waiting trial starts;
 * when no trial waits or runs and none ranks for promotion, ASHA promotes
 * the best paused trial of the highest rung, so the search always ends
 * with a trial trained to max_epochs. A paused trial stops as soon as so
 * many others beat it on its rung that it can never rank. */
api_search_action api_search_next(const api_search *s, const api_trial_view *trials, int n);
/* Whether metric a is better than b for this search (NaN is never better). */
int api_search_better(const api_search *s, double a, double b);

#endif
