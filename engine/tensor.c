/* tensor.c — element types and device tags: names, conversions between
 * storage types (f16 / bf16 with round-to-nearest-even, saturating u8 and
 * i32), and parsing "cpu" / "cuda:N". */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

const char *kn_dtype_name(kn_dtype dtype) {
  switch (dtype) {
  case KN_F32: return "f32";
  case KN_I32: return "i32";
  case KN_F16: return "f16";
  case KN_BF16: return "bf16";
  case KN_U8: return "u8";
  case KN_F64: return "f64";
  }
  return "?";
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  return kn_bf16_from_f32(f);
}

static float bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

static uint16_t f32_to_f16(float f) {
  return kn_f16_from_f32(f);
}

static float f16_to_f32(uint16_t h) {
  return kn_f16_to_f32(h);
}

static double load(kn_dtype t, const void *src, size_t i) {
  switch (t) {
  case KN_F32: return ((const float *)src)[i];
  case KN_I32: return ((const int32_t *)src)[i];
  case KN_F16: return f16_to_f32(((const uint16_t *)src)[i]);
  case KN_BF16: return bf16_to_f32(((const uint16_t *)src)[i]);
  case KN_U8: return ((const uint8_t *)src)[i];
  case KN_F64: return ((const double *)src)[i];
  }
  return 0.0;
}

static void store(kn_dtype t, void *dst, size_t i, double v) {
  switch (t) {
  case KN_F32: ((float *)dst)[i] = (float)v; return;
  case KN_I32:
    ((int32_t *)dst)[i] = isnan(v)         ? 0
                          : v >= INT32_MAX ? INT32_MAX
                          : v <= INT32_MIN ? INT32_MIN
                                           : (int32_t)lrint(v);
    return;
  case KN_F16: ((uint16_t *)dst)[i] = f32_to_f16((float)v); return;
  case KN_BF16: ((uint16_t *)dst)[i] = f32_to_bf16((float)v); return;
  case KN_U8:
    ((uint8_t *)dst)[i] = isnan(v) ? 0 : v >= 255.0 ? 255 : v <= 0.0 ? 0 : (uint8_t)lrint(v);
    return;
  case KN_F64: ((double *)dst)[i] = v; return;
  }
}

void kn_convert(kn_dtype from, const void *src, kn_dtype to, void *dst, size_t count) {
  /* The casts mixed precision runs every step get loops of their own. */
  if (from == KN_F32 && (to == KN_BF16 || to == KN_F16)) {
    const float *s = src;
    uint16_t *d = dst;
    if (to == KN_BF16)
      for (size_t i = 0; i < count; i++) d[i] = f32_to_bf16(s[i]);
    else
      for (size_t i = 0; i < count; i++) d[i] = f32_to_f16(s[i]);
    return;
  }
  if ((from == KN_BF16 || from == KN_F16) && to == KN_F32) {
    const uint16_t *s = src;
    float *d = dst;
    if (from == KN_BF16)
      for (size_t i = 0; i < count; i++) d[i] = bf16_to_f32(s[i]);
    else
      for (size_t i = 0; i < count; i++) d[i] = f16_to_f32(s[i]);
    return;
  }
  for (size_t i = 0; i < count; i++) store(to, dst, i, load(from, src, i));
}

void kn_round_f32(kn_dtype via, const float *src, float *dst, size_t n) {
  if (via == KN_F16) {
    for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(f32_to_f16(src[i]));
  } else {
    for (size_t i = 0; i < n; i++) dst[i] = kn_bf16_round_f32(src[i]);
  }
}

int kn_device_parse(const char *text, kn_device *out, char *err, size_t errlen) {
  if (strcmp(text, "cpu") == 0) {
    *out = (kn_device){KN_DEVICE_CPU, 0};
    return KN_OK;
  }
  if (strcmp(text, "cuda") == 0) {
    *out = (kn_device){KN_DEVICE_CUDA, 0};
    return KN_OK;
  }
  if (strncmp(text, "cuda:", 5) == 0 && text[5] >= '0' && text[5] <= '9') {
    char *end = NULL;
    long index = strtol(text + 5, &end, 10);
    if (*end == '\0' && index <= 1024) {
      *out = (kn_device){KN_DEVICE_CUDA, (int)index};
      return KN_OK;
    }
  }
  snprintf(err, errlen, "device: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"%s\"", text);
  return KN_EINVAL;
}

void kn_device_format(kn_device d, char *buf, size_t len) {
  if (d.kind == KN_DEVICE_CPU) {
    snprintf(buf, len, "cpu");
  } else {
    snprintf(buf, len, "cuda:%d", d.index);
  }
}
