/* images.c — a directory of images, one sub-folder per class, as a
 * dataset: PNG through libpng, JPEG through libjpeg-turbo, converted to
 * gray or RGB and resized bilinearly to the model's input. Classes and
 * files are read in sorted name order, so a folder always loads the same. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <jpeglib.h>
#include <jerror.h> /* after jpeglib.h */
#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../engine.h"

#define MAX_SIDE 16384
/* The most pixels one image may decode to (64 Mi: 8192 x 8192), so a few
 * bytes that claim a huge picture cannot make the reader allocate and
 * fill gigabytes. */
#define MAX_PIXELS (1u << 26)

typedef struct name_list {
  char **names;
  int n, cap;
} name_list;

static void names_free(name_list *l) {
  for (int i = 0; i < l->n; i++) free(l->names[i]);
  free(l->names);
  memset(l, 0, sizeof *l);
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Entries of dir (no dot files) that are directories (want_dirs) or
 * regular files, sorted. */
static int list_dir(const char *dir, int want_dirs, name_list *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  DIR *d = opendir(dir);
  if (!d) {
    snprintf(err, errlen, "%s: cannot open directory: %s", dir, strerror(errno));
    return KN_EIO;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    struct stat sb;
    int used = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (used < 0 || (size_t)used >= sizeof path || stat(path, &sb) != 0) continue;
    if (want_dirs ? !S_ISDIR(sb.st_mode) : !S_ISREG(sb.st_mode)) continue;
    if (out->n == out->cap) {
      int cap = out->cap ? out->cap * 2 : 64;
      char **bigger = realloc(out->names, (size_t)cap * sizeof *bigger);
      if (!bigger) goto oom;
      out->names = bigger;
      out->cap = cap;
    }
    out->names[out->n] = strdup(e->d_name);
    if (!out->names[out->n]) goto oom;
    out->n++;
  }
  closedir(d);
  qsort(out->names, (size_t)out->n, sizeof *out->names, cmp_name);
  return KN_OK;
oom:
  closedir(d);
  names_free(out);
  snprintf(err, errlen, "%s: out of memory listing the directory", dir);
  return KN_ENOMEM;
}

static int decode_png(const uint8_t *data, size_t len, const char *path, int channels,
                      uint8_t **pixels, int *w, int *h, char *err, size_t errlen) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, data, len)) {
    snprintf(err, errlen, "%s: not a readable PNG image: %s", path, img.message);
    return KN_EFORMAT;
  }
  img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  if (img.width < 1 || img.height < 1 || img.width > MAX_SIDE || img.height > MAX_SIDE ||
      (uint64_t)img.width * img.height > MAX_PIXELS) {
    snprintf(err, errlen, "%s: PNG is %ux%u; sides must be 1..%d and pixels at most %u", path,
             img.width, img.height, MAX_SIDE, MAX_PIXELS);
    png_image_free(&img);
    return KN_EFORMAT;
  }
  *pixels = malloc(PNG_IMAGE_SIZE(img));
  if (!*pixels) {
    png_image_free(&img);
    snprintf(err, errlen, "%s: out of memory for a %ux%u image", path, img.width, img.height);
    return KN_ENOMEM;
  }
  if (!png_image_finish_read(&img, NULL, *pixels, 0, NULL)) {
    snprintf(err, errlen, "%s: PNG does not decode: %s", path, img.message);
    free(*pixels);
    *pixels = NULL;
    png_image_free(&img);
    return KN_EFORMAT;
  }
  *w = (int)img.width;
  *h = (int)img.height;
  return KN_OK;
}

typedef struct jpeg_fail {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
} jpeg_fail;

static void on_jpeg_error(j_common_ptr cinfo) {
  jpeg_fail *f = (jpeg_fail *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, f->message);
  longjmp(f->jump, 1);
}

/* Warnings (extraneous bytes, say) are not errors, except data that ends
 * before the picture does: libjpeg would fill the rest with gray, and
 * tf.io.decode_jpeg refuses it too. */
static void on_jpeg_message(j_common_ptr cinfo) {
  if (cinfo->err->msg_code != JWRN_JPEG_EOF) return;
  jpeg_fail *f = (jpeg_fail *)cinfo->err;
  snprintf(f->message, sizeof f->message, "its data ends early (a cut file)");
  longjmp(f->jump, 1);
}

