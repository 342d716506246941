// client_test.ts — drives a real kilnd through the client @hey-api/openapi-ts
// generated from its /v1/openapi.json (test_openapi_tools.c generates it
// into ./client, compiles this file with tsc --strict, and runs it):
// a typed 400 for a bad spec, then a small job created, waited for and its
// metrics read, every value through the generated types.
// Usage: node client_test.js BASE_URL TOKEN
import { createClient, createConfig } from './client/client';
import {
  cancelJob,
  createJob,
  getJob,
  listEvents,
  listJobs,
  listMetrics,
  waitJob,
} from './client/sdk.gen';
import type { Error as ApiError, Job, JobSpec, MetricPoint } from './client/types.gen';

const [baseUrl, token] = process.argv.slice(2);
if (!baseUrl || !token) throw new Error('usage: node client_test.js BASE_URL TOKEN');
const client = createClient(createConfig({ baseUrl, auth: token }));

function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`failed: ${what}`);
  console.log(`ok: ${what}`);
}

// A tiny MLP on the built-in Fashion-MNIST: 640 examples, 20 steps.
const spec: JobSpec = {
  display_name: 'openapi-client',
  model: {
    input_shape: [28, 28, 1],
    layers: [{ type: 'flatten' }, { type: 'dense', units: 16, activation: 'relu' }, { type: 'dense', units: 10, activation: 'softmax' }],
  },
  loss: 'sparse_categorical_crossentropy',
  metrics: ['accuracy'],
  dataset: { name: 'fashion-mnist', validation: 'none' },
  pipeline: { batch_size: 32, take: 640, normalize: true },
  optimizer: { type: 'adam', learning_rate: 0.01 },
  epochs: 1,
  log_every_steps: 5,
  seed: 7,
};

async function main(): Promise<void> {
  // A typed error: epochs 0 is refused with the Error schema's fields.
  const bad = await createJob({ client, body: { ...spec, epochs: 0 } });
  check(bad.response.status === 400, `a bad spec is answered 400 (got ${bad.response.status})`);
  const err: ApiError | undefined = bad.error;
  check(err !== undefined && err.error.code === 400, 'error.code is 400');
  check(err!.error.status === 'INVALID_ARGUMENT', `error.status is INVALID_ARGUMENT (${err!.error.status})`);
  check(err!.error.details.some((d) => d.field === 'epochs'), 'a detail names the field epochs');
  check(err!.error.message.length > 0, `error.message says why: ${err!.error.message}`);

  // No token: 401 in the same model.
  const anonymous = createClient(createConfig({ baseUrl }));
  const denied = await getJob({ client: anonymous, path: { job: 'nope' } });
  check(denied.response.status === 401 && denied.error?.error.status === 'UNAUTHENTICATED', 'no token is 401 UNAUTHENTICATED');

  // validate_only creates nothing.
  const dry = await createJob({ client, body: spec, query: { validate_only: true } });
  check(dry.data !== undefined && dry.data.id === undefined && dry.data.name === undefined && dry.data.state === 'QUEUED', 'validate_only answers the job without an id or name');

  const created = await createJob({ client, body: spec, query: { request_id: `openapi-${Date.now()}` } });
  check(created.response.status === 200 && created.data !== undefined, 'createJob answers 200 with a Job');
  const job: Job = created.data!;
  // Every created job has an id (only a validate_only answer lacks one).
  const id: string = job.id ?? '';
  check(/^[0-9]{8}-[0-9a-f]{16}$/.test(id) && job.name === `jobs/${id}`, `the job has an id and name (${job.name})`);
  check(job.state === 'QUEUED' && job.reason === 'CREATED', 'a new job is QUEUED (CREATED)');
  check(job.spec.epochs === 1 && job.spec.display_name === 'openapi-client', 'the job carries its spec');

  const waited = await waitJob({ client, path: { job: id }, query: { timeout: '300s' } });
  check(waited.data !== undefined && waited.data.done === true, 'waitJob returns once the job is done');
  check(waited.data!.state === 'SUCCEEDED', `the job SUCCEEDED (${waited.data!.state}: ${waited.data!.message})`);
  check(typeof waited.data!.latest_metrics?.loss === 'number', `latest_metrics has a loss (${waited.data!.latest_metrics?.loss})`);

  const metrics = await listMetrics({ client, path: { job: id }, query: { name: 'loss' } });
  check(metrics.data !== undefined, 'listMetrics answers');
  const points: MetricPoint[] = metrics.data!.metrics;
  check(points.length >= 4, `loss was logged every 5 of 20 steps (${points.length} points)`);
  check(points.every((p) => p.name === 'loss' && p.attempt === 1 && Number.isFinite(p.value)), 'each point is a finite loss of attempt 1');
  check(points.every((p, i) => i === 0 || p.step > points[i - 1].step), 'points come in step order');
  check(points[points.length - 1].step === 20, `the last point is at step 20 (${points[points.length - 1].step})`);

  const events = await listEvents({ client, path: { job: id } });
  const states = events.data!.events.map((e) => e.to_state);
  check(states[0] === 'QUEUED' && states[states.length - 1] === 'SUCCEEDED', `events go QUEUED .. SUCCEEDED (${states.join(' ')})`);

  const list = await listJobs({ client, query: { filter: 'state=SUCCEEDED', page_size: 10 } });
  check(list.data!.jobs.some((j) => j.id === id) && typeof list.data!.next_page_token === 'string', 'listJobs finds it by state');
  const badFilter = await listJobs({ client, query: { filter: 'colour=red' } });
  check(badFilter.response.status === 400 && badFilter.error?.error.details[0].field === 'filter', 'a bad filter is a 400 naming filter');

  // Cancelling an ended job: a typed 409.
  const late = await cancelJob({ client, path: { job: id } });
  check(late.response.status === 409 && late.error?.error.status === 'FAILED_PRECONDITION', 'cancelling an ended job is 409 FAILED_PRECONDITION');
  const missing = await getJob({ client, path: { job: '20990101-0000000000000000' } });
  check(missing.response.status === 404 && missing.error?.error.details[0].field === 'job', 'an unknown job is 404 naming job');
}

main().then(
  () => console.log('client_test: all checks passed'),
  (e: unknown) => {
    console.error(e);
    process.exit(1);
  },
);
