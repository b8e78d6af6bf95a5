# zero-bench-gpt2 at a tiny size on 2 ranks: its JSON must hold one record per stage 0-3 with the
# keys the report reads and sane values (tokens/s, MFU, a ratio to stage 0); a bad flag exits 2.
# Run by CTest: cmake -DZERORUN=... -DBENCH=... -DOUT=dir -P gpt2_smoke.cmake
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")

execute_process(COMMAND ${BENCH} --n-head 5 RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "zero-bench-gpt2 --n-head 5 (384 wide) exited with '${rc}', expected 2:\n"
                      "${err}")
endif()

execute_process(
  COMMAND ${ZERORUN} -np 2 -- ${BENCH} --n-layer 2 --n-embd 32 --n-head 2 --vocab-size 100
          --seq-len 16 --global-batch 4 --steps 1 --rounds 1 --warmup 1 --peak-size 128
          --json ${OUT}/gpt2.json
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "zero-bench-gpt2 exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
message("${out}")

file(READ "${OUT}/gpt2.json" json)
string(JSON count LENGTH "${json}")
if(NOT count EQUAL 4)
  message(FATAL_ERROR "expected 4 stage records, got ${count}:\n${json}")
endif()
foreach(i RANGE 3)
  foreach(key stage world_size tokens_per_s mfu sgemm_peak_gflops ratio_to_stage0 flops_per_token
              final_loss blas_core)
    string(JSON ${key} ERROR_VARIABLE error GET "${json}" ${i} ${key})
    if(error)
      message(FATAL_ERROR "record ${i}: ${error}")
    endif()
  endforeach()
  if(NOT stage EQUAL i OR NOT world_size EQUAL 2)
    message(FATAL_ERROR "record ${i}: stage ${stage}, world_size ${world_size}")
  endif()
  if(NOT tokens_per_s GREATER 0 OR NOT sgemm_peak_gflops GREATER 0 OR NOT mfu GREATER 0
     OR NOT ratio_to_stage0 GREATER 0)
    message(FATAL_ERROR "record ${i}: ${tokens_per_s} tokens/s, peak ${sgemm_peak_gflops}, "
                        "MFU ${mfu}, ratio ${ratio_to_stage0}")
  endif()
  # Random tokens over a vocabulary of 100: the loss starts near ln(100) = 4.6.
  if(final_loss LESS 3 OR final_loss GREATER 6)
    message(FATAL_ERROR "record ${i}: loss ${final_loss}, expected about ln(100) = 4.6")
  endif()
endforeach()
