# zero-train on a DeepSpeed config with "type": "Muon": the GPT's block
# matrices take Muon (8 of gpt2-tiny's), its token and position tables,
# biases and LayerNorm gains the Adam half, each at its share of the rate
# (muon_lr 0.02 / lr 0.003); the loss falls; zero-ckpt inspect counts the
# halves of its checkpoint.
#   cmake -DTRAIN=<zero-train> -DCKPT=<zero-ckpt> -DCORPUS=<file> -DOUT=<dir> -DCONFIG=<json> -P muon.cmake
file(REMOVE_RECURSE ${OUT})
execute_process(COMMAND ${TRAIN} ${CORPUS} --config ${CONFIG} --steps 40 --seq-len 32 --eval-every 0 --device cpu
                        --out ${OUT} --save-every 40 --save-dir ${OUT}/ckpt
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "zero-train: exit status ${rc}:\n${err}")
endif()
foreach(pattern "Muon on 8 matrices \\([0-9.]+K elements\\) at lr x 6.67, Adam on 20 parameters \\([0-9.]+K elements\\) at lr x 1"
                "optimizer Muon, offload cpu" "step 40/40")
  if(NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "expected '${pattern}':\n${err}")
  endif()
endforeach()
string(REGEX MATCH "step 10/40 loss ([0-9.]+)" _ "${err}")
set(first ${CMAKE_MATCH_1})
string(REGEX MATCH "step 40/40 loss ([0-9.]+)" _ "${err}")
set(last ${CMAKE_MATCH_1})
if(NOT last LESS first)
  message(FATAL_ERROR "the loss did not fall (step 10: ${first}, step 40: ${last}):\n${err}")
endif()
execute_process(COMMAND ${CKPT} inspect ${OUT}/ckpt RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "Muon: 8 matrices, Adam half: 20 parameters")
  message(FATAL_ERROR "zero-ckpt inspect (exit status ${rc}) did not count Muon's halves:\n${out}${err}")
endif()
