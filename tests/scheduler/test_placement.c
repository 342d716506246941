/* test_placement.c — scheduling passes over queues made here: priority
 * order, gang placement (all devices or none), EASY backfill that never
 * pushes back the reserved job (and so never starves it), preemption
 * victims, fair share, the reasons :explain names, and pools files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "scheduler.h"

#define NOW    1000000
#define SECOND 1000

typedef struct world {
  sched_pool pools[2];
  sched_running_req running[16];
  int n_running;
  sched_job_req queue[64];
  int n_queue;
  int64_t starts[4];
  sched_planner *planner;
  sched_pass pass;
} world;

static void init(world *w, int devices) {
  memset(w, 0, sizeof *w);
  snprintf(w->pools[0].name, sizeof w->pools[0].name, "default");
  snprintf(w->pools[0].device_type, sizeof w->pools[0].device_type, "cpu");
  w->pools[0].n_devices = devices;
  for (int i = 0; i < devices; i++) w->pools[0].devices[i] = i;
  w->planner = sched_planner_new();
  assert_non_null(w->planner);
}

/* Queues a job (the caller keeps priority-then-age order). */
static int queue(world *w, int priority, int devices, int64_t max_runtime_ms) {
  sched_job_req *q = &w->queue[w->n_queue];
  memset(q, 0, sizeof *q);
  q->pool = 0;
  q->devices = devices;
  q->priority = priority;
  q->seq = w->n_queue + 1;
  q->max_runtime_ms = max_runtime_ms;
  return w->n_queue++;
}

static int running(world *w, int priority, int devices, int64_t end_by_ms) {
  sched_running_req *r = &w->running[w->n_running];
  memset(r, 0, sizeof *r);
  r->devices = devices;
  r->priority = priority;
  r->end_by_ms = end_by_ms;
  return w->n_running++;
}

static void plan(world *w, int preempt) {
  w->pass = (sched_pass){.pools = w->pools,
                         .n_pools = 1,
                         .running = w->running,
                         .n_running = w->n_running,
                         .queue = w->queue,
                         .n_queue = w->n_queue,
                         .tenant_starts = w->starts,
                         .n_tenants = 4,
                         .now_ms = NOW,
                         .preempt = preempt};
  assert_int_equal(sched_plan(w->planner, &w->pass), 0);
}

/* Moves the jobs the pass started to running, as the scheduler does. */
static void start_placed(world *w) {
  int kept = 0;
  for (int i = 0; i < w->n_queue; i++) {
    sched_job_req *q = &w->queue[i];
    if (q->wait == SCHED_START) {
      running(w, q->priority, q->devices,
              q->max_runtime_ms ? NOW + q->max_runtime_ms : SCHED_NO_END);
    } else {
      w->queue[kept++] = *q;
    }
  }
  w->n_queue = kept;
}

static void done(world *w) {
  sched_planner_free(w->planner);
}

static void higher_priority_starts_first_and_fifo_within_a_priority(void **state) {
  (void)state;
  world w;
  init(&w, 1);
  int high = queue(&w, 90, 1, 0);
  int mid_old = queue(&w, 50, 1, 0);
  int mid_new = queue(&w, 50, 1, 0);
  plan(&w, 0);
  assert_int_equal(w.queue[high].wait, SCHED_START);
  assert_int_equal(w.queue[mid_old].wait, SCHED_WAITING_FOR_DEVICES);
  assert_int_equal(w.queue[mid_new].wait, SCHED_BEHIND_EARLIER_JOB);
  assert_int_equal(w.queue[mid_new].blocker, mid_old);
  assert_int_equal(w.pass.n_started, 1);
  done(&w);
}

static void a_gang_gets_all_its_devices_or_none(void **state) {
  (void)state;
  world w;
  init(&w, 4);
  running(&w, 50, 2, SCHED_NO_END); /* 2 of 4 free */
  int gang = queue(&w, 50, 3, 0);
  plan(&w, 0);
  assert_int_equal(w.queue[gang].wait, SCHED_WAITING_FOR_DEVICES);
  assert_int_equal(w.pass.n_started, 0);
  assert_int_equal(w.pass.free_devices[0], 2); /* nothing taken in part */
  /* With exactly enough it takes them all at once. */
  w.n_running = 0;
  running(&w, 50, 1, SCHED_NO_END);
  plan(&w, 0);
  assert_int_equal(w.queue[gang].wait, SCHED_START);
  assert_int_equal(w.pass.free_devices[0], 0);
  done(&w);
}

