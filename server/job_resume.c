/* job_resume.c — POST /v1/jobs/{job}:resume: a cancelled or failed job goes
 * back to the queue, and the scheduler starts it from its newest checkpoint
 * (or from the start when it has none). */
#include <stdio.h>
#include <string.h>

#include "routes.h"

void http_resume_job(const http_config *cfg, http_request *req, http_response *res) {
  store_job job;
  if (http_load_job(cfg, req, &job, res) != 0) return;
  store_checkpoint *list = NULL;
  int n = 0;
  if (store_checkpoint_list(cfg->st, job.id, &list, &n) != STORE_OK) {
    store_job_clear(&job);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  char msg[256];
  if (n > 0)
    snprintf(msg, sizeof msg,
             "resumed by a client from %s; continues from its newest checkpoint "
             "(step %lld)",
             job.state, (long long)list[n - 1].step);
  else
    snprintf(msg, sizeof msg,
             "resumed by a client from %s; it has no checkpoint, so it starts "
             "over",
             job.state);
  store_checkpoint_list_free(list, n);
  /* Only from the state read above: a job that changed meanwhile conflicts. */
  int rc = STORE_CONFLICT;
  if (strcmp(job.state, "CANCELLED") == 0 || strcmp(job.state, "FAILED") == 0)
    rc = store_job_transition(cfg->st, job.id, job.state, "QUEUED", "RESUME_REQUESTED", msg);
  if (rc == STORE_CONFLICT) {
    http_reply_status(res, 409, "FAILED_PRECONDITION", "state",
                      "job %s is %s; only a CANCELLED or FAILED job can be resumed", job.id,
                      job.state);
    store_job_clear(&job);
    return;
  }
  if (rc != STORE_OK) {
    store_job_clear(&job);
    http_reply_store_failure(res, cfg->st);
    return;
  }
  sched_wake(cfg->scheduler);
  char id[sizeof job.id];
  snprintf(id, sizeof id, "%s", job.id);
  store_job_clear(&job);
  if (store_job_get(cfg->st, id, &job) != STORE_OK) {
    http_reply_store_failure(res, cfg->st);
    return;
  }
  http_reply_json(res, 200, http_job_json(cfg->st, &job, 0));
  store_job_clear(&job);
}
