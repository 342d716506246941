/* search_decide.c — the searchers' decisions over a table of trials: grid
 * and random start waiting trials up to max_concurrent_trials; ASHA
 * (asynchronous successive halving, Li et al. 2020) also promotes the top
 * 1/eta of each rung's results and stops the trials that can no longer
 * rank. Decisions depend only on the table, so a search resumed from its
 * stored trials decides as it would have. */
#include <math.h>
#include <string.h>

#include "search_internal.h"

static const char *const trial_state_names[API_TRIAL_STATE_COUNT] = {
    "WAITING", "RUNNING", "PROMOTED", "PAUSED", "STOPPED", "DONE", "FAILED"};

const char *api_trial_state_name(api_trial_state state) {
  return (unsigned)state < API_TRIAL_STATE_COUNT ? trial_state_names[state] : "UNKNOWN";
}

int api_trial_state_parse(const char *name) {
  for (int i = 0; i < API_TRIAL_STATE_COUNT; i++)
    if (strcmp(trial_state_names[i], name) == 0) return i;
  return -1;
}

int api_search_better(const api_search *s, double a, double b) {
  if (isnan(a)) return 0;
  if (isnan(b)) return 1;
  return s->mode_max ? a > b : a < b;
}

/* How many trials finished rung k ahead of trial t (better, or as good
 * and earlier). */
static int rank_at(const api_search *s, const api_trial_view *trials, int n, int k, int t) {
  int ahead = 0;
  double mine = trials[t].results[k];
  for (int u = 0; u < n; u++) {
    if (u == t || trials[u].n_results <= k) continue;
    double theirs = trials[u].results[k];
    if (api_search_better(s, theirs, mine) || (u < t && !api_search_better(s, mine, theirs)))
      ahead++;
  }
  return ahead;
}

/* The most results rung k can ever hold (those it has, and every trial
 * still able to reach it) over eta, at least 1: a paused trial with that
 * many ahead of it can never rank for promotion, since its rank only
 * grows as results arrive. */
static int max_promotions(const api_search *s, const api_trial_view *trials, int n, int k) {
  int m = 0;
  for (int t = 0; t < n; t++) {
    api_trial_state st = trials[t].state;
    if (trials[t].n_results > k || st == API_TRIAL_WAITING || st == API_TRIAL_RUNNING ||
        st == API_TRIAL_PROMOTED || st == API_TRIAL_PAUSED)
      m++;
  }
  return m / s->eta > 1 ? m / s->eta : 1;
}

static api_search_action act(api_search_action_kind kind, int trial) {
  return (api_search_action){kind, trial};
}

api_search_action api_search_next(const api_search *s, const api_trial_view *trials, int n) {
  int active = 0, waiting = -1, paused = 0;
  for (int t = 0; t < n; t++) {
    api_trial_state st = trials[t].state;
    if (st == API_TRIAL_RUNNING || st == API_TRIAL_PROMOTED) active++;
    if (st == API_TRIAL_WAITING && waiting < 0) waiting = t;
    if (st == API_TRIAL_PAUSED) paused++;
  }
  const int asha = s->searcher == API_SEARCHER_ASHA;
  const int last = s->n_rungs - 1;
  if (asha) {
    for (int t = 0; t < n; t++) {
      const api_trial_view *v = &trials[t];
      if (v->state != API_TRIAL_PAUSED || v->rung >= last || v->n_results <= v->rung) continue;
      if (rank_at(s, trials, n, v->rung, t) >= max_promotions(s, trials, n, v->rung))
        return act(API_ACTION_STOP, t);
    }
  }
  if (active < s->max_concurrent) {
    if (asha) {
      for (int k = last - 1; k >= 0; k--) {
        int finished = 0;
        for (int t = 0; t < n; t++) finished += trials[t].n_results > k;
        int allowed = finished / s->eta, best = -1, best_rank = allowed;
        for (int t = 0; t < n; t++) {
          if (trials[t].state != API_TRIAL_PAUSED || trials[t].rung != k) continue;
          int r = rank_at(s, trials, n, k, t);
          if (r < best_rank) best = t, best_rank = r;
        }
        if (best >= 0) return act(API_ACTION_PROMOTE, best);
      }
    }
    if (waiting >= 0) return act(API_ACTION_START, waiting);
  }
  if (active > 0 || waiting >= 0) return act(API_ACTION_NONE, -1);
  if (asha && paused > 0) {
    /* Nothing runs or waits: the best paused trial of the highest rung
     * goes on while the rung above it is empty, so the search ends with
     * one trained to max_epochs. */
    int best = -1;
    for (int t = 0; t < n; t++) {
      const api_trial_view *v = &trials[t];
      if (v->state != API_TRIAL_PAUSED || v->rung >= last || v->n_results <= v->rung) continue;
      int above = 0;
      for (int u = 0; u < n && !above; u++)
        above = trials[u].n_results > v->rung + 1 ||
                ((trials[u].state == API_TRIAL_RUNNING || trials[u].state == API_TRIAL_PROMOTED) &&
                 trials[u].rung > v->rung);
      if (above) continue;
      if (best < 0 || v->rung > trials[best].rung ||
          (v->rung == trials[best].rung &&
           api_search_better(s, v->results[v->rung], trials[best].results[v->rung])))
        best = t;
    }
    if (best >= 0) return act(API_ACTION_PROMOTE, best);
    for (int t = 0; t < n; t++)
      if (trials[t].state == API_TRIAL_PAUSED) return act(API_ACTION_STOP, t);
  }
  return act(API_ACTION_FINISH, -1);
}