static void a_job_larger_than_its_pool_never_fits_and_blocks_no_one(void **state) {
  (void)state;
  world w;
  init(&w, 2);
  int huge = queue(&w, 90, 3, 0);
  int lost = queue(&w, 90, 1, 0);
  w.queue[lost].pool = -1; /* a pool that does not exist */
  int small = queue(&w, 10, 2, 0);
  plan(&w, 0);
  assert_int_equal(w.queue[huge].wait, SCHED_NEVER_FITS);
  assert_int_equal(w.queue[lost].wait, SCHED_NEVER_FITS);
  assert_int_equal(w.queue[small].wait, SCHED_START);
  assert_string_equal(sched_wait_name(SCHED_NEVER_FITS), "NEVER_FITS");
  done(&w);
}

static void backfill_uses_only_what_cannot_delay_the_reserved_job(void **state) {
  (void)state;
  world w;
  init(&w, 4);
  running(&w, 50, 2, NOW + 100 * SECOND); /* frees 2 devices by +100 s at the latest */
  int big = queue(&w, 90, 4, 0);
  int short_one = queue(&w, 10, 1, 60 * SECOND); /* ends by +60 s: before the big job's start */
  int long_one = queue(&w, 10, 1, 500 * SECOND); /* would still hold a device at +100 s */
  int unbounded = queue(&w, 10, 1, 0);           /* no max_runtime: might never end */
  plan(&w, 0);
  assert_int_equal(w.queue[big].wait, SCHED_WAITING_FOR_DEVICES);
  assert_true(w.queue[big].start_by_ms == NOW + 100 * SECOND);
  assert_int_equal(w.queue[short_one].wait, SCHED_START);
  assert_int_equal(w.queue[long_one].wait, SCHED_BEHIND_HIGHER_PRIORITY);
  assert_int_equal(w.queue[long_one].blocker, big);
  assert_int_equal(w.queue[unbounded].wait, SCHED_BEHIND_HIGHER_PRIORITY);
  done(&w);
}

static void backfill_may_use_devices_the_reserved_job_leaves_spare(void **state) {
  (void)state;
  world w;
  init(&w, 4);
  running(&w, 50, 3, NOW + 100 * SECOND);
  int big = queue(&w, 90, 2, 0); /* 1 free now; at +100 s 4 free: 2 spare */
  int forever = queue(&w, 10, 1, 0);
  plan(&w, 0);
  assert_int_equal(w.queue[big].wait, SCHED_WAITING_FOR_DEVICES);
  assert_int_equal(w.queue[forever].wait, SCHED_START);
  done(&w);
}

static void without_max_runtime_nothing_passes_a_reserved_job(void **state) {
  (void)state;
  world w;
  init(&w, 2);
  running(&w, 50, 1, SCHED_NO_END); /* when its device comes back is unknown */
  int big = queue(&w, 90, 2, 0);
  int small = queue(&w, 10, 1, 10 * SECOND);
  plan(&w, 0);
  assert_int_equal(w.queue[big].wait, SCHED_WAITING_FOR_DEVICES);
  assert_true(w.queue[big].start_by_ms == SCHED_NO_END);
  assert_int_equal(w.queue[small].wait, SCHED_BEHIND_HIGHER_PRIORITY);
  done(&w);
}

/* A stream of small short jobs keeps arriving; each pass starts what it
 * may and time moves on as running jobs reach their max_runtime. The big
 * job starts by the time its first reservation promised. */
