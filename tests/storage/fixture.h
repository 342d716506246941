/* fixture.h — the storage suites' shared fixture: a fresh SQLite file in
 * its own temporary folder, opened as a store, removed afterwards. */
#ifndef KILN_TESTS_STORAGE_FIXTURE_H
#define KILN_TESTS_STORAGE_FIXTURE_H

#include "storage.h"

typedef struct fixture {
  char dir[256];
  char path[320];
  store *s;
} fixture;

/* cmocka setup and teardown: *state is the fixture. */
int fixture_setup(void **state);
int fixture_teardown(void **state);

#endif
