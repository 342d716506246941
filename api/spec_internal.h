/* spec_internal.h — private to the job spec's files (spec*.c): the checker
 * that collects problems by JSON path, typed member reads, the name tables
 * the parser and the canonical writer share, and each section's parser. */
#ifndef KILN_API_SPEC_INTERNAL_H
#define KILN_API_SPEC_INTERNAL_H

#include "api.h"
#include "json_util.h"

#include <jansson.h>
#include <stddef.h>

#define PATH_LEN 128 /* api_error_detail.field */

/* Every violation found so far: the first API_MAX_DETAILS go into err, the
 * count covers them all so the message can say how many there were. */
typedef struct checker {
  api_error *err;
  int problems;
} checker;

/* One JSON object being read and its path ("" for the top level). */
typedef struct scope {
  checker *c;
  json_t *obj;
  const char *path;
} scope;

enum { OPTIONAL = 0, REQUIRED = 1 };

/* ---- the checker (spec_check.c) ---- */

__attribute__((format(printf, 3, 4))) void spec_problem(checker *c, const char *field,
                                                        const char *fmt, ...);
void spec_join_path(char out[PATH_LEN], const char *parent, const char *key);
void spec_index_path(char out[PATH_LEN], const char *parent, size_t index);
/* A user's string shortened for quoting in a description, cut on a UTF-8
 * character boundary and marked with "..." when cut. */
const char *spec_clip(const char *text, char *buf, size_t size);
/* Index of value in a NULL-terminated list, or -1. */
int spec_pick(const char *value, const char *const *choices);
/* "a, b, c" into out. */
const char *spec_list_text(const char *const *items, char *out, size_t size);
void spec_copy_text(char *dst, size_t size, const char *src);
/* The member key of s, or NULL when absent (reported when required). */
json_t *spec_member(const scope *s, const char *key, int required);
void spec_wrong_type(const scope *s, const char *key, const char *expected, const json_t *value);
/* An integer, or a number with no fractional part (2.0) that fits. */
int spec_as_integer(const json_t *value, long long *out);
/* Reads an integer member into *out when present and of the right type.
 * Returns 1 when read, 0 when absent, -1 when a problem was reported. */
int spec_get_integer(const scope *s, const char *key, int required, long long min, long long max,
                     long long *out);
/* An int member within [min, max]; *out keeps its default when absent. */
int spec_get_int(const scope *s, const char *key, int required, int min, int max, int *out);
int spec_get_number(const scope *s, const char *key, int required, double *out);
int spec_get_bool(const scope *s, const char *key, int *out);
const char *spec_get_string(const scope *s, const char *key, int required);
/* A string member that must be one of choices; returns its index, or -1
 * when absent or refused (then a problem "<what> '<value>'; supported: .."
 * is reported). */
int spec_get_choice(const scope *s, const char *key, int required, const char *what,
                    const char *const *choices);
json_t *spec_get_object(const scope *s, const char *key, int required);
json_t *spec_get_array(const scope *s, const char *key, int required);
/* Refuses every key of s not in allowed, so a typo never passes silently. */
void spec_refuse_unknown(const scope *s, const char *const *allowed);

/* ---- names, indexed by the api.h enums ---- */

extern const char *const spec_layer_types[];       /* api_layer_type */
extern const char *const spec_activations[];       /* api_activation */
extern const char *const spec_paddings[];          /* padding_same */
extern const char *const spec_initializers[];      /* api_initializer */
extern const char *const spec_augment_names[];     /* bit k of API_AUG_* */
extern const char *const spec_strategy_names[];    /* api_strategy */
extern const char *const spec_aggregation_names[]; /* api_aggregation */
extern const char *const spec_loss_names[];        /* Keras's names, then the aliases */
extern const api_loss spec_loss_of_name[];         /* by index in spec_loss_names */

/* ---- sections ---- */

void spec_parse_model(checker *c, json_t *obj, api_job_spec *spec);     /* spec_model.c */
void spec_parse_dataset(checker *c, json_t *obj, api_job_spec *spec);   /* spec_pipeline.c */
void spec_parse_pipeline(checker *c, json_t *obj, api_job_spec *spec);  /* spec_pipeline.c */
void spec_parse_optimizer(checker *c, json_t *obj, api_job_spec *spec); /* spec_optimizer.c */
/* spec_loss.c */
void spec_check_loss(checker *c, api_job_spec *spec, int has_loss, const int metric_at[4]);
unsigned spec_metric_bit(const char *name);
const char *spec_parse_metric(checker *c, json_t *metric, const char *path, api_job_spec *spec);
void spec_parse_callbacks(checker *c, json_t *obj, api_job_spec *spec);
void spec_parse_checkpoint(checker *c, json_t *obj, api_job_spec *spec);
/* spec_strategy.c */
void spec_parse_resources(checker *c, json_t *obj, api_job_spec *spec);
void spec_check_gpu(checker *c, const api_job_spec *spec);
void spec_check_layer_devices(checker *c, const api_job_spec *spec);
void spec_parse_strategy(checker *c, json_t *obj, api_job_spec *spec);
void spec_check_strategy_resources(checker *c, json_t *resources, api_job_spec *spec);

/* spec_keras.c: keras_model, a Keras model's to_json(), as a model section
 * ({"input_shape": [...], "layers": [...]}) for spec_parse_model; NULL after
 * reporting each problem under keras_model. kp records where each kiln
 * layer came from, so that spec_keras_paths can name the Keras fields in
 * the problems found later (model.layers[2].units ->
 * keras_model.config.layers[3].config.units). */
typedef struct keras_paths {
  int used;
  int n_layers;
  int at[API_MAX_LAYERS]; /* kiln layer i is keras_model.config.layers[at[i]] */
  char input[PATH_LEN];   /* where the input shape was read, batch first */
} keras_paths;
json_t *spec_keras_translate(checker *c, json_t *keras_model, keras_paths *kp);
void spec_keras_paths(const keras_paths *kp, api_error *err);

#endif