static int decode_jpeg(const uint8_t *data, size_t len, const char *path, int channels,
                       uint8_t **pixels, int *w, int *h, char *err, size_t errlen) {
  struct jpeg_decompress_struct cinfo;
  jpeg_fail fail;
  /* volatile: read after a longjmp back into this frame. */
  uint8_t *volatile buf = NULL;
  cinfo.err = jpeg_std_error(&fail.mgr);
  fail.mgr.error_exit = on_jpeg_error;
  fail.mgr.output_message = on_jpeg_message;
  if (setjmp(fail.jump)) {
    snprintf(err, errlen, "%s: JPEG does not decode: %s", path, fail.message);
    jpeg_destroy_decompress(&cinfo);
    free(buf);
    return KN_EFORMAT;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, (unsigned long)len);
  jpeg_read_header(&cinfo, TRUE);
  /* The size is known from the header: refuse before libjpeg allocates
   * (a progressive JPEG's coefficients take the whole picture). */
  if (cinfo.image_width > MAX_SIDE || cinfo.image_height > MAX_SIDE ||
      (uint64_t)cinfo.image_width * cinfo.image_height > MAX_PIXELS) {
    snprintf(err, errlen, "%s: JPEG is %ux%u; sides must be up to %d and pixels at most %u", path,
             cinfo.image_width, cinfo.image_height, MAX_SIDE, MAX_PIXELS);
    jpeg_destroy_decompress(&cinfo);
    return KN_EFORMAT;
  }
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  if ((int)cinfo.output_components != channels) {
    snprintf(err, errlen, "%s: JPEG is %ux%u with %d components; want %d channels", path,
             cinfo.output_width, cinfo.output_height, cinfo.output_components, channels);
    jpeg_destroy_decompress(&cinfo);
    return KN_EFORMAT;
  }
  size_t stride = (size_t)cinfo.output_width * channels;
  buf = malloc(stride * cinfo.output_height);
  if (!buf) {
    snprintf(err, errlen, "%s: out of memory", path);
    jpeg_destroy_decompress(&cinfo);
    return KN_ENOMEM;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = buf + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  *w = (int)cinfo.output_width;
  *h = (int)cinfo.output_height;
  jpeg_destroy_decompress(&cinfo);
  *pixels = buf;
  return KN_OK;
}

/* Bilinear resize of (sh, sw, c) bytes into (dh, dw, c) floats in 0..255,
 * sampling at pixel centres (as tf.image.resize with half-pixel centres). */
static void resize(const uint8_t *src, int sh, int sw, float *dst, int dh, int dw, int c) {
  for (int y = 0; y < dh; y++) {
    float fy = ((float)y + 0.5f) * (float)sh / (float)dh - 0.5f;
    if (fy < 0) fy = 0;
    int y0 = (int)fy, y1 = y0 + 1 < sh ? y0 + 1 : sh - 1;
    float wy = fy - (float)y0;
    for (int x = 0; x < dw; x++) {
      float fx = ((float)x + 0.5f) * (float)sw / (float)dw - 0.5f;
      if (fx < 0) fx = 0;
      int x0 = (int)fx, x1 = x0 + 1 < sw ? x0 + 1 : sw - 1;
      float wx = fx - (float)x0;
      for (int k = 0; k < c; k++) {
        float a = src[((size_t)y0 * sw + x0) * c + k], b = src[((size_t)y0 * sw + x1) * c + k];
        float d = src[((size_t)y1 * sw + x0) * c + k], e = src[((size_t)y1 * sw + x1) * c + k];
        float top = a + (b - a) * wx, bottom = d + (e - d) * wx;
        dst[((size_t)y * dw + x) * c + k] = top + (bottom - top) * wy;
      }
    }
  }
}

int kn_image_decode(const uint8_t *data, size_t len, const char *name, int height, int width,
                    int channels, float *dst, char *err, size_t errlen) {
  uint8_t *pixels = NULL;
  int w = 0, h = 0, rc;
  if (len >= 4 && data[0] == 0x89 && data[1] == 'P' && data[2] == 'N' && data[3] == 'G') {
    rc = decode_png(data, len, name, channels, &pixels, &w, &h, err, errlen);
  } else if (len >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) {
    rc = decode_jpeg(data, len, name, channels, &pixels, &w, &h, err, errlen);
  } else {
    uint8_t m[4] = {0};
    memcpy(m, data, len < 4 ? len : 4);
    snprintf(err, errlen,
             "%s: not a PNG or JPEG image, nor %dx%dx%d raw bytes (%zu bytes starting %02x %02x "
             "%02x %02x)",
             name, height, width, channels, len, m[0], m[1], m[2], m[3]);
    rc = KN_EFORMAT;
  }
  if (rc) return rc;
  resize(pixels, h, w, dst, height, width, channels);
  free(pixels);
  return KN_OK;
}

/* A whole file in memory. */
static int read_file(const char *path, uint8_t **data, size_t *len, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return KN_EIO;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || st.st_size < 0) {
    fclose(f);
    snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    return KN_EIO;
  }
  *len = (size_t)st.st_size;
  *data = malloc(*len ? *len : 1);
  if (!*data) {
    fclose(f);
    snprintf(err, errlen, "%s: out of memory for %zu bytes", path, *len);
    return KN_ENOMEM;
  }
  size_t got = fread(*data, 1, *len, f);
  fclose(f);
  if (got != *len) {
    free(*data);
    snprintf(err, errlen, "%s: read %zu of %zu bytes", path, got, *len);
    return KN_EIO;
  }
  return KN_OK;
}

