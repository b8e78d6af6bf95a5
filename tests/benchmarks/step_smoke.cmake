# zero-bench-step at a tiny size on 2 ranks: its JSON must hold one record per stage 0-3 with the
# keys the report reads, sane values, and model-state bytes equal to what the engine planned.
# Also: a bad flag exits 2, and --memory-table writes one record per stage and world size.
# Run by CTest: cmake -DZERORUN=... -DBENCH=... -DOUT=dir -P step_smoke.cmake
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")

function(run_checked)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "'${ARGN}' exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  message("${out}")
endfunction()

function(json_get out_var json)
  string(JSON value ERROR_VARIABLE error GET "${json}" ${ARGN})
  if(error)
    message(FATAL_ERROR "JSON lookup ${ARGN} failed: ${error}")
  endif()
  set(${out_var} "${value}" PARENT_SCOPE)
endfunction()

# A bad flag is a usage error (exit 2), found before MPI starts.
execute_process(COMMAND ${BENCH} --steps 0 RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "zero-bench-step --steps 0 exited with '${rc}', expected 2:\n${err}")
endif()
# So is a ZeRO++ setting the flag does not know, named in the message.
execute_process(COMMAND ${BENCH} --zeropp qwz+qgw RESULT_VARIABLE rc OUTPUT_QUIET
                ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "unknown ZeRO\\+\\+ setting 'qgw' in 'qwz\\+qgw'")
  message(FATAL_ERROR "zero-bench-step --zeropp qwz+qgw exited with '${rc}', expected 2 naming "
                      "qgw:\n${err}")
endif()

set(model --input-dim 8 --hidden 32 --output-dim 4 --layers 3)
run_checked(${ZERORUN} -np 2 -- ${BENCH} ${model} --global-batch 8 --steps 2 --warmup 1
            --rounds 1 --json ${OUT}/step.json)
file(READ "${OUT}/step.json" json)
string(JSON count LENGTH "${json}")
if(NOT count EQUAL 4)
  message(FATAL_ERROR "expected 4 stage records, got ${count}:\n${json}")
endif()
foreach(i RANGE 3)
  json_get(stage "${json}" ${i} stage)
  json_get(world "${json}" ${i} world_size)
  json_get(dtype "${json}" ${i} dtype)
  json_get(step_ms "${json}" ${i} median_step_ms)
  json_get(comm_ms "${json}" ${i} comm_ms)
  json_get(overlap "${json}" ${i} overlap_fraction)
  json_get(exposed "${json}" ${i} exposed_comm_ms)
  json_get(collectives "${json}" ${i} collectives_per_step)
  json_get(overlap_comm "${json}" ${i} overlap_comm)
  json_get(state "${json}" ${i} model_state_bytes)
  json_get(plan "${json}" ${i} plan_model_state_bytes)
  json_get(peak "${json}" ${i} peak_bytes)
  json_get(ratio "${json}" ${i} ratio_to_stage0)
  json_get(params "${json}" ${i} params)
  if(NOT stage EQUAL i OR NOT world EQUAL 2 OR NOT dtype STREQUAL "fp32")
    message(FATAL_ERROR "record ${i}: stage ${stage}, world_size ${world}, dtype ${dtype}")
  endif()
  if(NOT step_ms GREATER 0 OR NOT comm_ms GREATER 0 OR NOT ratio GREATER 0)
    message(FATAL_ERROR "record ${i}: step ${step_ms} ms, comm ${comm_ms} ms, ratio ${ratio}")
  endif()
  if(overlap LESS 0 OR overlap GREATER 1)
    message(FATAL_ERROR "record ${i}: overlap_fraction ${overlap} is not a fraction")
  endif()
  # The engine's StepStats: every stage issues collectives every step, and waits are durations.
  if(NOT collectives GREATER 0 OR exposed LESS 0 OR NOT overlap_comm STREQUAL "ON")
    message(FATAL_ERROR "record ${i}: ${collectives} collectives per step, exposed ${exposed} ms, "
                        "overlap_comm ${overlap_comm}")
  endif()
  if(NOT state EQUAL plan OR peak LESS state)
    message(FATAL_ERROR "record ${i}: model state ${state} B, planned ${plan} B, peak ${peak} B")
  endif()
