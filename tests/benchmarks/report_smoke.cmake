# benchmarks/report --quick on an existing build: BENCHMARKS.md and every plot must exist, each
# plot a PNG (by its magic bytes) that BENCHMARKS.md links to.
# Run by CTest: cmake -DREPORT=... -DBUILD_DIR=... -DOUT=dir -P report_smoke.cmake
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND ${REPORT} --quick --no-build --build-dir ${BUILD_DIR} --out ${OUT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "benchmarks/report --quick exited with ${rc}\n${out}\n${err}")
endif()
if(NOT EXISTS "${OUT}/BENCHMARKS.md")
  message(FATAL_ERROR "benchmarks/report wrote no ${OUT}/BENCHMARKS.md\n${out}")
endif()
file(READ "${OUT}/BENCHMARKS.md" markdown)
foreach(plot busbw_all_gather busbw_reduce_scatter busbw_all_reduce busbw_broadcast
             adamw_bandwidth memory_fp32 memory_bf16 step_time)
  set(png "${OUT}/${plot}.png")
  if(NOT EXISTS "${png}")
    message(FATAL_ERROR "missing plot ${png}")
  endif()
  file(READ "${png}" magic LIMIT 8 HEX)
  if(NOT magic STREQUAL "89504e470d0a1a0a")
    message(FATAL_ERROR "${png} is not a PNG (starts with ${magic})")
  endif()
  string(FIND "${markdown}" "(${plot}.png)" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "BENCHMARKS.md does not show ${plot}.png")
  endif()
endforeach()
foreach(section "## Targets" "## Limits of this machine" "## Training step per ZeRO stage"
                "## Fused AdamW" "## Collectives" "## Model-state memory"
                "### Overlap with overlap_comm on and off" "## Overlap under an injected delay"
                "## Activation checkpointing" "## NVMe optimizer offload against the disk"
                "## Pipeline schedules" "## GPT-2 through the pipeline against data parallelism"
                "## LibTorch models through the adapter" "## Several nodes"
                "## Shared memory against MPI alone in the step")
  string(FIND "${markdown}" "${section}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "BENCHMARKS.md has no section '${section}'")
  endif()
endforeach()
