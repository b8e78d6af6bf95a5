# zero-bench-offload at two tiny sizes: its JSON must hold one record per size with the keys the
# issue names, the optimizer pass must have read and written the whole state file once each
# (moved_bytes = 2 x bytes, as the engine's StepStats counted it), and both speeds must be
# positive, the disk's busy time within the pass's. A bad flag exits 2. Never how fast anything is.
# Run by CTest: cmake -DZERORUN=... -DBENCH=... -DOUT=dir -P offload_smoke.cmake
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")

execute_process(COMMAND ${BENCH} --block-size 1000 RESULT_VARIABLE rc OUTPUT_QUIET
                ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "multiple of 4096")
  message(FATAL_ERROR "zero-bench-offload --block-size 1000 exited with '${rc}', expected 2:\n${err}")
endif()

execute_process(COMMAND ${ZERORUN} -np 1 -- ${BENCH} --path ${OUT}/nvme --sizes 1M,3M
                        --sub-group-size 256K --reps 1 --block-size 64K --json ${OUT}/offload.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "zero-bench-offload exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
message("${out}")
file(READ "${OUT}/offload.json" json)
string(JSON count LENGTH "${json}")
if(NOT count EQUAL 2)
  message(FATAL_ERROR "expected 2 records, got ${count}:\n${json}")
endif()
foreach(i RANGE 1)
  foreach(key params bytes moved_bytes ours_GBps raw_GBps ours_ms nvme_wait_ms nvme_busy_ms
              optimizer_over_busy raw_ms raw_ring_GBps raw_ring_ms raw_memory_bytes)
    string(JSON ${key} ERROR_VARIABLE error GET "${json}" ${i} ${key})
    if(error)
      message(FATAL_ERROR "record ${i} has no ${key}: ${error}\n${json}")
    endif()
  endforeach()
  math(EXPR twice "2 * ${bytes}")
  if(NOT moved_bytes EQUAL twice)
    message(FATAL_ERROR "record ${i}: the pass moved ${moved_bytes} bytes, not 2 x ${bytes}")
  endif()
  # bf16 state: fp32 master, m and v, 12 bytes per parameter (each record padded to 4 KiB).
  math(EXPR least "12 * ${params}")
  if(bytes LESS least)
    message(FATAL_ERROR "record ${i}: ${bytes} state bytes for ${params} bf16 parameters")
  endif()
  if(NOT ours_GBps GREATER 0 OR NOT raw_GBps GREATER 0 OR NOT raw_ring_GBps GREATER 0 OR
     nvme_wait_ms GREATER ours_ms OR NOT nvme_busy_ms GREATER 0 OR nvme_busy_ms GREATER ours_ms OR
     optimizer_over_busy LESS 1)
    message(FATAL_ERROR "record ${i}: ours ${ours_GBps} GB/s, raw ${raw_GBps} GB/s, "
                        "wait ${nvme_wait_ms} and busy ${nvme_busy_ms} of ${ours_ms} ms, "
                        "ours / busy ${optimizer_over_busy}")
  endif()
endforeach()
file(GLOB left "${OUT}/nvme/*")
if(left)
  message(FATAL_ERROR "state files left behind: ${left}")
endif()
