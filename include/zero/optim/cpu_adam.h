// The CPU optimizer interface of optim/ in one include (what the engine uses):
// CPU Adam/AdamW, Adagrad and Lion, the thread pool, precision conversion and SIMD
// target selection. Each concept has its own header beside this one.
#pragma once

#include "zero/optim/adagrad.h"
#include "zero/optim/adam.h"
#include "zero/optim/convert.h"
#include "zero/optim/lion.h"
#include "zero/optim/simd_target.h"
#include "zero/optim/thread_pool.h"
