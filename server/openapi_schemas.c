/* openapi_schemas.c — the schemas of openapi.json (components.schemas): the
 * resources the handlers write, field by field, the job spec api/spec.c
 * reads, and the error model of api/error.c. Each is JSON written with
 * single quotes (the text has no apostrophes), turned into jansson values
 * by http_openapi_json. test_server_openapi checks them against what the
 * handlers and api_error_to_json actually write. */
#include <stdio.h>
#include <string.h>

#include "openapi.h"

/* 'date-time or null': http_rfc3339 writes null for a time not yet reached. */
#define TIME(what) "{'type':'string','format':'date-time','nullable':true,'description':'" what "'}"
#define METRIC_MAP(what)                                                                           \
  "{'type':'object','additionalProperties':{'type':'number'},'description':'" what "'}"
#define LIST_OF(item, key, what)                                                                   \
  "{'type':'object','description':'" what "','required':['" key "'],'properties':{'" key           \
  "':{'type':'array','items':{'$ref':'#/components/schemas/" item "'}}}}"
#define PAGE_OF(item, key, what)                                                                   \
  "{'type':'object','description':'" what "','required':['" key "','next_page_token'],"            \
  "'properties':{'" key "':{'type':'array','items':{'$ref':'#/components/schemas/" item "'}},"     \
  "'next_page_token':{'type':'string','description':'Pass as page_token for the next page; "       \
  "empty on the last page.'}}}"

