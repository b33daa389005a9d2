#!/usr/bin/env bash
# The GPU gate in one device call, the test files split over nine parallel pytest processes (the GPU is mostly idle:
# the tests are launch- and compile-bound), every log under $OUT.
#
#   bash benchmarks/gpu_gate.sh tests [PART]    the GPU test suite; PART 1 to 4 runs some of its processes, for a
#                                               machine that gives one command less time than the whole suite takes
#                                               (e.g. 10 minutes): 1 the bitwise grid and compile (270 s on one H200,
#                                               2026-12-03, Triton's cache warm); 2 bindings with parity (148 s
#                                               there), and ops; 3 the fold tests, and the deterministic-mode timing
#                                               test alone (it held a shared process past a 340 s limit); 4 the other
#                                               module tests, and the rest
#   bash benchmarks/gpu_gate.sh bench    ordered-ssd bench --breakdown
#   bash benchmarks/gpu_gate.sh check    ordered-ssd check --native
#
# It needs the GPU install of the README ("Install", "GPU": a CUDA build of torch, mamba-ssm and causal-conv1d
# built without build isolation, then `pip install -e ".[cuda,bench]"`) plus pytest. On the project's own GPU
# machine that environment is `.gpu/`, prepared by `../shared/gpu/prepare.sh` (neither is part of this repository):
# `source .gpu/setup.sh && bash benchmarks/gpu_gate.sh tests`, with `.gpu` carried to the machine.
#
# On a machine with several GPUs, `tests` spreads its processes over them round-robin (CUDA_VISIBLE_DEVICES, one GPU
# per process; env GATE_GPUS, default: the number `nvidia-smi -L` lists, or 1 where CUDA_VISIBLE_DEVICES is set), so an
# x2 or x4 machine can run every part in one call (not yet timed); no test needs more than one GPU.
# Each step has a time limit (seconds; env T_TESTS, T_BENCH, T_CHECK) below a 600 s limit per command; at the
# limit a step gets SIGINT (SIGKILL 15 s later), so pytest still prints its failures, summary line and slowest tests.
# Exit status: 0 only if every process of the step exited 0 and no test was skipped; the last lines of each log
# are printed.
set -u
OUT=${OUT:-./gpu-gate-out}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ordered-ssd-gate-triton}
PYTEST=(python -m pytest -v -rfEs -p no:cacheprovider --durations=10)
status=0

job() {  # job NAME LIMIT CMD...: run CMD with a time limit, log to $OUT/NAME.log, append its exit status
  local name=$1 limit=$2; shift 2
  timeout -s INT -k 15 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "rc=$?" >> "$OUT/$name.log"
}

case "${1:-tests}" in
  tests)
    t=${T_TESTS:-540}
    part=${2:-all}
    case "$part" in all|1|2|3|4) ;; *) echo "usage: gpu_gate.sh tests [1|2|3|4]" >&2; exit 2 ;; esac
    in_part() { [ "$part" = all ] || [ "$part" = "$1" ]; }
    gpus=${GATE_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
    [ -n "${CUDA_VISIBLE_DEVICES+set}" ] && [ -z "${GATE_GPUS:-}" ] && gpus=1  # the caller chose the GPUs
    [ "${gpus:-0}" -ge 1 ] 2>/dev/null || gpus=1
    logs="" n=0
    start() {  # start PART NAME LIMIT CMD...: job NAME in the background if PART is run, on GPU n mod gpus
      in_part "$1" || return 0
      logs="$logs $2"
      if [ "$gpus" -gt 1 ]; then
        CUDA_VISIBLE_DEVICES=$(( n % gpus )) job "${@:2}" &
      else
        job "${@:2}" &
      fi
      n=$(( n + 1 ))
    }
    # Nine processes: the first step of every new key times all candidates of the native-autotune-v1 kernels
    # (tens of seconds per key and process), so the bitwise grid is split in two by chunk size.
    grid=tests/gpu/modules/test_mamba2_cuda.py
    timing=tests/gpu/csrc_bindings/test_native_timing.py
    start 1 gpu-grid-a "$t" "${PYTEST[@]}" $grid -k "test_cuda_path_bitwise_repeatable and cs64"
    start 1 gpu-grid-b "$t" "${PYTEST[@]}" $grid -k "test_cuda_path_bitwise_repeatable and not cs64"
    start 1 gpu-compile "$t" "${PYTEST[@]}" tests/gpu/modules/test_compile.py
    start 2 gpu-bindings "$t" "${PYTEST[@]}" tests/gpu/csrc_bindings/test_bindings.py \
      tests/gpu/modules/test_parity_with_mamba2.py
    start 2 gpu-ops "$t" "${PYTEST[@]}" tests/gpu/ops
    start 3 gpu-fold "$t" "${PYTEST[@]}" tests/gpu/fold
    start 3 gpu-timing "$t" "${PYTEST[@]}" $timing
    start 4 gpu-modules "$t" "${PYTEST[@]}" tests/gpu/modules \
      --ignore=tests/gpu/modules/test_parity_with_mamba2.py --ignore=tests/gpu/modules/test_compile.py \
      -k "not test_cuda_path_bitwise_repeatable"
    start 4 gpu-rest "$t" "${PYTEST[@]}" tests/gpu --ignore=tests/gpu/modules --ignore=tests/gpu/ops \
      --ignore=tests/gpu/fold --ignore=tests/gpu/csrc_bindings/test_bindings.py --ignore=$timing
    wait ;;
  bench)
    job bench "${T_BENCH:-560}" python -m ordered_ssd bench --breakdown --no-native-child \
      --time-budget $(( ${T_BENCH:-560} - 160 )) --out "$OUT/bench"
    logs="bench" ;;
  check)
    job check "${T_CHECK:-560}" python -m ordered_ssd check --native --quiet --out "$OUT/check"
    rm -rf "$OUT/check/runs"
    logs="check" ;;
  *)
    echo "usage: gpu_gate.sh tests [1|2|3|4] | bench | check" >&2; exit 2 ;;
esac
for name in $logs; do
  echo "== $name"; tail -n 4 "$OUT/$name.log"
  grep -q '^rc=0$' "$OUT/$name.log" || status=1
  if grep -qE '[0-9]+ skipped' "$OUT/$name.log"; then  # on the gate every GPU test must run
    echo "gpu_gate: $name skipped tests (no CUDA or no native extras?): not a pass"; status=1
  fi
done
exit $status