int kn_dataset_load_images(const char *dir, int height, int width, int channels, kn_dataset *out,
                           char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (height < 1 || width < 1 || height > MAX_SIDE || width > MAX_SIDE ||
      (channels != 1 && channels != 3)) {
    snprintf(err, errlen, "images: need height and width 1..%d and 1 or 3 channels, got %dx%dx%d",
             MAX_SIDE, height, width, channels);
    return KN_EINVAL;
  }
  name_list classes;
  int rc = list_dir(dir, 1, &classes, err, errlen);
  if (rc) return rc;
  name_list *files = calloc((size_t)(classes.n ? classes.n : 1), sizeof *files);
  if (!files) {
    names_free(&classes);
    snprintf(err, errlen, "%s: out of memory", dir);
    return KN_ENOMEM;
  }
  int64_t total = 0;
  for (int c = 0; c < classes.n && !rc; c++) {
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", dir, classes.names[c]);
    rc = list_dir(sub, 0, &files[c], err, errlen);
    total += files[c].n;
  }
  if (!rc && (classes.n < 2 || total < 1)) {
    snprintf(err, errlen,
             "%s: needs at least 2 class folders holding images, found %d folders and %lld files",
             dir, classes.n, (long long)total);
    rc = KN_EFORMAT;
  }
  const size_t ex = (size_t)height * width * channels;
  if (!rc) {
    out->x = malloc((size_t)total * ex * sizeof *out->x);
    out->y = malloc((size_t)total * sizeof *out->y);
    if (!out->x || !out->y) {
      snprintf(err, errlen, "%s: out of memory for %lld images of %zu values", dir,
               (long long)total, ex);
      rc = KN_ENOMEM;
    }
  }
  int64_t i = 0;
  for (int c = 0; c < classes.n && !rc; c++) {
    for (int k = 0; k < files[c].n && !rc; k++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s/%s", dir, classes.names[c], files[c].names[k]);
      uint8_t *data;
      size_t len;
      rc = read_file(path, &data, &len, err, errlen);
      if (rc) break;
      rc = kn_image_decode(data, len, path, height, width, channels, out->x + (size_t)i * ex, err,
                           errlen);
      free(data);
      if (rc) break;
      out->y[i++] = c;
    }
  }
  if (!rc) {
    out->n = total;
    out->ndim = 3;
    out->shape[0] = height;
    out->shape[1] = width;
    out->shape[2] = channels;
    out->example_size = ex;
    out->n_classes = classes.n;
    out->value_range = 255.0f;
  }
  for (int c = 0; c < classes.n; c++) names_free(&files[c]);
  free(files);
  names_free(&classes);
  if (rc) kn_dataset_free(out);
  return rc;
}
