/* export.c — kiln-train --export-onnx: a spec's model, trained just now or
 * loaded from a checkpoint, written as an ONNX file. */
#include <stdio.h>

#include "worker.h"

int worker_export_model(const api_job_spec *spec, kn_model *model, const kn_model_config *mc,
                        const char *out, int *refused, char *err, size_t errlen) {
  int rc = kn_onnx_export(model, mc, spec->display_name, out, err, errlen);
  *refused = rc == KN_EINVAL;
  return rc ? -1 : 0;
}

int worker_export_checkpoint(const api_job_spec *spec, const char *checkpoint, const char *out,
                             int *refused, char *err, size_t errlen) {
  kn_layer_config layers[API_MAX_LAYERS];
  kn_model_config mc;
  worker_model_config(spec, layers, &mc);
  /* Inference needs no training plan: one row, float32 on the host (the
   * weights are float32 in every precision). */
  mc.batch_size = 1;
  mc.precision = KN_PRECISION_FLOAT32;
  mc.recompute = 0;
  for (int i = 0; i < mc.n_layers; i++) layers[i].placed = 0; /* a split model's layers too */
  kn_model model;
  *refused = 0;
  int rc = kn_model_build(&mc, &model, err, errlen);
  if (rc) {
    *refused = 1;
    return -1;
  }
  rc = kn_graph_compile(model.graph, spec->seed, NULL, err, errlen);
  if (!rc) rc = kn_checkpoint_read(model.graph, checkpoint, NULL, err, errlen);
  if (!rc) rc = worker_export_model(spec, &model, &mc, out, refused, err, errlen) ? -1 : 0;
  kn_model_free(&model);
  return rc ? -1 : 0;
}
