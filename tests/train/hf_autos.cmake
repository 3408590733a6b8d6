# zero-train on the Hugging Face Trainer's ZeRO-3 config (transformers'
# docs, ds_config_zero3.json: the batch, the schedule's length and warm-up,
# the rates all "auto"): it trains, filling the batch from its default
# micro-batch and the decay's end and warm-up from --steps and --warmup, as
# the Trainer fills them from its arguments; without --warmup, from its
# default, said so; --warmup is not called ignored where it filled an "auto".
#   cmake -DTRAIN=<zero-train> -DCORPUS=<file> -DOUT=<dir> -DCONFIG=<json> -P hf_autos.cmake
function(run)
  execute_process(COMMAND ${TRAIN} ${CORPUS} --config ${CONFIG} --seq-len 32 --eval-every 0 --device cpu
                          --out ${OUT} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "zero-train ${ARGN}: exit status ${rc}:\n${err}")
  endif()
  set(err "${err}" PARENT_SCOPE)
endfunction()
function(expect pattern)
  if(NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "expected '${pattern}':\n${err}")
  endif()
endfunction()

run(--steps 6 --warmup 2)
expect("\"auto\" values, filled as the Hugging Face Trainer fills them: train_micro_batch_size_per_gpu = 16 \\(zero-train's default micro-batch\\), gradient_accumulation_steps = 1 \\(zero-train's default\\), scheduler.params.total_num_steps = 6 \\(--steps\\), scheduler.params.warmup_num_steps = 2 \\(--warmup\\)")
expect("batch: train_batch_size=16 = micro_batch 16 x accumulation 1")
expect("lr: log warm-up from 0 to 0.001 over 2 steps, then linear decay to 0 at step 6 \\(the config's scheduler\\)")
expect("stage 3")
expect("step 6/6")
if(err MATCHES "--warmup is ignored")
  message(FATAL_ERROR "--warmup filled the config's \"auto\" warm-up, yet was called ignored:\n${err}")
endif()

run(--steps 20)
expect("scheduler.params.warmup_num_steps = 2 \\(--warmup's default, max\\(1, steps/10\\)\\)")
expect("then linear decay to 0 at step 20")

# A train_batch_size given as a number: the "auto" micro-batch is derived
# from it (filling 16 would contradict it).
file(MAKE_DIRECTORY ${OUT})
file(WRITE ${OUT}/global_batch.json
     "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": \"auto\"}")
set(CONFIG ${OUT}/global_batch.json)
run(--steps 2)
expect("batch: train_batch_size=8 = micro_batch 8 x accumulation 1")
if(err MATCHES "filled as the Hugging Face Trainer")
  message(FATAL_ERROR "nothing to fill where train_batch_size is a number:\n${err}")
endif()
