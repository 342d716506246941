/* teacher.h — a small data set for the replica tests (mirrored on CPUs
 * and on GPUs): n examples of TEACHER_INPUTS uniform values in [-1, 1),
 * labelled with the argmax of a fixed random linear teacher over
 * TEACHER_OUTPUTS classes; the same examples on every run. */
#ifndef KILN_TESTS_TEACHER_H
#define KILN_TESTS_TEACHER_H

#include <stdint.h>

#include "engine.h"

#define TEACHER_INPUTS  20
#define TEACHER_OUTPUTS 4

kn_dataset teacher_data(int64_t n);

#endif