static void a_stream_of_small_jobs_never_starves_a_big_one(void **state) {
  (void)state;
  world w;
  init(&w, 4);
  running(&w, 50, 3, NOW + 50 * SECOND);
  int big = queue(&w, 90, 4, 0);
  plan(&w, 0);
  int64_t promised = w.queue[big].start_by_ms;
  assert_true(promised == NOW + 50 * SECOND);
  int64_t clock = NOW;
  int big_started = 0, small_started = 0;
  for (int round = 0; round < 40 && !big_started; round++) {
    for (int k = 0; k < 3; k++) queue(&w, 10, 1, 30 * SECOND); /* new arrivals */
    plan(&w, 0);
    for (int i = 0; i < w.n_queue; i++) {
      if (w.queue[i].wait != SCHED_START) continue;
      if (w.queue[i].priority == 90)
        big_started = 1;
      else
        small_started++;
    }
    start_placed(&w);
    /* Ten seconds pass: jobs due by then end. */
    clock += 10 * SECOND;
    int kept = 0;
    for (int i = 0; i < w.n_running; i++) {
      w.running[i].end_by_ms -= 10 * SECOND;
      if (w.running[i].end_by_ms > NOW) w.running[kept++] = w.running[i];
    }
    w.n_running = kept;
  }
  assert_true(big_started);
  assert_true(clock - 10 * SECOND <= promised); /* started no later than promised */
  assert_true(small_started >= 1);              /* and small jobs did use the gap */
  done(&w);
}

static void preemption_stops_the_fewest_lowest_priority_jobs(void **state) {
  (void)state;
  world w;
  init(&w, 4);
  int low = running(&w, 10, 1, SCHED_NO_END);
  int mid = running(&w, 40, 2, SCHED_NO_END);
  int low2 = running(&w, 10, 1, SCHED_NO_END);
  int urgent = queue(&w, 90, 2, 0);
  plan(&w, 1);
  assert_int_equal(w.queue[urgent].wait, SCHED_WAITING_FOR_PREEMPTION);
  assert_int_equal(w.running[low].preempt_for, urgent);
  assert_int_equal(w.running[low2].preempt_for, urgent);
  assert_int_equal(w.running[mid].preempt_for, -1);
  assert_int_equal(w.pass.n_preempted, 2);
  /* The next pass waits for them instead of stopping more. */
  plan(&w, 1);
  assert_int_equal(w.pass.n_preempted, 0);
  assert_int_equal(w.queue[urgent].wait, SCHED_WAITING_FOR_PREEMPTION);
  done(&w);
}

static void preemption_stops_nothing_when_it_cannot_make_room(void **state) {
  (void)state;
  world w;
  init(&w, 2);
  int peer = running(&w, 90, 1, SCHED_NO_END);
  int low = running(&w, 10, 1, SCHED_NO_END);
  int big = queue(&w, 50, 2, 0); /* would need the priority-90 job's device too */
  plan(&w, 1);
  assert_int_equal(w.queue[big].wait, SCHED_WAITING_FOR_DEVICES);
  assert_int_equal(w.running[peer].preempt_for, -1);
  assert_int_equal(w.running[low].preempt_for, -1);
  done(&w);
}

static void fair_share_lets_a_quiet_tenant_go_before_a_busy_ones_backlog(void **state) {
  (void)state;
  world w;
  init(&w, 1);
  w.starts[0] = 5; /* tenant 0 started 5 jobs lately, tenant 1 none */
  int a1 = queue(&w, 50, 1, 0);
  queue(&w, 50, 1, 0);
  int b1 = queue(&w, 50, 1, 0);
  w.queue[b1].tenant = 1;
  plan(&w, 0);
  assert_int_equal(w.queue[b1].wait, SCHED_START);
  assert_int_equal(w.queue[a1].wait, SCHED_WAITING_FOR_DEVICES);
  done(&w);
}

static void backoff_waits_without_holding_a_reservation(void **state) {
  (void)state;
  world w;
  init(&w, 1);
  int retrying = queue(&w, 90, 1, 0);
  w.queue[retrying].not_before_ms = NOW + 5 * SECOND;
  int other = queue(&w, 10, 1, 0);
  plan(&w, 0);
  assert_int_equal(w.queue[retrying].wait, SCHED_RETRY_BACKOFF);
  assert_int_equal(w.queue[other].wait, SCHED_START);
  done(&w);
}

