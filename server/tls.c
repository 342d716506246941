/* tls.c — kilnd's HTTPS: reads the certificate chain and the private key
 * (refusing a key every user may read), checks with GnuTLS that they load
 * and belong together before the daemon starts, names the protocol
 * versions offered (TLS 1.2 and 1.3 only), and writes the odd answer that
 * must go out on a connection's TLS session instead of its socket. */
#include <errno.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "server.h"

/* GnuTLS priorities: TLS 1.3 and 1.2 only (no SSL 3, TLS 1.0 or 1.1), and
 * for 1.2 only forward-secret key exchanges with AEAD ciphers. */
const char http_tls_priorities[] =
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+CHACHA20-POLY1305:+AES-256-GCM:"
    "+AES-128-GCM:-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA:%SERVER_PRECEDENCE";

int http_tls_available(void) {
  return MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES;
}

/* The whole file, NUL-terminated; NULL with a sentence in err. */
static char *read_pem(const char *flag, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s %s cannot be read: %s", flag, path, strerror(errno));
    return NULL;
  }
  size_t cap = 16384, len = 0, n;
  char *buf = malloc(cap);
  while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (len + 1 == cap) {
      char *more = cap < (1u << 24) ? realloc(buf, cap * 2) : NULL;
      if (!more) free(buf);
      buf = more;
      cap *= 2;
    }
  }
  int failed = ferror(f);
  fclose(f);
  if (!buf || failed) {
    snprintf(err, errlen, "%s %s cannot be read%s", flag, path,
             buf ? "" : ": out of memory, or larger than 16 MiB");
    free(buf);
    return NULL;
  }
  buf[len] = '\0';
  return buf;
}

int http_tls_load(const char *cert_path, const char *key_path, char **cert_pem, char **key_pem,
                  char *err, size_t errlen) {
  *cert_pem = *key_pem = NULL;
  if (!http_tls_available()) {
    snprintf(err, errlen,
             "--tls-cert: this kilnd's libmicrohttpd was built without TLS (GnuTLS), so it cannot "
             "serve HTTPS; install a libmicrohttpd with TLS (Debian's has it), or serve on "
             "loopback behind a TLS proxy with --behind-tls-proxy");
    return -1;
  }
  struct stat sb;
  if (stat(key_path, &sb) != 0) {
    snprintf(err, errlen, "--tls-key %s cannot be read: %s", key_path, strerror(errno));
    return -1;
  }
  if (!S_ISREG(sb.st_mode)) {
    snprintf(err, errlen, "--tls-key %s is not a regular file", key_path);
    return -1;
  }
  if (sb.st_mode & 0007) {
    snprintf(err, errlen,
             "--tls-key %s is open to every user on this machine (mode %04o); a private key "
             "must not be: chmod 600 it (or 640 with a group of its own)",
             key_path, (unsigned)(sb.st_mode & 07777));
    return -1;
  }
  char *cert = read_pem("--tls-cert", cert_path, err, errlen);
  char *key = cert ? read_pem("--tls-key", key_path, err, errlen) : NULL;
  if (!cert || !key) {
    free(cert);
    free(key);
    return -1;
  }
  /* The daemon would only say it cannot start: load the pair here first,
   * so a bad file or a key of another certificate is named. */
  gnutls_certificate_credentials_t creds = NULL;
  int rc = gnutls_certificate_allocate_credentials(&creds);
  if (rc == GNUTLS_E_SUCCESS) {
    gnutls_datum_t c = {(unsigned char *)cert, (unsigned)strlen(cert)};
    gnutls_datum_t k = {(unsigned char *)key, (unsigned)strlen(key)};
    rc = gnutls_certificate_set_x509_key_mem(creds, &c, &k, GNUTLS_X509_FMT_PEM);
  }
  if (creds) gnutls_certificate_free_credentials(creds);
  if (rc < 0) {
    snprintf(err, errlen,
             "--tls-cert %s with --tls-key %s cannot be used: %s (both must be PEM, the key "
             "unencrypted and the certificate's own)",
             cert_path, key_path, gnutls_strerror(rc));
    free(cert);
    free(key);
    return -1;
  }
  *cert_pem = cert;
  *key_pem = key;
  return 0;
}

int http_tls_send(void *connection, const void *data, size_t len) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (!info || !info->tls_session) return -1;
  ssize_t sent = gnutls_record_send((gnutls_session_t)info->tls_session, data, len);
  return sent == (ssize_t)len ? 0 : -1;
}