endforeach()
json_get(ratio0 "${json}" 0 ratio_to_stage0)
if(NOT ratio0 EQUAL 1)
  message(FATAL_ERROR "stage 0's ratio to itself is ${ratio0}")
endif()

# The memory table needs no MPI: 2 dtypes x 4 stages x 3 world sizes.
run_checked(${BENCH} --memory-table --max-ranks 3 --dtype fp32,bf16 ${model}
            --json ${OUT}/memory.json)
file(READ "${OUT}/memory.json" table)
string(JSON rows LENGTH "${table}")
if(NOT rows EQUAL 24)
  message(FATAL_ERROR "expected 24 memory-table records, got ${rows}")
endif()
# Stage 3 at 1 rank holds everything: the plan is the formula (16 bytes per parameter).
json_get(formula "${table}" 9 formula_bytes)
json_get(planned "${table}" 9 plan_model_state_bytes)
json_get(row_stage "${table}" 9 stage)
json_get(row_ranks "${table}" 9 world_size)
math(EXPR sixteen_psi "16 * ${params}")
if(NOT row_stage EQUAL 3 OR NOT row_ranks EQUAL 1 OR NOT formula EQUAL sixteen_psi)
  message(FATAL_ERROR "memory record 9: stage ${row_stage}, ${row_ranks} rank(s), formula "
                      "${formula} B, expected stage 3, 1 rank, ${sixteen_psi} B")
endif()
if(planned LESS formula)
  message(FATAL_ERROR "plan ${planned} B is below the formula ${formula} B")
endif()

# --mics-shard-size: stage 3 twice, over both ranks and over groups of 1 (replicated), in the
# same rounds; the hybrid engine keeps what its plan says, about twice the sharded state (16 Psi
# / k, each padded its own way), and a stage list without 3 is a usage error.
run_checked(${ZERORUN} -np 2 -- ${BENCH} ${model} --global-batch 8 --steps 2 --warmup 1
            --rounds 1 --stages 3 --mics-shard-size 1 --json ${OUT}/mics.json)
file(READ "${OUT}/mics.json" mics)
string(JSON count LENGTH "${mics}")
if(NOT count EQUAL 2)
  message(FATAL_ERROR "expected 2 stage-3 records, got ${count}:\n${mics}")
endif()
string(JSON sharded_kind TYPE "${mics}" 0 mics_shard_size)
json_get(hybrid_k "${mics}" 1 mics_shard_size)
json_get(sharded_state "${mics}" 0 model_state_bytes)
json_get(hybrid_state "${mics}" 1 model_state_bytes)
json_get(hybrid_plan "${mics}" 1 plan_model_state_bytes)
math(EXPR most "2 * ${sharded_state}")
math(EXPR least "19 * ${sharded_state} / 10")
if(NOT sharded_kind STREQUAL "NULL" OR NOT hybrid_k EQUAL 1 OR NOT hybrid_state EQUAL hybrid_plan
   OR hybrid_state LESS least OR hybrid_state GREATER most)
  message(FATAL_ERROR "mics records: ${sharded_kind}/${hybrid_k}, state ${sharded_state} B and "
                      "${hybrid_state} B (planned ${hybrid_plan} B; expected about twice)")
endif()
execute_process(COMMAND ${BENCH} --stages 0,1 --mics-shard-size 2 RESULT_VARIABLE rc
                OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "stage 3")
  message(FATAL_ERROR "--mics-shard-size without stage 3 exited with '${rc}', expected 2:\n${err}")
endif()