/* Not reflowed: clang-format splits the literals around TIME() apart. */
// clang-format off
static const http_openapi_text schemas[] = {
    /* ---- the error model (api/error.c, AIP-193) ---- */
    {"Error",
     "{'type':'object','description':'Every 4xx and 5xx answer (AIP-193).','required':['error'],"
     "'properties':{'error':{'$ref':'#/components/schemas/Status'}}}"},
    {"Status",
     "{'type':'object','required':['code','status','message','details'],'properties':{"
     "'code':{'type':'integer','description':'The HTTP status code.','example':400},"
     "'status':{'type':'string','description':'The canonical code: INVALID_ARGUMENT, "
     "UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, "
     "RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL or UNAVAILABLE.','example':'INVALID_ARGUMENT'},"
     "'message':{'type':'string','description':'What went wrong, for a person.'},"
     "'details':{'type':'array','description':'One entry per field at fault; may be empty.',"
     "'items':{'$ref':'#/components/schemas/FieldViolation'}}}}"},
    {"FieldViolation",
     "{'type':'object','required':['field','description'],'properties':{"
     "'field':{'type':'string','description':'The path of the field, parameter or header at "
     "fault.','example':'model.layers[2].units'},"
     "'description':{'type':'string','description':'The rule it broke.'}}}"},

    /* ---- jobs (handlers.c, job_actions.c) ---- */
    {"Job",
     "{'type':'object','description':'A training job.','required':['display_name',"
     "'state','reason','message','priority','attempt','spec'],'properties':{"
     "'name':{'type':'string','description':'jobs/{id}; absent in a validate_only answer, "
     "which names no job.','example':'jobs/20260101-0123456789abcdef'},"
     "'id':{'type':'string','description':'Absent in a validate_only answer.'},"
     "'display_name':{'type':'string'},"
     "'state':{'$ref':'#/components/schemas/JobState'},"
     "'reason':{'type':'string','description':'The reason code of the last state change (CREATED, "
     "CANCELLED, NUMERIC_ERROR, ...).'},"
     "'message':{'type':'string','description':'The last state change, for a person.'},"
     "'priority':{'type':'integer','minimum':0,'maximum':100},"
     "'attempt':{'type':'integer','description':'How many times the job has started.'},"
     "'restarts':{'type':'integer','description':'Re-queues after a failure of its own (a "
     "crash, a hung trainer): what max_restarts bounds.'},"
     "'infra_restarts':{'type':'integer','description':'Re-queues the infrastructure caused (a "
     "kilnd restart, a preemption); they never count against max_restarts.'},"
     "'planned_memory_bytes':{'type':'integer','format':'int64','description':'The memory its "
     "training plans (parameters, gradients, optimizer state, activations), as the planner of "
     "the engine figured it at create; 0 when not planned.'},"
     "'request_id':{'type':'string','description':'The request_id it was created with.'},"
     "'tenant':{'type':'string','description':'The tenant that owns it.'},"
     "'create_time':" TIME("When it was created.") ","
     "'start_time':" TIME("When its last attempt started.") ","
     "'end_time':" TIME("When it ended.") ","
     "'latest_metrics':" METRIC_MAP("The newest value of each metric (get and :wait only).") ","
     "'run_seconds':{'type':'number','description':'Seconds spent training (RUNNING and "
     "STOPPING), summed over every attempt; a span still going counts up to now.'},"
     "'queue_seconds':{'type':'number','description':'Seconds spent QUEUED, over every "
     "attempt.'},"
     "'progress':{'$ref':'#/components/schemas/JobProgress'},"
     "'experiment':{'type':'string','description':'The experiment this job is a trial of; "
     "absent for other jobs.'},"
     "'trial':{'type':'object','description':'Its trial: index, values and trial_state; only "
     "on a trial job.','properties':{'index':{'type':'integer'},'values':{'type':'object',"
     "'additionalProperties':true},'trial_state':{'type':'string'}}},"
     "'spec':{'$ref':'#/components/schemas/JobSpec'}}}"},
    {"JobProgress",
     "{'type':'object','description':'Where training stands, counted in steps.','required':["
     "'step','epoch','epochs'],'properties':{"
     "'step':{'type':'integer','format':'int64','description':'The newest step reported (0 "
     "before the first).'},"
     "'epoch':{'type':'integer','description':'The epoch of that step, from 1.'},"
     "'epochs':{'type':'integer','description':'The epochs planned.'},"
     "'total_steps':{'type':'integer','format':'int64','description':'Steps per epoch x "
     "epochs, from the plan the trainer reports; absent until then.'},"
     "'fraction':{'type':'number','minimum':0,'maximum':1,'description':'step / total_steps "
     "(1 once the job succeeded); absent while total_steps is.'}}}"},
    {"JobWaitResult",
     "{'description':'The job when :wait returns.','allOf':[{'$ref':'#/components/schemas/Job'},"
     "{'type':'object','required':['done'],'properties':{'done':{'type':'boolean',"
     "'description':'true when the job ended; false when the timeout passed first.'}}}]}"},
    {"JobList", PAGE_OF("Job", "jobs", "A page of jobs, newest first unless order_by says.")},
    {"JobExplanation",
     "{'type':'object','required':['name','state','reasons'],'properties':{"
     "'name':{'type':'string'},'state':{'$ref':'#/components/schemas/JobState'},"
     "'experiment':{'type':'string','description':'The experiment of a trial job.'},"
     "'reasons':{'type':'array','items':{'type':'object','required':['code','message'],"
     "'properties':{'code':{'type':'string','description':'JOBS_AHEAD, "
     "WAITING_FOR_DEVICES, WAITING_FOR_PREEMPTION, BEHIND_HIGHER_PRIORITY, BEHIND_EARLIER_JOB, "
     "RETRY_BACKOFF, NEVER_FITS, NOT_YET_PLACED or EXPERIMENT_TRIAL while queued; ACTIVE or ENDED "
     "after.'},'message':{'type':'string'}}}}}}"},
    {"MetricPoint",
     "{'type':'object','required':['seq','attempt','step','epoch','name','time'],'properties':{"
     "'seq':{'type':'integer','format':'int64','description':'The point sequence number, the "
     "id of its metrics:watch event.'},"
     "'attempt':{'type':'integer'},'step':{'type':'integer','format':'int64'},"
     "'epoch':{'type':'integer'},'name':{'type':'string','example':'loss'},"
     "'value':{'type':'number','description':'Absent when the value is not finite.'},"
     "'time':" TIME("When kilnd stored it.") "}}"},
    {"MetricList", LIST_OF("MetricPoint", "metrics", "Metric points in step order.")},
    {"Event",
     "{'type':'object','required':['time','from_state','to_state','reason','message'],"
     "'properties':{'time':" TIME("When the state changed.") ","
     "'from_state':{'type':'string','description':'Empty for the creation.'},"
     "'to_state':{'$ref':'#/components/schemas/JobState'},"
     "'reason':{'type':'string'},'message':{'type':'string'}}}"},
    {"EventList", LIST_OF("Event", "events",
                          "State changes and notes (TRAINING, PIPELINE_TUNED: from_state = "
                          "to_state), oldest first.")},
    {"Checkpoint",
     "{'type':'object','required':['name','id','attempt','step','bytes','sha256','format',"
     "'pinned','best','create_time','metrics'],'properties':{"
     "'name':{'type':'string','example':'jobs/20260101-0123456789abcdef/checkpoints/3'},"
     "'id':{'type':'integer','format':'int64'},'attempt':{'type':'integer'},"
     "'step':{'type':'integer','format':'int64'},"
     "'bytes':{'type':'integer','format':'int64'},'sha256':{'type':'string'},"
     "'format':{'type':'string','enum':['safetensors']},"
     "'pinned':{'type':'boolean','description':'Retention never removes a pinned checkpoint.'},"
     "'best':{'type':'boolean','description':'true on the one checkpoint that ranks best by the "
     "job checkpoint metric (checkpoint.monitor with keep_best, else val_loss, else loss).'},"
     "'create_time':" TIME("When it was written.") ","
     "'metrics':" METRIC_MAP("The newest value of each metric when it was written.") "}}"},
    {"CheckpointList",
     "{'type':'object','description':'The checkpoints of a job, oldest first.','required':["
     "'checkpoints'],'properties':{'checkpoints':{'type':'array','items':{'$ref':"
     "'#/components/schemas/Checkpoint'}},"
     "'best_metric':{'type':'string','description':'The metric best was decided by; absent "
     "when no checkpoint carries it.','example':'val_loss'},"
     "'best_mode':{'type':'string','enum':['min','max']}}}"},

    /* ---- data sets (datasets.c) ---- */
    {"Dataset",
     "{'type':'object','description':'A built-in or uploaded data set.','required':['name','id',"
     "'builtin','format','ready','train_examples','test_examples','classes','input_shape'],"
     "'properties':{'name':{'type':'string','example':'datasets/fashion-mnist'},"
     "'id':{'type':'string','description':'What a job spec names as dataset.name.'},"
     "'builtin':{'type':'boolean'},'format':{'type':'string','enum':['csv','idx','images',"
     "'tfrecord','tar']},"
     "'ready':{'type':'boolean','description':'false when a built-in data set is not installed.'},"
     "'train_examples':{'type':'integer','format':'int64'},"
     "'test_examples':{'type':'integer','format':'int64'},'classes':{'type':'integer'},"
     "'input_shape':{'type':'array','items':{'type':'integer'}},"
     "'display_name':{'type':'string','description':'Uploads only.'},"
     "'label_column':{'type':'string','description':'csv uploads only.'},"
     "'bytes':{'type':'integer','format':'int64','description':'Uploads only.'},"
     "'sha256':{'type':'string','description':'Uploads only.'},"
     "'create_time':" TIME("Uploads only.") ","
     "'source':{'type':'string','description':'A registered folder: its path under the "
     "datasets directory.','example':'shards/fashion'},"
     "'shards':{'type':'object','description':'tfrecord and tar only: what the check found.',"
     "'properties':{'train_files':{'type':'integer'},'test_files':{'type':'integer'},"
     "'image_feature':{'type':'string','description':'The image feature checked; empty when "
     "it was not found (name it in the spec from features).'},"
     "'label_feature':{'type':'string','description':'The label feature checked, or empty.'},"
     "'features':{'type':'array','description':'The first record features (a tar sample "
     "extensions).','items':{'type':'object','required':['name','kind'],'properties':{"
     "'name':{'type':'string'},'kind':{'type':'string','enum':['bytes','float','int64','none',"
     "'file']},'values':{'type':'integer','format':'int64'},"
     "'bytes':{'type':'integer','format':'int64'}}}}}}}}"},
    {"DatasetRegistration",
     "{'type':'object','description':'A folder of shards under the datasets directory of the "
     "server (train/ and optionally test/), made a data set.','required':['path','format'],"
     "'additionalProperties':false,'properties':{"
     "'path':{'type':'string','minLength':1,'maxLength':255,'description':'Relative to the "
     "datasets directory; no . or .. segment, no link leading outside.','example':"
     "'shards/fashion'},"
     "'format':{'type':'string','enum':['tfrecord','tar']},"
     "'display_name':{'type':'string','maxLength':127},"
     "'tenant':{'type':'string','description':'Whose data set it is (default: default).'},"
     "'features':{'type':'object','additionalProperties':false,'properties':{'image':{'type':"
     "'string'},'label':{'type':'string'}}}}}"},
    {"DatasetList",
     PAGE_OF("Dataset", "datasets", "Built-in data sets, then uploads, newest first.")},

    /* ---- devices and pools (observe.c) ---- */
    {"Device",
     "{'type':'object','required':['name','type','index','pool','busy'],'properties':{"
     "'name':{'type':'string','example':'devices/cpu-0'},'type':{'type':'string','enum':['cpu',"
     "'gpu']},'index':{'type':'integer'},'model':{'type':'string','description':'The GPU model.'},"
     "'pool':{'type':'string'},'busy':{'type':'boolean'},"
     "'job':{'type':'string','description':'The job on it, when the caller may see that job.'}}}"},
    {"DeviceList", LIST_OF("Device", "devices", "Every device of every pool.")},
    {"Pool",
     "{'type':'object','required':['name','id','device_type','devices','devices_busy',"
     "'running_jobs','queued_jobs'],'properties':{'name':{'type':'string','example':"
     "'pools/default'},'id':{'type':'string'},'device_type':{'type':'string','enum':['cpu','gpu']},"
     "'devices':{'type':'integer'},'devices_busy':{'type':'integer'},"
     "'running_jobs':{'type':'integer'},'queued_jobs':{'type':'integer'}}}"},
    {"PoolList", LIST_OF("Pool", "pools", "The worker pools.")},
    {"Token",
     "{'type':'object','required':['name','id','tenant','role','create_time'],'properties':{"
     "'name':{'type':'string','example':'tokens/tok-0123456789ab'},"
     "'id':{'type':'string','description':'tok- and 12 hex digits of the SHA-256 of the secret.'},"
     "'tenant':{'type':'string','description':'agents for an agent token.'},"
     "'role':{'type':'string','enum':['admin','user','agent']},"
     "'create_time':" TIME("When it was made.") ","
     "'last_use_time':" TIME("When a request last used it (to a few seconds); absent if "
                            "never.") "}}"},
    {"TokenList", LIST_OF("Token", "tokens", "Unrevoked tokens, oldest first; never a secret.")},
    {"TokenRequest",
     "{'type':'object','additionalProperties':false,'description':'tenant is required, except "
     "for role agent (whose tenant is agents).','properties':{"
     "'tenant':{'type':'string','pattern':'^[a-z0-9_-]{1,63}$'},"
     "'role':{'type':'string','enum':['admin','user','agent'],'default':'user'}}}"},
    {"NewToken",
     "{'allOf':[{'$ref':'#/components/schemas/Token'},{'type':'object','required':['secret'],"
     "'properties':{'secret':{'type':'string','description':'The bearer token, shown this once: "
     "kilnd keeps only its hash.','example':'kiln_0123...'}}}]}"},

    /* ---- agents (server/agents.c) ---- */
    {"Gpu",
     "{'type':'object','required':['index'],'additionalProperties':false,'properties':{"
     "'index':{'type':'integer','minimum':0},'name':{'type':'string','maxLength':127},"
     "'memory_bytes':{'type':'integer','format':'int64','minimum':0}}}"},
    {"Agent",
     "{'type':'object','required':['id','name','hostname','pool','address','cpus','gpus',"
     "'version','state','last_seen_time','create_time'],'properties':{"
     "'id':{'type':'string','example':'agt-0123456789abcdef'},"
     "'name':{'type':'string','description':'Unique: registering the name again is the same "
     "agent.'},'hostname':{'type':'string'},'pool':{'type':'string'},"
     "'address':{'type':'string','description':'Where job traffic reaches the host.'},"
     "'cpus':{'type':'integer','minimum':1},"
     "'gpus':{'type':'array','items':{'$ref':'#/components/schemas/Gpu'}},"
     "'version':{'type':'string'},"
     "'state':{'type':'string','enum':['ONLINE','LOST'],'description':'LOST once nothing came "
     "from it for its pool grace window; it must register again.'},"
     "'last_seen_time':" TIME("Its last registration, poll or report.") ","
     "'create_time':" TIME("Its first registration.") ","
     "'allocations':{'type':'array','description':'The allocations not ended with a host on "
     "it.','items':{'type':'object','required':['id','job','attempt','cores','rank_first',"
     "'ranks'],'properties':{'id':{'type':'string'},'job':{'type':'string'},'attempt':{'type':"
     "'integer'},'cores':{'type':'array','items':{'type':'integer'}},'rank_first':{'type':"
     "'integer'},'ranks':{'type':'integer'}}}}}}"},
    {"AgentList", PAGE_OF("Agent", "agents", "Agents in registration order.")},
    {"AgentRegistration",
     "{'type':'object','required':['name','pool','address','cpus'],'additionalProperties':false,"
     "'properties':{'name':{'type':'string','pattern':'^[A-Za-z0-9._-]{1,63}$'},"
     "'hostname':{'type':'string','maxLength':253,'description':'Default: name.'},"
     "'pool':{'type':'string','pattern':'^[A-Za-z0-9._-]{1,31}$'},"
     "'address':{'type':'string','description':'A numeric IPv4 or IPv6 address or a host name.'},"
     "'cpus':{'type':'integer','minimum':1,'maximum':65536},"
     "'gpus':{'type':'array','maxItems':64,'items':{'$ref':'#/components/schemas/Gpu'}},"
     "'version':{'type':'string','maxLength':63},"
     "'running':{'type':'array','maxItems':1024,'items':{'type':'string'},'description':'The "
     "allocations the agent runs now.'}}}"},
    {"AgentRegistered",
     "{'allOf':[{'$ref':'#/components/schemas/Agent'},{'type':'object','required':['next_seq',"
     "'heartbeat_s','grace_s'],'properties':{'next_seq':{'type':'integer','format':'int64',"
     "'description':'The first command seq to ask for: poll with after=next_seq-1.'},"
     "'heartbeat_s':{'type':'integer','description':'Poll at least this often.'},"
     "'grace_s':{'type':'integer','description':'Silent for longer, the agent is LOST.'}}}],"
     "'description':'201 for a new agent, 200 for one registered again.'}"},
    {"AgentCommand",
     "{'type':'object','required':['seq','kind'],'additionalProperties':true,'description':"
     "'seq and kind, then the fields of the command (start, signal, drop, exec).',"
     "'properties':{'seq':{'type':'integer','format':'int64','minimum':1},"
     "'kind':{'type':'string'}}}"},
    {"AgentCommands",
     "{'type':'object','required':['commands','state'],'properties':{'commands':{'type':'array',"
     "'items':{'$ref':'#/components/schemas/AgentCommand'},'description':'Not yet done, in seq "
     "order; empty when wait passed.'},'state':{'type':'string','enum':['ONLINE','LOST'],"
     "'description':'LOST: register again.'}}}"},
    {"AgentCommandReport",
     "{'type':'object','required':['ok'],'additionalProperties':false,'properties':{"
     "'ok':{'type':'boolean'},'error':{'type':'string','maxLength':4096},"
     "'exit_code':{'type':'integer','minimum':-255,'maximum':255}}}"},
    {"AgentCommandDone",
     "{'type':'object','required':['seq','kind','ok','done_time','repeated'],'properties':{"
     "'seq':{'type':'integer','format':'int64'},'kind':{'type':'string'},'ok':{'type':'boolean',"
     "'description':'The first report.'},'done_time':" TIME("When the first report came.") ","
     "'repeated':{'type':'boolean','description':'true: the command was already reported done; "
     "nothing changed.'}}}"},

    /* ---- the rest ---- */
    {"Health",
     "{'type':'object','required':['status'],'properties':{'status':{'type':'string','enum':['ok',"
     "'ready']}}}"},
    {"Empty",
     "{'type':'object','description':'An empty object: what a delete answers (AIP-135).'}"},
    {"ProfileTrace",
     "{'type':'object','description':'Chrome trace-event JSON (chrome://tracing, Perfetto).',"
     "'properties':{'traceEvents':{'type':'array','items':{'type':'object'}}}}"},
    {"OpenApiDocument", "{'type':'object','description':'This document (OpenAPI 3.0.3).'}"},

    /* ---- the worker side of an allocation (allocations.c) ---- */
    {"CheckpointUpload",
     "{'type':'object','required':['path','bytes','sha256'],'description':'Where kilnd keeps an "
     "uploaded checkpoint: the path a progress line names it by.','properties':{'path':{'type':"
     "'string'},'bytes':{'type':'integer'},'sha256':{'type':'string','pattern':'^[0-9a-f]{64}$'}}}"},
    {"AllocationExit",
     "{'type':'object','description':'How the trainer ended: exit_code or signal, one of the two.',"
     "'properties':{'exit_code':{'type':'integer','minimum':0,'maximum':255},'signal':{'type':"
     "'integer','minimum':1,'maximum':64},'host':{'type':'string'},'message':{'type':'string'}}}"},
    {"RelayRequest",
     "{'type':'object','required':['host','argv'],'description':'Open MPI asks a host of the "
     "allocation to run its daemon.','properties':{'host':{'type':'string','description':'An "
     "agent name of the allocation.'},'argv':{'type':'array','minItems':1,'items':{'type':"
     "'string'},'description':'argv[0] is orted or prted (a path to one).'}}}"},
    {"Relay",
     "{'type':'object','required':['relay'],'properties':{'relay':{'type':'string'}}}"},
    {"RelayWaitResult",
     "{'type':'object','required':['done'],'properties':{'done':{'type':'boolean'},'exit_code':{"
     "'type':'integer'}}}"},

    /* ---- the job spec (api/spec.c; docs/spec.md has every rule) ---- */
    {"JobSpec",
     "{'type':'object','description':'A training job: model, data, loss and optimizer. Unknown "
     "fields are refused by name (400). The model is model or keras_model, one of the two.',"
     "'required':['loss','dataset','optimizer'],"
     "'properties':{"
     "'display_name':{'type':'string','minLength':1,'maxLength':127},"
     "'model':{'$ref':'#/components/schemas/Model'},"
     "'keras_model':{'type':'object','description':'A Keras 2 or 3 model.to_json() (Sequential or "
     "functional), translated into model with Keras names and defaults; the job stores the "
     "translated model. See docs/spec.md.','additionalProperties':true},"
     "'loss':{'type':'string','enum':['sparse_categorical_crossentropy',"
     "'categorical_crossentropy','binary_crossentropy','mse','mae']},"
     "'metrics':{'type':'array','items':{'oneOf':[{'type':'string','enum':['accuracy','mse','mae',"
     "'top_k_accuracy']},{'type':'object','required':['type'],'properties':{'type':{'type':"
     "'string','enum':['top_k_accuracy']},'k':{'type':'integer','minimum':1}}}]}},"
     "'dataset':{'type':'object','required':['name'],'properties':{"
     "'name':{'type':'string','description':'A built-in data set or an uploaded one (ds-...).',"
     "'example':'fashion-mnist'},'validation':{'type':'string','enum':['test','none','split']},"
     "'validation_split':{'type':'number'},'format':{'type':'string','enum':['tfrecord','tar'],"
     "'description':'Stream shard files: name is then a folder of shards on the server, or an "
     "uploaded or registered data set of that format.'},"
     "'features':{'type':'object','properties':{'image':{'type':'string'},"
     "'label':{'type':'string'}}}}},"
     "'pipeline':{'type':'object','description':'The input pipeline (tf.data names).',"
     "'properties':{'batch_size':{'type':'integer','minimum':1},'shuffle':{'type':'boolean'},"
     "'shuffle_buffer':{'type':'integer'},'normalize':{'type':'boolean'},"
     "'standardize':{'type':'object','properties':{'mean':{'type':'array','items':{'type':"
     "'number'}},'std':{'type':'array','items':{'type':'number'}}}},"
     "'augment':{'type':'array','items':{}},'drop_remainder':{'type':'boolean'},"
     "'cache':{'type':'string','enum':['memory','file']},'prefetch':{'type':'integer'},"
     "'num_parallel_calls':{'type':'integer'},'take':{'type':'integer'},'skip':{'type':"
     "'integer'},'interleave':{'type':'object','properties':{'cycle_length':{'type':'integer'},"
     "'block_length':{'type':'integer'}}},'one_hot':{'type':'boolean'},"
     "'cast':{'type':'string','enum':['float32','float16','bfloat16']},"
     "'shard':{'type':'object','properties':{'num_shards':{'type':'integer'},'index':{'type':"
     "'integer'}}}}},"
     "'optimizer':{'type':'object','required':['type'],'description':'Keras names; each type "
     "also takes its own fields (momentum, beta_1, rho, ...).','properties':{"
     "'type':{'type':'string','enum':['sgd','adam','adamw','rmsprop','adagrad']},"
     "'learning_rate':{'type':'number'},'weight_decay':{'type':'number'},"
     "'global_clipnorm':{'type':'number'},'schedule':{'type':'object','properties':{'type':{"
     "'type':'string','enum':['constant','step','exponential','cosine']}}}}},"
     "'epochs':{'type':'integer','minimum':1,'maximum':10000},"
     "'log_every_steps':{'type':'integer','minimum':1,'maximum':1000000},"
     "'seed':{'type':'integer','format':'int64','minimum':0},"
     "'priority':{'type':'integer','minimum':0,'maximum':100},"
     "'resources':{'type':'object','properties':{'device_type':{'type':'string','enum':['cpu',"
     "'gpu']},'devices':{'type':'integer','minimum':1},'pool':{'type':'string'}}},"
     "'precision':{'type':'string','enum':['float32','mixed_bfloat16','mixed_float16']},"
     "'recompute':{'type':'boolean'},"
     "'strategy':{'type':'object','required':['type'],'properties':{'type':{'type':'string',"
     "'enum':['single','mirrored','multi_worker','parameter_server']},'replicas':{'type':"
     "'integer'},'workers':{'type':'integer'},'replicas_per_worker':{'type':'integer'},"
     "'aggregation':{'type':'string'},'bucket_cap_mb':{'type':'number'},'ps':{'type':'integer'},"
     "'mode':{'type':'string'},'max_staleness':{'type':'integer'}}},"
     "'max_restarts':{'type':'integer','minimum':0,'maximum':100},"
     "'max_runtime':{'type':'integer','minimum':0,'description':'Seconds; 0: no limit.'},"
     "'checkpoint':{'type':'object','properties':{'every_steps':{'type':'integer'},"
     "'keep_last':{'type':'integer'},'keep_best':{'type':'integer'},'monitor':{'type':'string'},"
     "'mode':{'type':'string','enum':['min','max']}}},"
     "'callbacks':{'type':'object','properties':{'early_stopping':{'type':'object'},"
     "'reduce_lr_on_plateau':{'type':'object'}}},"
     "'gradient_accumulation_steps':{'type':'integer','minimum':1,'maximum':4096},"
     "'validation_every_steps':{'type':'integer','minimum':1},"
     "'profile':{'type':'object','required':['steps'],'properties':{'steps':{'type':'array',"
     "'minItems':2,'maxItems':2,'items':{'type':'integer'},'description':'[first, last] "
     "optimizer steps to record.'}}}}}"},
    /* ---- tenants (tenants.c) ---- */
    {"Quota",
     "{'type':'object','description':'The limits in force for a tenant (set by an admin, else "
     "the defaults of kilnd) and what it uses. 0: no limit (except max_priority).',"
     "'required':['name','tenant','max_priority','max_devices','max_queued_jobs',"
     "'max_storage_bytes','usage'],'properties':{"
     "'name':{'type':'string','example':'tenants/acme/quota'},'tenant':{'type':'string'},"
     "'max_priority':{'type':'integer','minimum':0,'maximum':100,'description':'The highest "
     "priority its users may give a job (admins are not held to it).'},"
     "'max_devices':{'type':'integer','minimum':0,'description':'Devices its unfinished jobs "
     "may ask for, all together.'},"
     "'max_queued_jobs':{'type':'integer','minimum':0,'description':'Jobs it may have waiting "
     "(QUEUED or PREEMPTED).'},"
     "'max_storage_bytes':{'type':'integer','format':'int64','minimum':0,'description':'Bytes "
     "of uploads and checkpoints together.'},"
     "'usage':{'type':'object','required':['queued_jobs','devices','storage_bytes'],"
     "'properties':{'queued_jobs':{'type':'integer'},'devices':{'type':'integer'},"
     "'storage_bytes':{'type':'integer','format':'int64'}}}}}"},
    {"QuotaUpdate",
     "{'type':'object','description':'The fields to set; the others keep their value. null "
     "resets a field to the default of kilnd.','additionalProperties':false,'properties':{"
     "'max_priority':{'type':'integer','minimum':0,'maximum':100,'nullable':true},"
     "'max_devices':{'type':'integer','minimum':0,'nullable':true},"
     "'max_queued_jobs':{'type':'integer','minimum':0,'nullable':true},"
     "'max_storage_bytes':{'type':'integer','format':'int64','minimum':0,'nullable':true}}}"},
    /* ---- experiments (experiments.c) ---- */
    {"ExperimentRequest",
     "{'type':'object','required':['spec','search'],'additionalProperties':false,'properties':{"
     "'display_name':{'type':'string'},"
     "'spec':{'$ref':'#/components/schemas/JobSpec'},"
     "'search':{'$ref':'#/components/schemas/Search'}}}"},
    {"Search",
     "{'type':'object','required':['searcher','metric','parameters'],'properties':{"
     "'searcher':{'type':'string','enum':['grid','random','asha']},"
     "'metric':{'type':'string','description':'The metric a trial reports at an epoch end.',"
     "'example':'val_accuracy'},"
     "'mode':{'type':'string','enum':['max','min'],'description':'Default: max for an "
     "accuracy, else min.'},"
     "'max_trials':{'type':'integer','minimum':1,'maximum':1000,'description':'Trials of a "
     "random or asha search (default 10); a grid makes its points.'},"
     "'max_concurrent_trials':{'type':'integer','minimum':1,'default':1},"
     "'seed':{'type':'integer','minimum':0,'default':0,'description':'The same seed draws the "
     "same trials.'},"
     "'parameters':{'type':'object','description':'By spec path, e.g. optimizer.learning_rate "
     "or model.layers[1].units.','additionalProperties':{'$ref':"
     "'#/components/schemas/SearchParameter'}},"
     "'asha':{'type':'object','description':'Rungs at min_epochs x reduction_factor^k up to "
     "max_epochs.','required':['max_epochs'],'properties':{"
     "'min_epochs':{'type':'integer','minimum':1,'default':1},"
     "'max_epochs':{'type':'integer','minimum':1},"
     "'reduction_factor':{'type':'integer','minimum':2,'default':3}}}}}"},
    {"SearchParameter",
     "{'type':'object','required':['type'],'properties':{"
     "'type':{'type':'string','enum':['uniform','log_uniform','int_uniform','categorical']},"
     "'min':{'type':'number'},'max':{'type':'number'},"
     "'values':{'type':'array','items':{},'description':'categorical'},"
     "'count':{'type':'integer','minimum':1,'description':'Grid points of a range.'}}}"},
    {"Experiment",
     "{'type':'object','required':['display_name','tenant','state','spec','search',"
     "'trial_count','epochs_trained','best_trial'],'properties':{"
     "'name':{'type':'string','example':'experiments/20260101-0123456789abcdef'},"
     "'id':{'type':'string','description':'Absent in a validate_only answer.'},"
     "'display_name':{'type':'string'},'tenant':{'type':'string'},"
     "'request_id':{'type':'string'},"
     "'state':{'type':'string','enum':['RUNNING','SUCCEEDED','FAILED','CANCELLED']},"
     "'message':{'type':'string','description':'How it ended.'},"
     "'spec':{'$ref':'#/components/schemas/JobSpec'},"
     "'search':{'$ref':'#/components/schemas/Search'},"
     "'create_time':" TIME("When it was created.") ","
     "'end_time':" TIME("When it ended.") ","
     "'trial_count':{'type':'integer'},'trials_waiting':{'type':'integer'},"
     "'trials_running':{'type':'integer'},'trials_paused':{'type':'integer'},"
     "'trials_stopped':{'type':'integer'},'trials_done':{'type':'integer'},"
     "'trials_failed':{'type':'integer'},"
     "'epochs_trained':{'type':'integer','description':'Epochs its trials trained to the ends "
     "of the rungs they finished, all together.'},"
     "'best_trial':{'type':'object','nullable':true,'description':'null while no trial has "
     "reported the metric.','allOf':[{'$ref':'#/components/schemas/BestTrial'}]}}}"},
    {"ExperimentList", PAGE_OF("Experiment", "experiments", "A page of experiments, newest "
                               "first.")},
    {"BestTrial",
     "{'type':'object','required':['job','index','values','metric','epochs'],'properties':{"
     "'job':{'type':'string'},'index':{'type':'integer'},"
     "'values':{'type':'object','additionalProperties':true},"
     "'metric':{'type':'number','nullable':true},"
     "'epochs':{'type':'integer','description':'Epochs it trained.'}}}"},
    {"Trial",
     "{'type':'object','required':['job','index','values','state','trial_state','rung',"
     "'epochs_trained','metric','rung_metrics'],'properties':{"
     "'job':{'type':'string','description':'Its job; empty while WAITING.'},"
     "'index':{'type':'integer'},'values':{'type':'object','additionalProperties':true},"
     "'state':{'type':'string','description':'Its job state; empty without a job.'},"
     "'trial_state':{'type':'string','enum':['WAITING','RUNNING','PROMOTED','PAUSED',"
     "'STOPPED','DONE','FAILED']},"
     "'rung':{'type':'integer','description':'The rung it trains toward, or the last it "
     "finished.'},"
     "'epochs_trained':{'type':'integer'},"
     "'metric':{'type':'number','nullable':true,'description':'At the last rung it finished.'},"
     "'rung_metrics':{'type':'array','items':{'type':'number','nullable':true}}}}"},
    {"TrialList", PAGE_OF("Trial", "trials", "The trials of an experiment, by index.")},
    {"ExperimentEvent",
     "{'type':'object','required':['time','reason','job','message'],'properties':{"
     "'time':" TIME("When it happened.") ","
     "'reason':{'type':'string','description':'EXPERIMENT_CREATED, TRIAL_CREATED, "
     "TRIAL_PAUSED, TRIAL_PROMOTED, TRIAL_STOPPED, TRIAL_DONE, TRIAL_FAILED, EXPERIMENT_DONE, "
     "EXPERIMENT_FAILED or EXPERIMENT_CANCELLED.'},"
     "'job':{'type':'string','description':'The trial job; empty for the experiment.'},"
     "'message':{'type':'string'}}}"},
    {"ExperimentEventList", LIST_OF("ExperimentEvent", "events", "Oldest first.")},
    {"Model",
     "{'type':'object','required':['input_shape','layers'],'properties':{"
     "'input_shape':{'type':'array','items':{'type':'integer','minimum':1},'example':[28,28,1]},"
     "'layers':{'type':'array','items':{'$ref':'#/components/schemas/Layer'}}}}"},
    {"Layer",
     "{'type':'object','required':['type'],'description':'One layer; each type takes its own "
     "fields (units, filters, kernel_size, activation, ...; see docs/spec.md).','properties':{"
     "'type':{'type':'string','example':'dense'},'units':{'type':'integer'},"
     "'activation':{'type':'string'}},'additionalProperties':true}"},
};
// clang-format on

const http_openapi_text *http_openapi_schemas(int *n) {
  *n = (int)(sizeof schemas / sizeof schemas[0]);
  return schemas;
}