/* An agents pool of hosts with these many devices each, free as given. */
static void init_hosts(world *w, int n_hosts, const int *total, const int *free_now) {
  init(w, 0);
  w->pools[0].kind = SCHED_POOL_AGENTS;
  w->pools[0].n_hosts = n_hosts;
  for (int h = 0; h < n_hosts; h++) {
    w->pools[0].host_total[h] = total[h];
    w->pools[0].host_free[h] = free_now[h];
    w->pools[0].n_devices += total[h];
  }
}

static void agents_pool_places_on_one_host_or_gangs_only_spread_jobs(void **state) {
  (void)state;
  world w;
  const int total[] = {2, 2, 2}, free_now[] = {1, 2, 2};
  init_hosts(&w, 3, total, free_now);
  int three_alone = queue(&w, 50, 3, 0); /* one process: needs one host of 3 */
  int two = queue(&w, 40, 2, 0);
  plan(&w, 0);
  assert_int_equal(w.queue[three_alone].wait, SCHED_WAITING_FOR_HOSTS);
  assert_int_equal(w.queue[two].wait, SCHED_START); /* a host of 2 free: no reservation held */
  done(&w);

  init_hosts(&w, 3, total, free_now);
  int gang = queue(&w, 50, 4, 0);
  w.queue[gang].spread = 1;
  int one = queue(&w, 40, 1, 0);
  plan(&w, 0);
  assert_int_equal(w.queue[gang].wait, SCHED_START); /* 2 + 2 over two hosts */
  assert_int_equal(w.queue[one].wait, SCHED_START);  /* host 0's free core */
  assert_int_equal(w.pass.free_devices[0], 0);
  done(&w);

  init_hosts(&w, 3, total, free_now);
  gang = queue(&w, 50, 6, 0);
  w.queue[gang].spread = 1;
  one = queue(&w, 40, 1, 0);
  plan(&w, 0);
  /* All or none: 5 free of 6 holds the reservation; without max_runtime nothing passes it. */
  assert_int_equal(w.queue[gang].wait, SCHED_WAITING_FOR_DEVICES);
  assert_int_equal(w.queue[one].wait, SCHED_BEHIND_HIGHER_PRIORITY);
  gang = queue(&w, 30, 7, 0);
  w.queue[gang].spread = 1;
  plan(&w, 0);
  assert_int_equal(w.queue[gang].wait, SCHED_WAITING_FOR_HOSTS); /* more than every host has */
  done(&w);

  int take[3];
  assert_int_equal(sched_hosts_pick(3, free_now, 1, 0, take), 1);
  assert_int_equal(take[0], 1); /* the host it fills best */
  assert_int_equal(sched_hosts_pick(3, free_now, 3, 0, take), 0);
  assert_int_equal(sched_hosts_pick(3, free_now, 5, 1, take), 3);
  assert_int_equal(take[0] + take[1] + take[2], 5);
  assert_int_equal(take[1], 2);
  assert_int_equal(sched_hosts_pick(3, free_now, 6, 1, take), 0);
  assert_int_equal(take[0] + take[1] + take[2], 0);
}

