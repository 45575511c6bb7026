// SPDX-License-Identifier: Apache-2.0
// What the parts of the conformance program share: the status printer and the row printer.
#pragma once

#include <cuda.h>

// The enumerator's name of a driver status ("CUDA_ERROR_INVALID_VALUE").
const char *en(CUresult r);
// One output line, flushed at once (the comparison reads the lines in order).
void row(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The stream-capture rows C1-C17 (conformance_capture.cpp), on the context current here.
void capture_rows(CUcontext ctx);
