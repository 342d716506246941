/* state.c — job state names as they appear in the API and in storage, and
 * which states are final. */
#include "api.h"

#include <string.h>

static const char *const state_names[API_JOB_STATE_COUNT] = {
    [API_JOB_QUEUED] = "QUEUED",       [API_JOB_STARTING] = "STARTING",
    [API_JOB_RUNNING] = "RUNNING",     [API_JOB_STOPPING] = "STOPPING",
    [API_JOB_SUCCEEDED] = "SUCCEEDED", [API_JOB_FAILED] = "FAILED",
    [API_JOB_CANCELLED] = "CANCELLED", [API_JOB_PREEMPTED] = "PREEMPTED",
};

const char *api_job_state_name(api_job_state state) {
  if ((int)state < 0 || state >= API_JOB_STATE_COUNT) return "UNKNOWN";
  return state_names[state];
}

int api_job_state_parse(const char *name) {
  if (!name) return -1;
  for (int state = 0; state < API_JOB_STATE_COUNT; state++)
    if (strcmp(name, state_names[state]) == 0) return state;
  return -1;
}

/* PREEMPTED is not terminal: a preempted job goes back to QUEUED. */
int api_job_state_is_terminal(api_job_state state) {
  return state == API_JOB_SUCCEEDED || state == API_JOB_FAILED || state == API_JOB_CANCELLED;
}
