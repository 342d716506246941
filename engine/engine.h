/* engine.h — kiln's training engine: a static computation graph with
 * reverse-mode autodiff into the same graph, a liveness-based memory plan in
 * one arena, flat parameter / gradient buffers, CPU kernels (a GEMM of its
 * own on AVX-512, OpenBLAS elsewhere), optimizers, Keras-style model
 * building, IDX datasets, safetensors checkpoints and the training loop. Knows nothing of HTTP,
 * JSON or SQLite. Prefix kn_. Every call that can fail returns 0 or a negative KN_E* code and fills
 * a caller's error buffer with a sentence. */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

/* One header a concern, each self-contained: */
#include "engine_graph.h" /* codes, dtypes, devices, graph and ops, compile and run, rng, profiler */
#include "engine_model.h" /* optimizers, models, checkpoints */
#include "engine_data.h"  /* data sets and the input pipeline */
#include "engine_dist.h"  /* distribution strategies */
#include "engine_train.h" /* the training loop */

#endif
