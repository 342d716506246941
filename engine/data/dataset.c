/* dataset.c — what every data set shares: freeing it and reading one
 * example as floats, whether its examples are stored as floats (x) or as
 * bytes (x8, an IDX file's pixels: a quarter of the memory). */
#include <stdlib.h>
#include <string.h>

#include "../engine.h"

void kn_dataset_free(kn_dataset *ds) {
  if (!ds) return;
  free(ds->x);
  free(ds->x8);
  free(ds->y);
  free(ds->targets);
  kn_stream_free(ds->stream);
  ds->stream = NULL;
  ds->x = NULL;
  ds->x8 = NULL;
  ds->y = NULL;
  ds->targets = NULL;
  ds->n = 0;
}

const float *kn_dataset_row(const kn_dataset *ds, int64_t row, float *buf) {
  const size_t ex = ds->example_size;
  if (ds->x) return ds->x + (size_t)row * ex;
  const uint8_t *src = ds->x8 + (size_t)row * ex;
  const float scale = ds->x8_scale;
  for (size_t i = 0; i < ex; i++) buf[i] = (float)src[i] * scale;
  return buf;
}

size_t kn_dataset_value_bytes(const kn_dataset *ds) {
  return ds->x ? sizeof(float) : sizeof(uint8_t);
}

int kn_dataset_stream(kn_stream *s, kn_dataset *out, char *err, size_t errlen) {
  (void)err, (void)errlen;
  memset(out, 0, sizeof *out);
  int h, w, c;
  kn_stream_shape(s, &h, &w, &c);
  out->stream = s;
  out->n = kn_stream_examples(s);
  out->ndim = 3;
  out->shape[0] = h;
  out->shape[1] = w;
  out->shape[2] = c;
  out->example_size = (size_t)h * w * c;
  out->n_classes = kn_stream_classes(s);
  out->value_range = 255.0f;
  return KN_OK;
}