static void pools_file_is_read_and_each_mistake_named_by_field(void **state) {
  (void)state;
  sched_inventory inv = {.cpus = 4, .gpus = 1};
  sched_pool pools[SCHED_MAX_POOLS];
  char err[300];
  int n = sched_pools_parse("{\"pools\":[{\"name\":\"train\",\"devices\":[0,1,2]},"
                            "{\"name\":\"gpu\",\"device_type\":\"gpu\",\"devices\":1},"
                            "{\"name\":\"rest\",\"devices\":1}]}",
                            &inv, pools, SCHED_MAX_POOLS, err, sizeof err);
  if (n != 3) fail_msg("%s", err);
  assert_string_equal(pools[0].name, "train");
  assert_int_equal(pools[0].n_devices, 3);
  assert_string_equal(pools[1].device_type, "gpu");
  assert_int_equal(pools[2].devices[0], 3); /* the first core no pool took */
  static const struct {
    const char *text, *words;
  } bad[] = {
      {"[]", "{\"pools\": [...]}"},
      {"{\"pools\":[]}", "1 to 16 pools"},
      {"{\"pools\":[{\"devices\":[0]}]}", "pools[0].name"},
      {"{\"pools\":[{\"name\":\"a b\",\"devices\":[0]}]}", "pools[0].name"},
      {"{\"pools\":[{\"name\":\"a\",\"device_type\":\"tpu\",\"devices\":[0]}]}",
       "pools[0].device_type"},
      {"{\"pools\":[{\"name\":\"a\",\"devices\":[4]}]}",
       "pools[0].devices[0]: must be a cpu index"},
      {"{\"pools\":[{\"name\":\"a\",\"devices\":[0]},{\"name\":\"b\",\"devices\":[1,0]}]}",
       "pools[1].devices[1]: cpu 0 is already in another pool"},
      {"{\"pools\":[{\"name\":\"a\",\"devices\":[0]},{\"name\":\"a\",\"devices\":[1]}]}",
       "pools[1].name: \"a\" is already"},
      {"{\"pools\":[{\"name\":\"a\",\"devices\":5}]}", "pools[0].devices: asks for 5"},
      {"{\"pools\":[{\"name\":\"a\",\"devices\":[0],\"gpus\":1}]}", "pools[0].gpus: unknown field"},
      {"{\"pools\":", "not JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    assert_int_equal(sched_pools_parse(bad[i].text, &inv, pools, SCHED_MAX_POOLS, err, sizeof err),
                     -1);
    if (!strstr(err, bad[i].words)) fail_msg("%s: got '%s'", bad[i].text, err);
  }
  assert_int_equal(sched_pools_default(&inv, pools, SCHED_MAX_POOLS), 2);
  assert_int_equal(pools[0].n_devices, 4);
  assert_string_equal(pools[1].name, "gpu");
}

static void pools_of_agents_and_slurm_are_read_and_checked_by_pool_and_field(void **state) {
  (void)state;
  sched_inventory inv = {.cpus = 4};
  sched_pool pools[SCHED_MAX_POOLS];
  char err[400];
  int n = sched_pools_parse(
      "{\"pools\":[{\"name\":\"default\",\"devices\":2},"
      "{\"name\":\"hosts\",\"kind\":\"agents\",\"grace_s\":5,"
      "\"network\":{\"oob_tcp_if_include\":\"10.77.0.0/24\",\"nccl_socket_ifname\":\"veth\"},"
      "\"shared_data\":null},"
      "{\"name\":\"cluster\",\"kind\":\"slurm\",\"partition\":\"debug\",\"nodes\":2,"
      "\"cpus_per_node\":3,\"kilnd_url\":\"http://127.0.0.1:8080\"}]}",
      &inv, pools, SCHED_MAX_POOLS, err, sizeof err);
  if (n != 3) fail_msg("%s", err);
  assert_int_equal(pools[0].kind, SCHED_POOL_LOCAL);
  assert_int_equal(pools[0].n_devices, 2);
  assert_int_equal(pools[1].kind, SCHED_POOL_AGENTS);
  assert_string_equal(sched_pool_kind_name(pools[1].kind), "agents");
  assert_int_equal(pools[1].n_devices, 0); /* until agents come online */
  assert_int_equal(pools[1].grace_s, 5);
  assert_int_equal(pools[1].start_timeout_s, 60);
  assert_string_equal(pools[1].oob_tcp_if_include, "10.77.0.0/24");
  assert_string_equal(pools[1].btl_tcp_if_include, "");
  assert_string_equal(pools[1].nccl_socket_ifname, "veth");
  assert_string_equal(pools[1].shared_data, "");
  assert_int_equal(pools[2].kind, SCHED_POOL_SLURM);
  assert_string_equal(pools[2].partition, "debug");
  assert_int_equal(pools[2].n_devices, 6);
  assert_string_equal(pools[2].kilnd_url, "http://127.0.0.1:8080");
  static const struct {
    const char *text, *words;
  } bad[] = {
      {"{\"pools\":[{\"name\":\"h\",\"kind\":\"cloud\"}]}", "pools[0].kind: pool 'h'"},
      {"{\"pools\":[{\"name\":\"h\",\"kind\":\"agents\",\"devices\":[0]}]}",
       "pools[0].devices: unknown field for a agents pool"},
      {"{\"pools\":[{\"name\":\"h\",\"kind\":\"agents\",\"grace_s\":0}]}",
       "pool 'h': grace_s must be a whole number from 1 to 3600"},
      {"{\"pools\":[{\"name\":\"h\",\"kind\":\"agents\",\"start_timeout_s\":\"9\"}]}",
       "pool 'h': start_timeout_s"},
      {"{\"pools\":[{\"name\":\"h\",\"kind\":\"agents\",\"network\":{\"eth\":\"x\"}}]}",
       "pool 'h': network.eth: unknown field"},
      {"{\"pools\":[{\"name\":\"h\",\"kind\":\"agents\",\"network\":{\"btl_tcp_if_include\":1}}]}",
       "pool 'h': network.btl_tcp_if_include must be a string"},
      {"{\"pools\":[{\"name\":\"h\",\"kind\":\"agents\",\"shared_data\":\"rel/dir\"}]}",
       "pool 'h': shared_data must be null or an absolute path"},
      {"{\"pools\":[{\"name\":\"c\",\"kind\":\"slurm\",\"nodes\":1,\"cpus_per_node\":1,"
       "\"kilnd_url\":\"http://x\"}]}",
       "pool 'c': partition must be a string of 1 to 63 characters (required"},
      {"{\"pools\":[{\"name\":\"c\",\"kind\":\"slurm\",\"partition\":\"p\",\"nodes\":1,"
       "\"cpus_per_node\":1,\"kilnd_url\":\"ftp://x\"}]}",
       "pool 'c': kilnd_url must start with http://"},
      {"{\"pools\":[{\"name\":\"c\",\"kind\":\"slurm\",\"partition\":\"p\",\"nodes\":1,"
       "\"kilnd_url\":\"http://x\"}]}",
       "pool 'c': cpus_per_node is required"},
      {"{\"pools\":[{\"name\":\"c\",\"kind\":\"slurm\",\"partition\":\"p\",\"nodes\":0,"
       "\"cpus_per_node\":1,\"kilnd_url\":\"http://x\"}]}",
       "pool 'c': nodes must be a whole number from 1"},
      {"{\"pools\":[{\"name\":\"c\",\"kind\":\"slurm\",\"grace_s\":3}]}",
       "pools[0].grace_s: unknown field for a slurm pool"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    assert_int_equal(sched_pools_parse(bad[i].text, &inv, pools, SCHED_MAX_POOLS, err, sizeof err),
                     -1);
    if (!strstr(err, bad[i].words)) fail_msg("%s: got '%s'", bad[i].text, err);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(higher_priority_starts_first_and_fifo_within_a_priority),
      cmocka_unit_test(a_gang_gets_all_its_devices_or_none),
      cmocka_unit_test(a_job_larger_than_its_pool_never_fits_and_blocks_no_one),
      cmocka_unit_test(backfill_uses_only_what_cannot_delay_the_reserved_job),
      cmocka_unit_test(backfill_may_use_devices_the_reserved_job_leaves_spare),
      cmocka_unit_test(without_max_runtime_nothing_passes_a_reserved_job),
      cmocka_unit_test(a_stream_of_small_jobs_never_starves_a_big_one),
      cmocka_unit_test(preemption_stops_the_fewest_lowest_priority_jobs),
      cmocka_unit_test(preemption_stops_nothing_when_it_cannot_make_room),
      cmocka_unit_test(fair_share_lets_a_quiet_tenant_go_before_a_busy_ones_backlog),
      cmocka_unit_test(backoff_waits_without_holding_a_reservation),
      cmocka_unit_test(agents_pool_places_on_one_host_or_gangs_only_spread_jobs),
      cmocka_unit_test(pools_file_is_read_and_each_mistake_named_by_field),
      cmocka_unit_test(pools_of_agents_and_slurm_are_read_and_checked_by_pool_and_field),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
